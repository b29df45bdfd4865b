"""Review finished or running runs: a table, JSON, a plot with attempt boundaries, or a live TensorBoard.

    python -m hpc_agent.review RUN_DIR|RUNS_ROOT [--json] [--plot OUT.png] [--serve [--port N]]

Login-node code: no torch. TensorBoard, matplotlib and rich are imported inside the functions using them.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.metrics.tb_reader import RunScalars, file_order_key
from hpc_agent.review_plot import boundary_labels, plot_runs

EXIT_OK, EXIT_USAGE = 0, 2
LOSS, LR, STEP_TIME, SAMPLES = "train/loss", "train/lr", "perf/step_time_s", "perf/samples_per_s"
PLOT_TAGS = (LOSS, LR, SAMPLES)
LEDGER_FILE = "ledger.sqlite"
LIVE_PHASES = {"submitting", "pending", "running", "recovering"}

_ATTEMPT = re.compile(r"\.attempt(\d+)$")


def attempt_of(file_name: str) -> Optional[int]:
    match = _ATTEMPT.search(file_name)
    return int(match.group(1)) if match else None


class Scalars:
    """The run's TensorBoard scalars through the incremental reader; an absent ``tb/`` reads as empty."""

    def __init__(self, tb_dir: Path):
        self._rs = RunScalars(tb_dir) if tb_dir.is_dir() else None
        if self._rs is not None:
            self._rs.update()

    def tags(self) -> List[str]:
        return sorted(self._rs.tags()) if self._rs is not None else []

    def raw(self, tag: str) -> List[Tuple[str, Any]]:
        return list(self._rs.raw(tag)) if self._rs is not None else []

    def series(self, tag: str) -> List[Any]:
        return list(self._rs.series(tag)) if self._rs is not None else []


# --- run discovery ----------------------------------------------------------------------------------------
def _is_run_dir(path: Path) -> bool:
    return any((path / name).exists() for name in ("config.yaml", "run.json", "tb", "events.jsonl"))


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def read_events(run_dir: Path) -> List[Dict[str, Any]]:
    out = []
    path = run_dir / "events.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a torn last line while the watcher writes
    return out


def _ledger(runs_root: Path):
    if not (runs_root / LEDGER_FILE).exists():
        return None
    from hpc_agent.ledger import Ledger
    return Ledger.in_runs_root(runs_root)


def find_runs(path: Path) -> Tuple[Path, List[Path]]:
    """``(runs_root, run_dirs)`` for a run directory or a runs root."""
    if _is_run_dir(path) and not (path / LEDGER_FILE).exists():
        return path.parent, [path]
    dirs = {p.resolve() for p in path.iterdir() if p.is_dir() and _is_run_dir(p)}
    ledger = _ledger(path)
    if ledger is not None:
        try:
            dirs |= {Path(r.run_dir).resolve() for r in ledger.runs() if Path(r.run_dir).is_dir()}
        finally:
            ledger.close()
    return path, sorted(dirs)


def _iso_to_ts(text: Any) -> Optional[float]:
    try:
        return _dt.datetime.fromisoformat(str(text)).timestamp()
    except ValueError:
        return None


# --- one run ----------------------------------------------------------------------------------------------
def review_run(run_dir: Path, runs_root: Optional[Path] = None, now: Optional[float] = None) -> Dict[str, Any]:
    """Everything the table, the JSON and the plot show for one run."""
    run_dir = Path(run_dir)
    runs_root = Path(runs_root) if runs_root else run_dir.parent
    info = _read_json(run_dir / "run.json")
    run_id = info.get("run_id") or run_dir.name
    events = read_events(run_dir)
    phase, created_at, submissions, decision_causes = None, None, [], []
    ledger = _ledger(runs_root)
    if ledger is not None:
        try:
            row = ledger.run(run_id) or next((r for r in ledger.runs() if Path(r.run_dir).resolve()
                                              == run_dir.resolve()), None)
            if row is not None:
                run_id, phase, created_at = row.run_id, row.phase, row.created_at
                submissions = ledger.submissions(run_id)
                decision_causes = [d.cause for d in ledger.decisions(run_id)]
        finally:
            ledger.close()
    if phase is None:
        phase = "completed" if any(e.get("cause") == "completed" for e in events) else "unknown"
    max_steps = None
    if (run_dir / "config.yaml").exists():
        try:
            from hpc_agent.config.load import load_snapshot
            max_steps = load_snapshot(run_dir / "config.yaml").train.max_steps
        except Exception:  # a broken snapshot should not hide the rest of the review
            max_steps = None

    scalars = Scalars(run_dir / "tb")
    loss = scalars.series(LOSS)
    step_tag = STEP_TIME if scalars.raw(STEP_TIME) else LOSS
    raw_steps = scalars.raw(step_tag)
    winning_steps = scalars.series(step_tag)
    steps_lost = len(raw_steps) - len(winning_steps)  # points a later attempt overwrote
    productive = sum(p.value for p in scalars.series(STEP_TIME))
    kept = {(p.step, p.wall_time) for p in loss}
    lost_loss = [p for _, p in scalars.raw(LOSS) if (p.step, p.wall_time) not in kept]

    # attempts as the event files show them: first step and wall time of each file
    per_file: Dict[str, List[Any]] = {}
    for tag in scalars.tags():
        for name, point in scalars.raw(tag):
            per_file.setdefault(name, []).append(point)
    files = sorted(per_file, key=file_order_key)
    starts: Dict[int, Tuple[int, float]] = {}
    for index, name in enumerate(files):
        attempt = attempt_of(name) if attempt_of(name) is not None else index
        first = min(per_file[name], key=lambda p: (p.wall_time, p.step))
        starts[attempt] = (min(p.step for p in per_file[name]), first.wall_time)

    boundaries = boundary_labels(events)
    for b in boundaries:
        step, wall = starts.get(b["attempt"], (None, None))
        b["step"] = step
        b["wall_time"] = wall if wall is not None else _iso_to_ts(b.pop("time", None))
        b.pop("time", None)

    all_walls = [p.wall_time for tag in scalars.tags() for _, p in scalars.raw(tag)]
    event_attempts = [e["attempt"] for e in events if isinstance(e.get("attempt"), int)]
    attempts = max([len(submissions), len(info.get("job_ids", [])), len(starts), len(boundaries) + 1 if events else 0,
                    max(event_attempts) + 1 if event_attempts else 0])
    start = (created_at or (submissions[0].intent_at if submissions else None)
             or _iso_to_ts(info.get("submitted_at")) or (min(all_walls) if all_walls else None))
    now = time.time() if now is None else now
    end = now if phase in LIVE_PHASES else (max(all_walls) if all_walls else None)
    ettr = None
    if start is not None and end is not None and end > start:
        ettr = round(min(1.0, productive / (end - start)), 4)
    samples = [p.value for p in scalars.series(SAMPLES)]
    causes = sorted({str(e["cause"]) for e in events if e.get("cause")} | set(decision_causes))
    return {
        "run_id": run_id, "run_dir": str(run_dir), "phase": phase, "attempts": attempts, "causes": causes,
        "step": loss[-1].step if loss else None, "max_steps": max_steps,
        "steps": {"first": loss[0].step if loss else None, "last": loss[-1].step if loss else None,
                  "count": len(loss), "duplicates": len(loss) - len({p.step for p in loss})},
        "last_loss": loss[-1].value if loss else None,
        "throughput": round(statistics.median(samples), 3) if samples else None,
        "productive_s": round(productive, 3), "wall_s": round(end - start, 3) if ettr is not None else None,
        "ettr": ettr, "steps_lost": steps_lost, "boundaries": boundaries,
        "_curves": {**{tag: [(p.step, p.wall_time, p.value) for p in scalars.series(tag)] for tag in PLOT_TAGS},
                    "lost_loss": [(p.step, p.wall_time, p.value) for p in lost_loss]},
    }


def public(run: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in run.items() if not k.startswith("_")}


def render_table(runs: Sequence[Dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="runs")
    for col in ("run", "phase", "attempts", "causes", "step", "last loss", "samples/s", "ETTR", "steps lost"):
        table.add_column(col, overflow="fold")
    for r in runs:
        step = f"{r['step'] if r['step'] is not None else '-'} / {r['max_steps'] or '?'}"
        table.add_row(r["run_id"], r["phase"], str(r["attempts"]), ", ".join(r["causes"]) or "-", step,
                      f"{r['last_loss']:.4f}" if r["last_loss"] is not None else "-",
                      f"{r['throughput']:.1f}" if r["throughput"] is not None else "-",
                      f"{r['ettr']:.2f}" if r["ettr"] is not None else "-", str(r["steps_lost"]))
    Console(width=160).print(table)


# --- TensorBoard ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_tensorboard(logdir: Path, port: Optional[int] = None, timeout_s: float = 60.0
                      ) -> Tuple[subprocess.Popen, str]:
    """Start ``tensorboard`` on 127.0.0.1 and wait until its HTTP API answers; ``(process, url)``."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
                             "127.0.0.1", "--port", str(port), "--load_fast", "false", "--reload_interval", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"tensorboard exited with {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url + "data/plugin/scalars/tags", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"tensorboard did not answer at {url} within {timeout_s:.0f}s")


def serve(logdir: Path, port: Optional[int], seconds: Optional[float], stream=None) -> int:
    proc, url = start_tensorboard(logdir, port)
    print(f"TensorBoard for {logdir}: {url}  (Ctrl-C to stop)", file=stream or sys.stdout, flush=True)
    try:
        if seconds is not None:
            time.sleep(seconds)
        else:
            proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return EXIT_OK


# --- CLI --------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hpc_agent.review", description=__doc__.split("\n")[0])
    p.add_argument("path", help="a run directory, or a runs root (with ledger.sqlite) for all its runs")
    p.add_argument("--json", action="store_true", help='print {"runs": [...]} instead of the table')
    p.add_argument("--plot", metavar="OUT.png", help="save loss/LR/throughput plots with attempt boundaries")
    p.add_argument("--serve", action="store_true", help="run TensorBoard on the run's tb/ (or the root) until Ctrl-C")
    p.add_argument("--port", type=int, default=None, help="port for --serve (default: a free one)")
    p.add_argument("--serve-seconds", type=float, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    path = Path(args.path)
    if not path.is_dir():
        print(f"review: {path} is not a directory (give a run directory or a runs root)", file=sys.stderr)
        return EXIT_USAGE
    from hpc_agent.review_sweep import is_sweep_dir  # a sweep dir: its trials table and objective plot instead

    if is_sweep_dir(path):
        from hpc_agent.extras import MissingExtra
        from hpc_agent.review_sweep import review_sweep

        try:
            return review_sweep(path, args.json, args.plot)
        except MissingExtra as exc:
            print(f"review: {exc}", file=sys.stderr)
            return EXIT_USAGE
    runs_root, run_dirs = find_runs(path)
    if not run_dirs:
        print(f"review: no runs under {path} (no config.yaml, run.json, tb/ or events.jsonl)", file=sys.stderr)
        return EXIT_USAGE
    runs = [review_run(d, runs_root) for d in run_dirs]
    if args.json:
        print(json.dumps({"runs": [public(r) for r in runs]}, indent=2, default=str))
    else:
        render_table(runs)
    if args.plot:
        out = plot_runs(runs, Path(args.plot))
        if not args.json:
            print(f"plot: {out}")
    if args.serve:
        logdir = run_dirs[0] / "tb" if len(run_dirs) == 1 else runs_root
        return serve(logdir, args.port, args.serve_seconds, sys.stderr if args.json else sys.stdout)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
