"""python -m hpc_agent.doctor [CONFIG] [key=value ...] [--data PATH [--out FILE.yaml]] [--json]

Checks that a training job can run here before it is submitted: Slurm answers, accounting is on, the
partitions and their GPUs, the config is valid and sbatch would accept its resources (``--test-only``
submits nothing), the job's Python or container works on a compute node (``checks.job_python``), DeepSpeed's
ops are prepared and no torch build lock is stuck, GPU health and the memory estimate. Each check prints
``OK|WARN|FAIL  name: detail``; the exit code is 1 when any check FAILs, else 0 (2: a usage error; the
table shared by every command: ``hpc_agent.cli.exit_status``). Runs on login nodes:
imports neither torch nor deepspeed.

``--data PATH`` instead infers the ``data`` section of a config from a dataset file and writes it as
YAML to ``--out`` (or stdout).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any, List, Optional, Sequence

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure
from hpc_agent.slurm.cli import SlurmCLI, SlurmError, sbatch_test_argv
from hpc_agent.slurm.sinfo import Partition, gres_of, parse_partitions, partitions_argv, select

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass
class Check:
    level: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.level:<4}  {self.name}: {self.detail}"


def partition_table(parts: Sequence[Partition]) -> List[str]:
    rows = [("partition", "nodes", "cpus/node", "mem/node", "gpus/node", "state")]
    for p in parts:
        gpus = f"{p.gpus} ({p.gres})" if p.gpus else "none"
        mem = f"{int(p.mem_mb) // 1024} GiB" if p.mem_mb.isdigit() and int(p.mem_mb) >= 1024 else f"{p.mem_mb} MB"
        rows.append((p.name + (" (default)" if p.default else ""), str(p.nodes), p.cpus, mem, gpus, p.avail))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["      " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def summarize(checks: Sequence[Check]) -> tuple[int, str]:
    """Exit code (FAILED, 1, on any FAIL) and the summary line."""
    fails = [c.name for c in checks if c.level == FAIL]
    warns = [c.name for c in checks if c.level == WARN]
    oks = sum(c.level == OK for c in checks)
    if fails:
        return exit_status.FAILED, f"{len(fails)} blocker(s): {', '.join(fails)}; {len(warns)} warning(s), {oks} OK. Fix the FAILs before submitting."
    if warns:
        return 0, f"no blockers; {len(warns)} warning(s) ({', '.join(warns)}), {oks} OK."
    return 0, f"all {oks} checks OK."


# --- checks -------------------------------------------------------------------------------------

def check_slurm(cli: SlurmCLI) -> tuple[List[Check], Optional[List[Partition]]]:
    checks: List[Check] = []
    parts: Optional[List[Partition]] = None
    try:
        out = cli.run(partitions_argv(), timeout_s=15).stdout
        parts = parse_partitions(out)
        checks.append(Check(OK if parts else FAIL, "slurm", f"sinfo answers, {len(parts)} partition(s)"
                            if parts else "sinfo answers but lists no partitions"))
    except SlurmError as exc:
        checks.append(Check(FAIL, "slurm", f"sinfo does not answer: {exc}"))
    try:
        cli.run(["sacct", "--parsable2", "--noheader", "--starttime", "now-1minutes", "--format", "JobID"], timeout_s=15)
        checks.append(Check(OK, "accounting", "sacct answers"))
    except SlurmError as exc:
        checks.append(Check(FAIL, "accounting", f"sacct does not answer (the watcher needs accounting): {exc}"))
    if parts:
        gpu_parts = [f"{p.name} ({p.gpus}/node)" for p in parts if p.gpus]
        detail = ("GPUs on " + ", ".join(gpu_parts)) if gpu_parts else "no GPUs (gres) on any partition"
        checks.append(Check(OK, "partitions", detail))
    return checks, parts


def check_config(config: str, overrides: Sequence[str], profile: Optional[str] = None) -> tuple[Check, Any]:
    from hpc_agent.config.load import load_config
    from hpc_agent.config.problems import ConfigError

    try:
        cfg = load_config(config, overrides, profile=profile)
    except ConfigError as exc:
        problems = "; ".join(str(p) for p in exc.problems)
        return Check(FAIL, "config", f"{len(exc.problems)} problem(s): {problems}"), None
    what = f"command {' '.join(cfg.train.command)}" if cfg.train.command else f"workload {cfg.train.workload}"
    return Check(OK, "config", f"{config} is valid ({what}, {cfg.slurm.nodes} node(s) x "
                              f"{cfg.slurm.tasks_per_node} task(s), {cfg.slurm.gpus_per_node} GPU(s)/node)"), cfg


def check_sbatch(cli: SlurmCLI, cfg: Any, parts: Optional[List[Partition]]) -> List[Check]:
    s = cfg.slurm
    checks: List[Check] = []
    argv = sbatch_test_argv(s, getattr(cfg, "profile", None))
    try:
        res = cli.run(argv, check=False, timeout_s=20)
        msg = " / ".join(l.strip() for l in (res.stderr + res.stdout).splitlines() if l.strip())
        if res.returncode == 0:
            checks.append(Check(OK, "sbatch --test-only", f"partition {s.partition or '(default)'} accepts the job: {msg}"))
        else:
            what = ", ".join(f"{k} {v}" for k, v in (("partition", s.partition), ("account", s.account),
                                                     ("qos", s.qos)) if v) or "the default partition"
            checks.append(Check(FAIL, "sbatch --test-only", f"sbatch rejects the job ({what}): {msg}"))
    except SlurmError as exc:
        checks.append(Check(FAIL, "sbatch --test-only", str(exc)))
    if s.gpus_per_node and parts is not None:
        target = next(iter(select(parts, s.partition)), None)
        if target is not None and target.gpus == 0:
            checks.append(Check(FAIL, "gpus", f"slurm.gpus_per_node={s.gpus_per_node} but partition "
                                              f"{target.name} has no GPU gres"))
        elif target is not None and target.gpus < s.gpus_per_node:
            checks.append(Check(FAIL, "gpus", f"slurm.gpus_per_node={s.gpus_per_node} but partition "
                                              f"{target.name} has {target.gpus} GPU(s)/node"))
    return checks


def _gpu_mem_bytes(readings: Any) -> Optional[int]:
    """Smallest total memory over the GPU readings, when health reports it."""
    sizes = []
    for r in readings or []:
        for attr, scale in (("memory_total_mb", 2**20), ("memory_total_bytes", 1), ("memory_total_mib", 2**20)):
            value = getattr(r, attr, None) if not isinstance(r, dict) else r.get(attr)
            if isinstance(value, (int, float)) and value > 0:
                sizes.append(int(value * scale))
                break
    return min(sizes) if sizes else None


def _gpu_label(reading: Any) -> str:
    total = f", {reading.memory_total_mb / 1024:.0f} GiB" if reading.memory_total_mb else ""
    return f"GPU {reading.index} {reading.name}{total}"


def check_gpu_health() -> tuple[List[Check], List[str], Optional[int]]:
    from hpc_agent.diagnosis import gpu_health

    try:
        readings, error = gpu_health.read_gpus()
        verdicts = gpu_health.judge_all(readings, error)
    except Exception as exc:  # noqa: BLE001 - a health probe must never crash the doctor
        return [Check(WARN, "gpu health", f"could not read GPUs: {exc}")], [], None
    verdicts = verdicts if isinstance(verdicts, (list, tuple)) else [verdicts]
    checks: List[Check] = []
    for v in verdicts:
        level = getattr(v, "level", "WARN")
        reasons = "; ".join(getattr(v, "reasons", []) or []) or str(error or level)
        if level == "NO_GPU":
            checks.append(Check(WARN, "gpu health", f"no GPU on this machine (no NVIDIA driver / nvidia-smi): {reasons}"))
        else:
            if level == "OK" and not getattr(v, "reasons", None):
                reasons = "OK: " + ", ".join(_gpu_label(r) for r in readings)  # say which GPUs were checked
            checks.append(Check({"OK": OK, "WARN": WARN}.get(level, FAIL), "gpu health", reasons))
    report: List[str] = []
    if readings:
        try:
            report = str(gpu_health.format_report(readings, verdicts)).splitlines()
        except Exception:  # noqa: BLE001
            report = []
    return checks or [Check(WARN, "gpu health", str(error or "no readings"))], report, _gpu_mem_bytes(readings)


def check_environment() -> List[Check]:
    """This Python's DeepSpeed ops (prepared, so jobs never compile) and torch build locks (none stuck)."""
    from hpc_agent.checks import envcheck

    return [Check(*result) for result in [envcheck.check_deepspeed_ops(), *envcheck.check_build_locks()]]


def target_gres(cfg: Any, parts: Optional[Sequence[Partition]]) -> str:
    """The gres of the partition the config asks for (the default one when it names none)."""
    return gres_of(parts or [], cfg.slurm.partition)


def check_memory(cfg: Any, gpu_bytes: Optional[int], gres: str = "") -> List[Check]:
    """submit's pre-flight verdict (:mod:`hpc_agent.policy.preflight`), against this machine's GPU when there is
    one, else the config's ``slurm.gpu_memory_gib`` or the partition's GPU type."""
    from hpc_agent.policy import preflight
    from hpc_agent.policy.memory import estimate_from_config, format_bytes

    try:
        need = estimate_from_config(cfg).total_bytes
    except ValueError as exc:  # a workload the estimator does not cover
        return [Check(OK, "memory", f"no estimate: {exc}")]
    capacity, source = (gpu_bytes, "this machine's GPU") if gpu_bytes else preflight.gpu_capacity(cfg, gres)
    if not capacity:
        return [Check(OK, "memory", f"estimate {format_bytes(need)} per GPU (GPU memory unknown here, not "
                                    "compared; set slurm.gpu_memory_gib to compare)")]
    verdict = preflight.memory_verdict(cfg, capacity, source)
    level = {preflight.WARN: WARN, preflight.REFUSE: FAIL}.get(verdict.level, OK)
    fix = f"; add: {' '.join(verdict.fix_overrides())}" if verdict.fix else ""
    return [Check(level, "memory", verdict.message + fix)]


# --- main ---------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=invocation.prog("doctor"),
        description="Check that Slurm, the partitions, the config, the GPUs and memory are ready for a job; "
                    "or (--data) infer a config's data section from a dataset file.",
        epilog="Examples: python -m hpc_agent.doctor quickstart slurm.partition=high | "
               "python -m hpc_agent.doctor --data train.csv --out data.yaml")
    parser.add_argument("config", nargs="?", help="YAML config: a path or a name in configs/ (e.g. quickstart)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.add_argument("--data", metavar="PATH", help="dataset file (csv/tsv/jsonl/text): infer the data section")
    parser.add_argument("--out", metavar="FILE.yaml", help="with --data: write the YAML here instead of stdout")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--profile", metavar="NAME", help="a cluster profile (default: $HPC_AGENT_PROFILE): also check "
                        "it against this cluster; without CONFIG the base config is checked (docs/profiles.md)")
    return add_common_arguments(parser, slurm=True)


def run_data(path: str, out: Optional[str], as_json: bool) -> int:
    from hpc_agent.checks.data_config import infer_file, render_yaml

    try:
        info = infer_file(path)
    except (OSError, ValueError) as exc:
        print(f"FAIL  data: {exc}", file=sys.stderr)
        return 1
    text = render_yaml(info)
    if as_json:
        print(json.dumps(info, default=str, indent=2))
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(text)
        detail = (f"{info['num_classes']} classes, ratio {info['imbalance_ratio']}, method {info['imbalance_method']}"
                  if info["workload"] == "classifier" else "text corpus: gpt workload")
        print(f"OK    data: {info['format']}, {detail}; wrote {out}", file=sys.stderr if as_json else sys.stdout)
    elif not as_json:
        print(text, end="")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    configure(args)
    if args.out and not args.data:
        build_parser().error("--out needs --data")
    if args.data:
        return run_data(args.data, args.out, args.json)

    checks: List[Check] = []
    extra: dict = {}
    cli = SlurmCLI()
    if SlurmCLI.available():
        slurm_checks, parts = check_slurm(cli)
    else:
        slurm_checks, parts = [Check(FAIL, "slurm", "sbatch is not on PATH (not a Slurm login node?)")], None
    checks += slurm_checks
    if parts:
        extra["partitions"] = partition_table(parts)
    cfg = None
    if args.config or args.profile:
        config_check, cfg = check_config(args.config or "base", args.overrides, args.profile)
        checks.append(config_check)
        if cfg is not None and parts is not None:
            checks += check_sbatch(cli, cfg, parts)
        if cfg is not None and cfg.profile.name:  # the profile against the live cluster (checks/profile_fit.py)
            from hpc_agent.checks import profile_fit
            checks += [Check(*result) for result in profile_fit.check_profile(cli, cfg, parts)]
        if cfg is not None:  # the job's interpreter/container on a compute node (hpc_agent/checks/job_python.py)
            from hpc_agent.checks import job_python
            checks.append(Check(*job_python.check_code(cfg, os.getcwd())))
            checks.append(Check(*(job_python.check_job_python(cli, cfg) if parts else
                                  job_python.skipped("Slurm does not answer here, so no compute node to ask"))))
    checks += check_environment()
    health_checks, report, gpu_bytes = check_gpu_health()
    checks += health_checks
    if report:
        extra["gpu report"] = report
    if cfg is not None:
        checks += check_memory(cfg, gpu_bytes, target_gres(cfg, parts))
    code, summary = summarize(checks)

    if args.json:
        print(json.dumps({"checks": [asdict(c) for c in checks], "partitions": [asdict(p) for p in parts or []],
                          "gpu_report": extra.get("gpu report", []),
                          "summary": summary, "exit_code": code}, indent=2))
        return code
    for check in checks:
        print(check.line())
        if check.name == "partitions":
            print("\n".join(extra.get("partitions", [])))
        if check.name == "gpu health" and report and check is health_checks[-1]:
            print("\n".join("      " + l for l in report))
    print(("FAILED: " if code else "READY: ") + summary)
    return code


if __name__ == "__main__":
    sys.exit(invocation.run(main))
