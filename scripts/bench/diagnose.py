"""Diagnoser accuracy on real failures: the cause named for each case of ``tests/data/wild/`` (issue 43).

    python -m scripts.bench.diagnose [--root tests/data/wild] [--repeats 3] [--worst 15]
                                     [--out results/bench_diagnose.json] [--baseline REV]

``--baseline REV`` scores an older revision's diagnoser on the same corpus in the same run (from a temporary git
worktree of it, in a subprocess), asked the strongest way it allows: a case without sacct text gets the sacct
line every failed job has (FAILED 1:0, with Start and End), since an older diagnoser may not take a log alone.

Each case folder (``tests/data/wild/README.md``) holds ``log.txt``, ``meta.json`` (``cause``, the expected
answer; ``acceptable``, every acceptable answer; ``framework``; ``sacct``; optional ``sacct_format``) and
optional ``sacct.txt``. The diagnoser is asked the way a user would ask it (:func:`answer`): with sacct text,
``hpc_agent.diagnose.diagnose(None, sacct_text, [LogText("log.txt", log)], [], Config())`` (what
``diagnose --sacct-file sacct.txt --log log.txt`` computes); without, ``classify_logs([LogText("log.txt", log)])``
(``diagnose --log log.txt``). An exception in the diagnoser is the answer ``EXCEPTION`` (its message kept), a
wrong answer. A folder that is not a well-formed case (no log, unreadable or incomplete ``meta.json``, a cause
that is no cause name, ``sacct`` in ``meta.json`` disagreeing with ``sacct.txt``) is listed under
``corpus.malformed`` and left out of every score; it never stops the run.

Scores, all from the first of the ``--repeats`` passes over the corpus (the later passes time it and check that
every answer is the same):

- **accepted rate**: answers in the case's ``acceptable`` list, over the cases scored (n).
- **per cause** ``c`` (every cause expected or answered): TP = cases answered ``c`` where ``c`` is acceptable;
  FP = cases answered ``c`` where ``c`` is not acceptable; FN = cases whose expected cause (``meta["cause"]``)
  is ``c`` and whose answer is not acceptable. precision = TP / (TP + FP), recall = TP / (TP + FN) (null when
  the denominator is 0). An ambiguous case answered with an acceptable cause other than its expected one is a
  TP of the cause answered and neither TP nor FN of the expected one. ``n`` is the number of cases expecting ``c``.
- **confusion matrix**: ``confusion[expected][answered]``, counts, the expected cause being ``meta["cause"]``.
- **cost-weighted error**: the cost of each answer by what the watcher would do with it, summed and averaged
  over the cases. For one true cause ``t`` and an answer ``a``:

  ====================================================================  ====
  ``a == t`` (accepted)                                                  0
  ``t`` repairable, ``a`` a stopping cause: a repairable run stopped     10
  ``t`` a failure, ``a`` completed / running / pending                   5
  ``t`` repairable, ``a`` another repairable: a wasted attempt,          3
  the wrong fix applied
  anything else wrong (code_error <-> env_error, ``cancelled``           2
  answered otherwise, EXCEPTION, ...)
  ``t`` code_error or env_error, ``a`` repairable or unknown: the        1
  bug retried once
  ``t`` repairable, ``a`` unknown: requeued once unchanged               1
  ====================================================================  ====

  repairable = {preempted, timeout, node_fail, host_oom, gpu_oom, shm_exhausted, nccl_error, gpu_hw_error,
  diverged, hung}; stopping = {code_error, env_error, cancelled, run_dir_busy}; a failure is any cause but
  completed, running, pending and unknown. A case with several acceptable causes costs the least of the costs
  over them (0 when the answer is any of them): the corpus cannot tell which reading is true, so the bench
  charges only what is certainly wrong.
- **repairable_stopped_as_code_error**: the cases whose acceptable causes are all repairable but whose answer
  is code_error (the worst mistake the watcher can make from a diagnosis; should be empty; reported, not
  enforced).
- counts and accepted rates per ``framework`` and per sacct format (``meta["sacct_format"]``; else ``none``
  without ``sacct.txt`` and ``unspecified`` with one).
- timing: wall-clock seconds of one pass over the whole corpus (loading excluded), min/median/max of
  ``--repeats`` passes, and the slowest cases.

Needs no Slurm and no torch. The figures change as the classifier does; the JSON names the commit.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # also run as a file, not only with -m
    sys.path.insert(0, str(REPO))

from hpc_agent.config.schema import Config  # noqa: E402
from hpc_agent.core.causes import ALL_CAUSES  # noqa: E402
from hpc_agent.core.rundir import LogText  # noqa: E402
from hpc_agent.diagnose import diagnose  # noqa: E402
from hpc_agent.diagnosis.classify import classify_logs  # noqa: E402

DEFAULT_ROOT = Path("tests/data/wild")
EXCEPTION = "EXCEPTION"
REPAIRABLE = frozenset({"preempted", "timeout", "node_fail", "host_oom", "gpu_oom", "shm_exhausted", "nccl_error",
                        "gpu_hw_error", "diverged", "hung"})
STOPPING = frozenset({"code_error", "env_error", "cancelled", "run_dir_busy"})
NOT_ENDED = frozenset({"completed", "running", "pending"})
NOT_FAILURE = NOT_ENDED | {"unknown"}
CODE_BUGS = frozenset({"code_error", "env_error"})
COST_TABLE = {
    "accepted": 0,
    "repairable_stopped": 10,       # truth repairable, answer stopping
    "failure_as_not_ended": 5,      # truth a failure, answer completed/running/pending
    "wrong_repair": 3,              # truth repairable, answer another repairable
    "other_wrong": 2,               # anything else wrong (EXCEPTION included)
    "code_bug_retried": 1,          # truth code_error/env_error, answer repairable or unknown
    "repairable_unknown": 1,        # truth repairable, answer unknown
}


# --- the corpus ------------------------------------------------------------------------------------------------
@dataclass
class Case:
    name: str
    log: str
    sacct: Optional[str]
    meta: Dict[str, Any] = field(default_factory=dict)
    problem: Optional[str] = None
    """Why the folder is not a well-formed case (None: it is one); such a case is reported and never scored."""


def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")  # as diagnose reads a log


def _meta_problem(meta: Any, has_sacct: bool) -> Optional[str]:
    if not isinstance(meta, dict):
        return f"meta.json is a {type(meta).__name__}, not an object"
    cause, acceptable = meta.get("cause"), meta.get("acceptable")
    if not isinstance(cause, str) or cause not in ALL_CAUSES:
        return f"meta.json: cause {cause!r} is not a cause name"
    if not isinstance(acceptable, list) or not acceptable:
        return "meta.json: acceptable is not a non-empty list"
    odd = [c for c in acceptable if not isinstance(c, str) or c not in ALL_CAUSES]
    if odd:
        return f"meta.json: acceptable has {odd!r}, not cause names"
    if cause not in acceptable:
        return f"meta.json: cause {cause!r} is not in acceptable {acceptable!r}"
    if "framework" in meta and not isinstance(meta["framework"], str):
        return f"meta.json: framework {meta['framework']!r} is not a string"
    shape = meta.get("sacct_format")
    if shape is not None and not (isinstance(shape, str) or (isinstance(shape, list) and shape
                                                             and all(isinstance(x, str) for x in shape))):
        return f"meta.json: sacct_format {shape!r} is neither a string nor a list of strings"
    if "job_id" in meta and not isinstance(meta["job_id"], str):
        return f"meta.json: job_id {meta['job_id']!r} is not a string"
    said = meta.get("sacct")
    if said is not None and (said != "none") != has_sacct:
        return f"meta.json says sacct {said!r} but sacct.txt is {'there' if has_sacct else 'missing'}"
    return None


def load_case(folder: Path) -> Case:
    """One case folder; a malformed one comes back with ``problem`` set, never as an exception."""
    name = folder.name
    try:
        log_path, meta_path, sacct_path = folder / "log.txt", folder / "meta.json", folder / "sacct.txt"
        if not log_path.is_file():
            return Case(name, "", None, problem="no log.txt")
        if not meta_path.is_file():
            return Case(name, "", None, problem="no meta.json")
        log = _read_text(log_path)
        if not log.strip() and not sacct_path.is_file():  # a source that pasted only sacct: the sacct decides it
            return Case(name, log, None, problem="log.txt is empty and there is no sacct.txt")
        try:
            meta = json.loads(_read_text(meta_path))
        except ValueError as exc:
            return Case(name, log, None, problem=f"meta.json is not JSON: {exc}")
        sacct = _read_text(sacct_path) if sacct_path.is_file() else None
        if sacct is not None and not sacct.strip():
            return Case(name, log, sacct, meta if isinstance(meta, dict) else {}, problem="sacct.txt is empty")
        problem = _meta_problem(meta, sacct is not None)
        return Case(name, log, sacct, meta if isinstance(meta, dict) else {}, problem=problem)
    except (OSError, RecursionError) as exc:  # unreadable file, a folder where a file should be, absurd JSON
        return Case(name, "", None, problem=f"unreadable: {type(exc).__name__}: {exc}")


def load_cases(root: Path = DEFAULT_ROOT) -> List[Case]:
    """Every case folder under ``root`` (sorted by name; files and hidden folders skipped), malformed ones
    included with ``problem`` set. A missing root gives no cases."""
    root = Path(root)
    try:
        folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    return [load_case(p) for p in folders]


def sacct_format(case: Case) -> str:
    """The case's sacct shape (several joined with ``+``: ``array+p``); ``none``/``unspecified`` without one."""
    shape = case.meta.get("sacct_format")
    if isinstance(shape, list):
        shape = "+".join(shape)
    return shape or ("none" if case.sacct is None else "unspecified")


# --- one answer ------------------------------------------------------------------------------------------------
def answer(case: Case) -> Tuple[str, Dict[str, Any]]:
    """(the cause the diagnoser names, what it showed: route, evidence, hypotheses); ``EXCEPTION`` with the
    error when the diagnoser raised."""
    logs = [LogText("log.txt", case.log)]
    try:
        if case.sacct is not None:
            report = diagnose(case.meta.get("job_id"), case.sacct, logs, [], Config())
            if report.get("last_end"):  # requeued, queued or running again: why the attempt before it ended
                end = report["last_end"]
                return str(end["cause"]), {"route": "diagnose, last_end", "state": end.get("state", ""),
                                           "evidence": list(end.get("evidence", [])), "hypotheses": []}
            return str(report["cause"]), {"route": "diagnose", "state": report.get("state", ""),
                                          "evidence": list(report.get("evidence", [])),
                                          "hypotheses": list(report.get("hypotheses", []))}
        found = classify_logs(logs)
        return found.cause.value, {"route": "classify_logs", "evidence": list(found.evidence),
                                   "hypotheses": list(found.hypotheses)}
    except Exception as exc:  # noqa: BLE001 - recorded as the answer EXCEPTION, counted wrong
        return EXCEPTION, {"route": "diagnose" if case.sacct is not None else "classify_logs",
                           "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=-4).splitlines()[-8:]}


# --- scores (pure) ---------------------------------------------------------------------------------------------
def cost_one(truth: str, answer_: str) -> int:
    """The cost of answering ``answer_`` when the true cause is ``truth`` (the table in the docstring)."""
    if answer_ == truth:
        return COST_TABLE["accepted"]
    if truth in REPAIRABLE and answer_ in STOPPING:
        return COST_TABLE["repairable_stopped"]
    if truth not in NOT_FAILURE and answer_ in NOT_ENDED:
        return COST_TABLE["failure_as_not_ended"]
    if truth in REPAIRABLE and answer_ in REPAIRABLE:
        return COST_TABLE["wrong_repair"]
    if truth in CODE_BUGS and (answer_ in REPAIRABLE or answer_ == "unknown"):
        return COST_TABLE["code_bug_retried"]
    if truth in REPAIRABLE and answer_ == "unknown":
        return COST_TABLE["repairable_unknown"]
    return COST_TABLE["other_wrong"]


def cost(acceptable: Iterable[str], answer_: str) -> int:
    """The least cost over the acceptable causes (0 when the answer is one of them)."""
    return min(cost_one(t, answer_) for t in acceptable)


def _rate(good: int, n: int) -> Optional[float]:
    return round(good / n, 4) if n else None


def per_cause(records: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """TP/FP/FN, precision and recall per cause, as the docstring defines them."""
    causes = sorted({r["expected"] for r in records} | {r["answer"] for r in records})
    out = {}
    for c in causes:
        tp = sum(1 for r in records if r["answer"] == c and c in r["acceptable"])
        fp = sum(1 for r in records if r["answer"] == c and c not in r["acceptable"])
        fn = sum(1 for r in records if r["expected"] == c and r["answer"] not in r["acceptable"])
        out[c] = {"n": sum(1 for r in records if r["expected"] == c),
                  "answered": sum(1 for r in records if r["answer"] == c),
                  "tp": tp, "fp": fp, "fn": fn, "precision": _rate(tp, tp + fp), "recall": _rate(tp, tp + fn)}
    return out


def confusion(records: Sequence[Dict[str, Any]]) -> Dict[str, Dict[str, int]]:
    out: Dict[str, Dict[str, int]] = {}
    for r in records:
        row = out.setdefault(r["expected"], {})
        row[r["answer"]] = row.get(r["answer"], 0) + 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def _groups(records: Sequence[Dict[str, Any]], key: str) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for value in sorted({r[key] for r in records}):
        group = [r for r in records if r[key] == value]
        good = sum(1 for r in group if r["accepted"])
        out[value] = {"n": len(group), "accepted": good, "rate": _rate(good, len(group))}
    return out


def score(records: Sequence[Dict[str, Any]], worst: int = 15) -> Dict[str, Any]:
    """Every score of one pass. Each record: name, expected, acceptable, answer, framework, sacct_format."""
    records = [{**r, "accepted": r["answer"] in r["acceptable"], "cost": cost(r["acceptable"], r["answer"])}
               for r in records]
    n = len(records)
    accepted = sum(1 for r in records if r["accepted"])
    total = sum(r["cost"] for r in records)
    ranked = sorted((r for r in records if r["cost"] > 0), key=lambda r: (-r["cost"], r["name"]))
    return {
        "n": n,
        "n_per_cause": dict(sorted(Counter(r["expected"] for r in records).items())),
        "accepted": {"accepted": accepted, "n": n, "rate": _rate(accepted, n)},
        "per_cause": per_cause(records),
        "confusion": confusion(records),
        "cost_weighted_error": {"total": total, "mean": round(total / n, 4) if n else None, "n": n,
                                "by_cost": {str(k): v for k, v in sorted(Counter(r["cost"] for r in records).items())}},
        "worst_cases": [{"name": r["name"], "expected": r["expected"], "acceptable": list(r["acceptable"]),
                         "answer": r["answer"], "cost": r["cost"]} for r in ranked[:worst]],
        "per_framework": _groups(records, "framework"),
        "per_sacct_format": _groups(records, "sacct_format"),
        "repairable_stopped_as_code_error": sorted(
            r["name"] for r in records if r["answer"] == "code_error" and set(r["acceptable"]) <= REPAIRABLE),
        "exceptions": sorted(r["name"] for r in records if r["answer"] == EXCEPTION),
    }


# --- the run ---------------------------------------------------------------------------------------------------
def record(case: Case, answered: str) -> Dict[str, Any]:
    return {"name": case.name, "expected": case.meta["cause"], "acceptable": list(case.meta["acceptable"]),
            "answer": answered, "framework": case.meta.get("framework") or "unspecified",
            "sacct_format": sacct_format(case)}


def one_pass(cases: Sequence[Case], ask: Callable[[Case], Tuple[str, Dict[str, Any]]] = answer
             ) -> Tuple[float, List[Tuple[str, Dict[str, Any]]], List[float]]:
    """(wall seconds for the whole pass, the answers, seconds per case)."""
    answers, per_case = [], []
    t0 = time.perf_counter()
    for case in cases:
        t = time.perf_counter()
        answers.append(ask(case))
        per_case.append(time.perf_counter() - t)
    return time.perf_counter() - t0, answers, per_case


def run(root: Path, repeats: int = 3, worst: int = 15,
        ask: Callable[[Case], Tuple[str, Dict[str, Any]]] = answer) -> Dict[str, Any]:
    """The whole result (what the JSON file holds), from ``repeats`` passes over the corpus at ``root``."""
    cases = load_cases(root)
    good = [c for c in cases if c.problem is None]
    passes = [one_pass(good, ask) for _ in range(max(1, repeats))]
    first = passes[0][1]
    records = [record(c, a[0]) for c, a in zip(good, first)]
    scores = score(records, worst)
    seconds = [p[0] for p in passes]
    per_case_median = [statistics.median(p[2][i] for p in passes) for i in range(len(good))]
    slowest = sorted(range(len(good)), key=lambda i: -per_case_median[i])[:5]
    unstable = sorted({good[i].name for p in passes[1:] for i, a in enumerate(p[1]) if a[0] != first[i][0]})
    case_rows = []
    for r, (_, shown) in zip(records, first):
        case_rows.append({**r, "accepted": r["answer"] in r["acceptable"], "cost": cost(r["acceptable"], r["answer"]),
                          **shown})
    return {
        "benchmark": "diagnoser accuracy on real failures (tests/data/wild): accepted rate, per-cause P/R, "
                     "confusion, cost-weighted error",
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no", "--", "hpc_agent", "scripts")),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "corpus": {"root": str(root), "folders": len(cases), "size": len(good),
                   "malformed": [{"name": c.name, "problem": c.problem} for c in cases if c.problem is not None]},
        "cost_table": {"values": COST_TABLE, "repairable": sorted(REPAIRABLE), "stopping": sorted(STOPPING),
                       "several_acceptable": "the least cost over the acceptable causes"},
        **scores,
        "timing": {"repeats": len(passes), "seconds": [round(s, 4) for s in seconds],
                   "min_s": round(min(seconds), 4), "median_s": round(statistics.median(seconds), 4),
                   "max_s": round(max(seconds), 4),
                   "per_case_ms_median": round(1000 * statistics.median(seconds) / len(good), 3) if good else None,
                   "slowest_cases": [{"name": good[i].name, "median_ms": round(1000 * per_case_median[i], 3)}
                                     for i in slowest],
                   "answers_stable": not unstable, "unstable_cases": unstable},
        "cases": case_rows,
    }


BASELINE_SACCT = ("JobID|JobName|State|ExitCode|NodeList|Start|End\n"
                  "1|job|FAILED|1:0|node1|2026-01-01T00:00:00|2026-01-01T01:00:00\n"
                  "1.batch|batch|FAILED|1:0|node1|2026-01-01T00:00:00|2026-01-01T01:00:00\n")
"""What a user of an older diagnoser without ``diagnose --log`` alone gives it for a case without sacct text: the
line every failed job has in sacct (FAILED 1:0, with Start and End, so that its log is read)."""

_BASELINE_ASK = r"""
import json, sys
from hpc_agent.config.schema import Config
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnose import diagnose
cases, fallback = json.load(sys.stdin)
out = {}
for case in cases:
    logs = [LogText("log.txt", case["log"])]
    try:
        report = diagnose(case.get("job_id"), case["sacct"] or fallback, logs, [], Config())
        end = report.get("last_end")
        out[case["name"]] = (end or report)["cause"]
    except Exception as exc:
        out[case["name"]] = "EXCEPTION"
print(json.dumps(out))
"""


def baseline_answers(rev: str, cases: Sequence[Case]) -> Dict[str, str]:
    """Each case's answer from the diagnoser of revision ``rev``, run from a temporary worktree of it in a
    subprocess, asked the strongest way that revision allows: with the case's sacct text, else with
    :data:`BASELINE_SACCT`."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench-diagnose-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True, text=True, timeout=120)
        try:
            payload = json.dumps([[{"name": c.name, "log": c.log, "sacct": c.sacct, "job_id": c.meta.get("job_id")}
                                   for c in cases], BASELINE_SACCT])
            proc = subprocess.run([sys.executable, "-c", _BASELINE_ASK], input=payload, capture_output=True, text=True,
                                  cwd=str(tree), env={**__import__("os").environ, "PYTHONPATH": str(tree)}, timeout=600)
            if proc.returncode != 0:
                raise RuntimeError(f"the baseline at {rev} failed: {proc.stderr[-2000:]}")
            return json.loads(proc.stdout.strip().splitlines()[-1])
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], capture_output=True,
                           timeout=120)


def with_baseline(out: Dict[str, Any], rev: str, root: Path, worst: int = 15) -> Dict[str, Any]:
    """``out`` plus ``baseline``: the same corpus scored with revision ``rev``'s diagnoser, in the same run."""
    good = [c for c in load_cases(root) if c.problem is None]
    answers = baseline_answers(rev, good)
    records = [record(c, answers.get(c.name, EXCEPTION)) for c in good]
    scores = score(records, worst)
    changed = [{"name": r["name"], "acceptable": r["acceptable"], "baseline": r["answer"], "now": now["answer"]}
               for r, now in zip(records, out["cases"]) if r["answer"] != now["answer"]]
    out["baseline"] = {"rev": rev, "commit": _git("rev-parse", rev),
                       "asked": "the case's sacct text with its log; without sacct text, the log with the sacct line "
                                "every failed job has (FAILED 1:0, Start and End given): the older diagnoser cannot "
                                "take a log alone",
                       **{k: scores[k] for k in ("accepted", "per_cause", "cost_weighted_error",
                                                 "repairable_stopped_as_code_error", "exceptions", "worst_cases")},
                       "answers_changed": changed}
    return out


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _f(x: Optional[float]) -> str:
    return "   -" if x is None else f"{x:.2f}"


def table(out: Dict[str, Any]) -> str:
    """The compact text summary printed to stdout."""
    acc, cwe, corpus, timing = out["accepted"], out["cost_weighted_error"], out["corpus"], out["timing"]
    lines = [f"diagnose bench: {corpus['size']} cases ({len(corpus['malformed'])} malformed) at "
             f"{out['commit'][:10]}{' (dirty)' if out['dirty'] else ''}, {out['date']}",
             f"accepted {acc['accepted']}/{acc['n']} = {_f(acc['rate'])}    cost-weighted error "
             f"{cwe['total']} total, {_f(cwe['mean'])} per case",
             "", f"{'cause':15s} {'n':>4s} {'ans':>4s} {'TP':>4s} {'FP':>4s} {'FN':>4s} {'P':>5s} {'R':>5s}"]
    for c, row in out["per_cause"].items():
        lines.append(f"{c:15s} {row['n']:4d} {row['answered']:4d} {row['tp']:4d} {row['fp']:4d} {row['fn']:4d} "
                     f"{_f(row['precision']):>5s} {_f(row['recall']):>5s}")
    off = sorted(((n, e, a) for e, row in out["confusion"].items() for a, n in row.items() if a != e),
                 key=lambda t: (-t[0], t[1], t[2]))
    lines += ["", "confused (expected -> answered: cases): "
              + ", ".join(f"{e}->{a}: {n}" for n, e, a in off) if off else "confused: none"]
    for title, key in (("by framework", "per_framework"), ("by sacct format", "per_sacct_format")):
        lines.append(f"{title}: " + ", ".join(f"{k} {v['accepted']}/{v['n']}" for k, v in out[key].items()))
    lines.append("worst: " + ("; ".join(f"{w['name']} ({w['expected']} -> {w['answer']}, {w['cost']})"
                                        for w in out["worst_cases"][:8]) or "none"))
    if out.get("baseline"):
        b = out["baseline"]
        lines.append(f"baseline {b['rev']} ({b['commit'][:10]}), same corpus, same run: accepted "
                     f"{b['accepted']['accepted']}/{b['accepted']['n']} = {_f(b['accepted']['rate'])}, cost-weighted "
                     f"error {b['cost_weighted_error']['total']} ({_f(b['cost_weighted_error']['mean'])} per case), "
                     f"repairable stopped as code_error: {len(b['repairable_stopped_as_code_error'])}")
        lines.append("recall now / baseline: " + ", ".join(
            f"{c} {_f(row['recall'])}/{_f(b['per_cause'].get(c, {}).get('recall'))}"
            for c, row in out["per_cause"].items() if row["n"]))
    stopped = out["repairable_stopped_as_code_error"]
    lines.append(f"repairable_stopped_as_code_error ({len(stopped)}): {', '.join(stopped) or 'none'}")
    if out["exceptions"]:
        lines.append(f"EXCEPTION: {out['exceptions']}")
    lines.append(f"timing: {timing['repeats']} passes, {timing['min_s']:.3f} / {timing['median_s']:.3f} / "
                 f"{timing['max_s']:.3f} s min/median/max ({timing['per_case_ms_median']} ms a case); "
                 f"answers stable: {timing['answers_stable']}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(REPO / DEFAULT_ROOT), help="the corpus (default tests/data/wild)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the corpus for the timing (default 3)")
    parser.add_argument("--worst", type=int, default=15, help="worst cases listed (default 15)")
    parser.add_argument("--out", default=str(REPO / "results" / "bench_diagnose.json"))
    parser.add_argument("--baseline", metavar="REV", help="also score the diagnoser of git revision REV on the same "
                                                          "corpus in the same run (e.g. ed5d1ae, before issue 43)")
    args = parser.parse_args(argv)
    out = run(Path(args.root), args.repeats, args.worst)
    if args.baseline:
        out = with_baseline(out, args.baseline, Path(args.root), args.worst)
    try:
        out["corpus"]["root"] = str(Path(args.root).resolve().relative_to(REPO))
    except ValueError:
        pass
    from hpc_agent.core.fsutil import atomic_write_json

    atomic_write_json(Path(args.out), out)
    print(table(out))
    print(f"wrote {args.out}")
    return 0 if out["corpus"]["size"] else 1


if __name__ == "__main__":
    sys.exit(main())
