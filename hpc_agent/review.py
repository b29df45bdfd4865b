"""Review finished or running runs: a table, JSON, a plot with attempt boundaries, or a live TensorBoard.

    python -m hpc_agent.review RUN_DIR|RUNS_ROOT [--json] [--plot OUT.png] [--serve [--port N] [--host H --token-file F]]
    python -m hpc_agent.review RUN_DIR|RUNS_ROOT --goodput [--json | --csv] [--plot OUT.png] [--sacct-file F]

Login-node code: no torch. TensorBoard, matplotlib and rich are imported inside the functions using them.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, add_read_cap_argument, parse
from hpc_agent.core import rundir
from hpc_agent.core.read_caps import cap_of
from hpc_agent.remote import ssh
from hpc_agent.runs.history import find_runs, problem_lines, review_runs
from hpc_agent.runs.liveness import describe
from hpc_agent.runs.plot import plot_runs

EXIT_OK, EXIT_USAGE = exit_status.OK, exit_status.USAGE


def public(run: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in run.items() if not k.startswith("_")}


def render_table(runs: Sequence[Dict[str, Any]], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="runs")
    for col in ("run", "phase", "attempts", "causes", "step", "last loss", "samples/s", "ETTR", "steps lost"):
        table.add_column(col, overflow="fold")
    for r in runs:
        step = f"{r['step'] if r['step'] is not None else '-'} / {r['max_steps'] or '?'}"
        live = describe(r.get("live"))  # a live run: how long since its last step, and a hang if it looks like one
        table.add_row(r["run_id"], f"{r['phase']}: {live}" if live else r["phase"], str(r["attempts"]),
                      ", ".join(r["causes"]) or "-", step,
                      f"{r['last_loss']:.4f}" if r["last_loss"] is not None else "-",
                      f"{r['throughput']:.1f}" if r["throughput"] is not None else "-",
                      f"{r['ettr']:.2f}" if r["ettr"] is not None else "-", str(r["steps_lost"]))
    console = console or Console(width=160)
    console.print(table)
    lines = decision_lines(runs)
    if lines:
        console.print("decisions (oldest first; (in job) = made by the job inside its allocation):", highlight=False)
        for line in lines:
            console.print(line, highlight=False, markup=False)


def decision_lines(runs: Sequence[Dict[str, Any]]) -> List[str]:
    """``  RUN attempt 2 (job 1002) at step 37: gpu_oom -> in_job_repair: ... (in job)``, one per decision."""
    out = []
    for r in runs:
        for d in r.get("decisions", []):
            where = " (in job)" if d.get("in_job") else ""
            reason = f": {d['reason']}" if d.get("reason") else ""
            attempt = f" attempt {d['attempt']}" if d.get("attempt") is not None else ""
            job = f" (job {d['job_id']})" if d.get("job_id") else ""
            step = f" at step {d['step']}" if d.get("step") is not None else ""
            line = f"  {r['run_id']}{attempt}{job}{step}: {d['cause']} -> {d['action']}{reason}{where}"
            # a job wrote the in-job reasons: no terminal escape sequence reaches the screen
            out.append("".join(c if c.isprintable() else "?" for c in line))
    return out


# --- TensorBoard ------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_tensorboard(logdir: Path, port: Optional[int] = None, timeout_s: float = 60.0
                      ) -> Tuple[subprocess.Popen, str]:
    """Start ``tensorboard`` on 127.0.0.1 (never elsewhere: it has no authentication; see review_serve) and
    wait until its HTTP API answers; ``(process, url)``. The caller owns the process and terminates it."""
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


def serve(logdir: Path, port: Optional[int], seconds: Optional[float], stream=None,
          host: str = "127.0.0.1", token: Optional[str] = None) -> int:
    """TensorBoard on 127.0.0.1; with a token, behind a token-checking proxy on ``host`` (review_serve)."""
    from hpc_agent.runs.serve import TokenProxy

    proxy = None
    proc, url = start_tensorboard(logdir, port if token is None else None)
    try:
        if token is not None:
            proxy = TokenProxy(host, port or 0, int(url.rsplit(":", 1)[1].strip("/")), token)
            url = f"http://{host}:{proxy.port}/?token=<your token>"
    except BaseException:
        proc.terminate()
        proc.wait(timeout=10)
        raise
    print(f"TensorBoard for {logdir}: {url}  (Ctrl-C to stop)", file=stream or sys.stdout, flush=True)
    try:
        if seconds is not None:
            time.sleep(seconds)
        else:
            proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if proxy is not None:
            proxy.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return EXIT_OK


# --- goodput ----------------------------------------------------------------------------------------------
def goodput_usage_problem(args: argparse.Namespace) -> Optional[str]:
    if (args.csv or args.sacct_file) and not args.goodput:
        return f"{'--csv' if args.csv else '--sacct-file'} goes with --goodput (review RUN --goodput --csv)"
    if args.goodput and args.json and args.csv:
        return "--goodput: give --json or --csv, not both"
    if args.goodput and args.serve:
        return "--goodput and --serve do not go together: run them as two commands"
    return None


def goodput_sacct(args: argparse.Namespace, job_ids: Sequence[str]) -> Tuple[Optional[str], Optional[str], int]:
    """``(sacct text, None, OK)`` from --sacct-file or one batched sacct call; ``(None, message, exit code)`` when
    neither can be had (USAGE: no sacct here, or a file that is no sacct output; FAILED: sacct did not answer)."""
    from hpc_agent.runs.goodput import GOODPUT_FIELDS

    if args.sacct_file:
        from hpc_agent.diagnose import UsageError, read_sacct_file

        try:
            return read_sacct_file(args.sacct_file), None, EXIT_OK
        except UsageError as exc:
            return None, str(exc), EXIT_USAGE
    if not job_ids:
        return "", None, EXIT_OK
    from hpc_agent.slurm.cli import SlurmCLI, SlurmError

    if not SlurmCLI.available():
        return None, ("--goodput needs sacct, and there is none here: run it on the login node, or save the jobs' "
                      "rows there and give them with --sacct-file F (sacct -D -P --format="
                      f"{','.join(GOODPUT_FIELDS)} -j {','.join(job_ids)})"), EXIT_USAGE
    try:
        return SlurmCLI().sacct(list(job_ids), fields=GOODPUT_FIELDS), None, EXIT_OK
    except SlurmError as exc:
        return None, f"sacct failed ({exc}); try again, or give a saved reply with --sacct-file F", exit_status.FAILED


def goodput_main(args: argparse.Namespace, runs: Sequence[Dict[str, Any]], bad: List[Dict[str, str]]) -> int:
    import csv

    from hpc_agent.runs.goodput import BUCKETS, summary_row, totals
    from hpc_agent.runs.history import goodput_job_ids, goodput_of
    from hpc_agent.slurm.sacct import SacctFormatError, group_attempts
    from hpc_agent.slurm.sacct_read import read_sacct

    text, problem, code = goodput_sacct(args, goodput_job_ids(runs))
    if problem:
        print(f"review: {problem}", file=sys.stderr)
        return code
    try:
        jobs = group_attempts(read_sacct(text).rows) if text and text.strip() else {}
    except SacctFormatError as exc:
        print(f"review: sacct's reply is not sacct output: {exc}", file=sys.stderr)
        return exit_status.FAILED
    results = []
    for r in runs:
        try:
            results.append(goodput_of(r, jobs))
        except Exception as exc:  # noqa: BLE001 - one run's files must not hide the others
            bad.append({"run_dir": r["run_dir"], "problem": f"goodput not computed: {type(exc).__name__}: "
                                                            f"{str(exc)[:300]}"})
    counted = [g for g in results if g["account"] is not None]
    total = totals([g["account"] for g in counted]) if counted else None
    rows = [g["row"] for g in counted]
    total_row = summary_row("total", total) if total else None
    if args.json:
        print(json.dumps({"runs": results, "total": total, "buckets": list(BUCKETS), "problems": bad},
                         indent=2, default=str))
    elif args.csv:
        writer = csv.DictWriter(sys.stdout, fieldnames=list(summary_row("", totals([])).keys()), lineterminator="\n")
        writer.writeheader()
        for row in rows + ([total_row] if total_row else []):
            writer.writerow(row)
    else:
        render_goodput(rows, total_row)
    for g in results:
        for line in ([g["problem"]] if g.get("problem") else []) + g["notes"] + ([g["devices_note"]] if
                                                                               g["devices_note"] and g["account"] else []):
            print("".join(c if c.isprintable() else "?" for c in f"review: {g['run_id']}: {line}"), file=sys.stderr)
    for line in problem_lines(bad):
        print(f"review: {line}", file=sys.stderr)
    if args.plot and rows:
        from hpc_agent.runs.plot import plot_goodput

        out = plot_goodput(rows, Path(args.plot))
        if not (args.json or args.csv):
            print(f"plot: {out}")
    return exit_status.FAILED if bad else EXIT_OK


def render_goodput(rows: Sequence[Dict[str, Any]], total: Optional[Dict[str, Any]], console=None) -> None:
    """Device-hours per bucket, one row per run and a total; a bucket that is zero for every run is left out."""
    from rich.console import Console
    from rich.table import Table

    from hpc_agent.runs.goodput import BUCKETS

    shown = [b for b in BUCKETS if b == "productive" or any(r[f"{b}_h"] for r in rows)]
    table = Table(title="goodput (device-hours; ETTR = productive / (queued while eligible + allocated))")
    for col in ["run", "allocated", "queued"] + [b.replace("_", " ") for b in shown] + ["ETTR"]:
        table.add_column(col, overflow="fold", justify="left" if col == "run" else "right")
    for r in list(rows) + ([total] if total else []):
        table.add_row(str(r["run"]), f"{r['allocated_h']:.3f}", f"{r['queued_h']:.3f}",
                      *[f"{r[f'{b}_h']:.3f}" for b in shown], f"{r['ettr']:.3f}" if r["ettr"] is not None else "-")
    (console or Console(width=200)).print(table)


# --- CLI --------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=invocation.prog("review"), description=__doc__.split("\n")[0])
    p.add_argument("path", help="a run directory, or a runs root (with ledger.sqlite) for all its runs")
    p.add_argument("--json", action="store_true", help='print {"runs": [...]} instead of the table')
    p.add_argument("--plot", metavar="OUT.png", help="save loss/LR/throughput plots with attempt boundaries")
    p.add_argument("--goodput", action="store_true",
                   help="where each run's allocated GPU-hours went (productive, queued while eligible, lost by cause: "
                        "preemption, OOM, hang, node failure, divergence, restart overhead, steps redone, checkpoint "
                        "save, other) and Meta's ETTR, from one sacct call, the ledger and TensorBoard (docs/review.md)")
    p.add_argument("--csv", action="store_true", help="with --goodput: print the table as CSV (hours), a total row last")
    p.add_argument("--sacct-file", metavar="F", default=None,
                   help="with --goodput: a saved sacct reply instead of asking Slurm (sacct -D -P --format="
                        "JobID,JobName,State,ExitCode,NodeList,Submit,Eligible,Start,End,Elapsed,AllocTRES -j IDS)")
    p.add_argument("--serve", action="store_true", help="run TensorBoard on the run's tb/ (or the root) until Ctrl-C")
    p.add_argument("--port", type=int, default=None, help="port for --serve (default: a free one)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address for --serve (default 127.0.0.1; any other needs a token: --token-file or "
                        "$HPC_AGENT_REVIEW_TOKEN)")
    p.add_argument("--token-file", metavar="PATH", default=None,
                   help="a file (mode 600) holding the token --serve requires of every request on a non-loopback "
                        "--host (default: $HPC_AGENT_REVIEW_TOKEN); sent as ?token=, a Bearer header or a cookie. "
                        "Never on the command line: ps shows argv to every user")
    # Kept only to refuse it with a clear message (and so that `--token` is never taken as an abbreviation
    # of --token-file): a token in argv is visible to every user of the login node.
    p.add_argument("--token", default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve-seconds", type=float, default=None, help=argparse.SUPPRESS)
    p.add_argument("--pull", metavar="DIR", help="with --remote: mirror the run's TensorBoard files into DIR "
                   "(only new bytes each time), then review, --plot or --serve the mirror here (docs/remote.md)")
    p.add_argument("--export-tb", action="store_true", help=argparse.SUPPRESS)  # the login-node half of --pull
    add_read_cap_argument(p)
    ssh.add_arguments(p)
    return add_common_arguments(p)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args, code = parse(build_parser(), argv)
    if args is None:
        return code
    if args.token is not None:  # a token in argv: refused, whatever else was asked (docs/security.md)
        from hpc_agent.runs.serve import ARGV_TOKEN_GONE

        print(ARGV_TOKEN_GONE, file=sys.stderr)
        return EXIT_USAGE
    path = Path(args.path)
    if args.export_tb:  # a laptop's review --pull asks for the bytes it lacks (hpc_agent.remote.tb_pull)
        from hpc_agent.remote.tb_pull import export_main

        return export_main(path)
    if args.remote:  # the table runs on the login node; plots and TensorBoard run here, on a --pull mirror
        if args.pull:
            from hpc_agent.remote.tb_pull import pull_for_review

            code, local = pull_for_review(args, ssh.local_argv(argv))
            return code if local is None else main(local)
        if args.plot or args.serve:
            print("review --remote: --plot and --serve run on this machine: add --pull DIR", file=sys.stderr)
            return EXIT_USAGE
        return ssh.forward("review", ssh.local_argv(argv), args)
    if args.pull:
        print("review: --pull needs --remote USER@HOST", file=sys.stderr)
        return EXIT_USAGE
    problem = goodput_usage_problem(args)
    if problem:
        print(f"review: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.serve:  # refuse an unsafe bind before reading anything
        from hpc_agent.runs.serve import bind_problem, token_from

        args.token, problem = token_from(None, args.token_file, os.environ)
        problem = problem or bind_problem(args.host, args.token)
        if problem:
            print(problem, file=sys.stderr)
            return EXIT_USAGE
    if not path.is_dir():
        print(f"review: {path} is not a directory (give a run directory or a runs root)", file=sys.stderr)
        return EXIT_USAGE
    from hpc_agent.sweep.trials_table import is_sweep_dir  # a sweep dir: its trials table and objective plot instead

    if is_sweep_dir(path) and not args.goodput:  # --goodput: the goodput of the runs under it instead
        from hpc_agent.core.extras import MissingExtra
        from hpc_agent.sweep.trials_table import review_sweep

        try:
            return review_sweep(path, args.json, args.plot)
        except MissingExtra as exc:
            print(f"review: {exc}", file=sys.stderr)
            return EXIT_USAGE
    runs_root, run_dirs = find_runs(path)
    if not run_dirs:
        print(f"review: no runs under {path} (no {', '.join(rundir.MARKERS)})", file=sys.stderr)
        return EXIT_USAGE
    runs, bad = review_runs(run_dirs, runs_root, caps=args.read_caps)
    if args.goodput:
        return goodput_main(args, runs, bad)
    if args.json:
        print(json.dumps({"runs": [public(r) for r in runs], "problems": bad}, indent=2, default=str))
    else:
        render_table(runs)
        for r in runs:  # a run over a read cap (hpc_agent/core/read_caps.py) is said, never silently cut
            for note in r.get("notes", ()):
                if cap_of(note):
                    print(f"review: {r['run_id']}: {note}", file=sys.stderr)
    for line in problem_lines(bad):
        print(f"review: {line}", file=sys.stderr)
    if args.plot:
        out = plot_runs(runs, Path(args.plot))
        if not args.json:
            print(f"plot: {out}")
    if bad and not args.serve:
        return exit_status.FAILED  # every good run was shown; a bad one is a problem line, never a traceback
    if args.serve:
        logdir = rundir.tb_dir(run_dirs[0]) if len(run_dirs) == 1 else runs_root
        if logdir.is_symlink():  # TensorBoard would follow it out of the run directory
            print(f"review: {logdir} is a symbolic link; not serving what it points to", file=sys.stderr)
            return EXIT_USAGE
        return serve(logdir, args.port, args.serve_seconds, sys.stderr if args.json else sys.stdout,
                     args.host, args.token)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(invocation.run(main))
