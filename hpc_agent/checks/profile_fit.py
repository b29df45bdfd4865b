"""``doctor --profile NAME``: does the cluster profile fit the live cluster? (docs/profiles.md)

The profile's config keys already went through the config check and ``sbatch --test-only`` (doctor's
check_sbatch, with the profile's account, qos, partition and GPU request style). This module adds what only
a profile says: the partition exists (sinfo), the account and qos are known to accounting (``sacctmgr list``:
a cluster without association enforcement accepts any account at sbatch), the GPU request style is accepted even for a CPU-only config
(a one-GPU ``sbatch --test-only`` on a partition that has GPUs), the quirks match the cluster's Slurm
version (``sinfo --version``), and the activation lines parse (``bash -n``, run here: it executes nothing).
Each result is ``(level, name, detail)`` with the fix named. Login-node code: no torch.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from hpc_agent.config.profile import QUIRK_SINCE, QUIRKS, gpu_request
from hpc_agent.core.shell_syntax import bash_syntax_problem
from hpc_agent.slurm.cli import SlurmCLI, SlurmError
from hpc_agent.slurm.sinfo import parse_version, select, version_argv

Result = Tuple[str, str, str]


def _where(cfg: Any) -> str:
    return f"profile {cfg.profile.name} ({cfg.profile.source})" if cfg.profile.name else "the config"


def check_partition(cfg: Any, parts: Optional[Sequence[Any]]) -> Result:
    want = cfg.slurm.partition
    if parts is None:
        return "WARN", "profile partition", "not checked: sinfo does not answer"
    if not want:
        return "OK", "profile partition", "none set: the cluster's default partition"
    if select(parts, want):
        return "OK", "profile partition", f"{want} exists"
    known = ", ".join(sorted({p.name for p in parts}))
    return "FAIL", "profile partition", (f"partition {want} does not exist here (sinfo lists {known}): fix "
                                         f"slurm.partition in {_where(cfg)}")


ACCOUNTING_LISTS = {"account": ["sacctmgr", "--noheader", "--parsable2", "list", "account", "format=account"],
                    "qos": ["sacctmgr", "--noheader", "--parsable2", "list", "qos", "format=name"]}


def check_accounting_name(cli: SlurmCLI, cfg: Any, key: str) -> Result:
    """Is ``slurm.account`` / ``slurm.qos`` known to accounting? A cluster that does not enforce associations
    lets ``sbatch --test-only`` accept any account (the localhost one does), so a typo would pass unseen and
    the jobs be charged nowhere. Read-only ``sacctmgr list``; a list this user cannot read is a WARN."""
    want, name = getattr(cfg.slurm, key), f"profile {key}"
    if not want:
        return "OK", name, f"none set: your default {key}"
    try:
        res = cli.run(ACCOUNTING_LISTS[key], check=False, timeout_s=15)
    except SlurmError as exc:
        return "WARN", name, f"not checked: {exc}"
    known = sorted({line.strip() for line in res.stdout.splitlines() if line.strip()}, key=str.lower)
    if res.returncode != 0 or not known:
        return "WARN", name, f"not checked: sacctmgr lists no {key} here ({res.stderr.strip()[:200] or 'empty'})"
    if str(want).lower() in {k.lower() for k in known}:  # Slurm stores account and qos names lowercased
        return "OK", name, f"{want} is known to accounting"
    return "FAIL", name, (f"{key} {want} is not known to accounting (sacctmgr lists {', '.join(known[:20])}): "
                          f"fix slurm.{key} in {_where(cfg)}")


def gpu_style_argv(cfg: Any, partition: str) -> List[str]:
    option, value = gpu_request(cfg.profile, 1)
    argv = ["sbatch", "--test-only", "--job-name", "hpc-agent-doctor", "--nodes", "1", "--ntasks", "1",
            "--time", "1", "--partition", partition, f"--{option}", value]
    for flag, extra in (("--account", cfg.slurm.account), ("--qos", cfg.slurm.qos)):
        if extra:
            argv += [flag, str(extra)]
    return argv + ["--wrap", "true"]


def check_gpu_style(cli: SlurmCLI, cfg: Any, parts: Optional[Sequence[Any]]) -> Result:
    """A GPU config was tested by check_sbatch in this style; a CPU config is tested here with one GPU, on
    the profile's partition when it has GPUs (else the first partition that has)."""
    option, value = gpu_request(cfg.profile, cfg.slurm.gpus_per_node or 1)
    style = f"--{option}={value}"
    if cfg.slurm.gpus_per_node:
        return "OK", "gpu request", f"{style}: sbatch --test-only above tried it with the job's resources"
    gpu_parts = [p for p in parts or [] if p.gpus]
    target = next((p for p in gpu_parts if p.name == cfg.slurm.partition), gpu_parts[0] if gpu_parts else None)
    if target is None:
        return "OK", "gpu request", f"{style} not tried: no partition here has GPUs (gres), and the config asks for none"
    try:
        res = cli.run(gpu_style_argv(cfg, target.name), check=False, timeout_s=20)
    except SlurmError as exc:
        return "WARN", "gpu request", f"not checked: {exc}"
    said = " / ".join(l.strip() for l in (res.stderr + res.stdout).splitlines() if l.strip())[:300]
    if res.returncode == 0:
        return "OK", "gpu request", f"partition {target.name} accepts {style}: {said}"
    return "FAIL", "gpu request", (f"sbatch rejects {style} on partition {target.name}: {said}; set "
                                   "profile.gpu_request (gpus-per-node, gres or gres-typed with gpu_type) in "
                                   f"{_where(cfg)}")


def check_quirks(cli: SlurmCLI, cfg: Any) -> Result:
    try:
        text = cli.run(version_argv(), check=False, timeout_s=15)
        version = parse_version(text.stdout + text.stderr)
    except SlurmError as exc:
        return "WARN", "slurm version", f"not checked: {exc}"
    if version is None:
        return "WARN", "slurm version", "sinfo --version printed no version: quirks not checked"
    shown, fails, notes = f"Slurm {version[0]}.{version[1]:02d}", [], []
    quirks = cfg.profile.quirks or {}
    for name in QUIRKS:
        has, says = version >= QUIRK_SINCE[name], quirks.get(name, True)
        since = "%d.%02d" % QUIRK_SINCE[name]
        if says and not has:
            fix = " and profile.gpu_request: gres" if name == "gpus_per_node_option" else ""
            fails.append(f"{name}: true but {shown} is older than {since}: set profile.quirks.{name}: false{fix}")
        elif has and not says:
            notes.append(f"{name}: false although {shown} has it (since {since}): it may be true")
    if fails:
        return "FAIL", "slurm version", f"{'; '.join(fails + notes)} (in {_where(cfg)})"
    if notes:
        return "WARN", "slurm version", f"{'; '.join(notes)} (in {_where(cfg)})"
    return "OK", "slurm version", f"{shown}: the profile's quirks match ({', '.join(f'{k}={quirks.get(k, True)}' for k in QUIRKS)})"


def check_activation(lines: Sequence[str], timeout_s: float = 10.0) -> Result:
    """``bash -n`` parses the lines without running them, each alone (as submit does) and all together."""
    if not lines:
        return "OK", "activation", "no activation lines"
    for i, line in enumerate(lines):
        if why := bash_syntax_problem(f"{line}\n", timeout_s):
            return "FAIL", "activation", f"bash -n rejects profile.activate[{i}]: {why}; fix the shell syntax"
    if why := bash_syntax_problem("\n".join(lines) + "\n", timeout_s):
        return "FAIL", "activation", f"bash -n rejects the activation lines: {why}; fix the shell syntax"
    return "OK", "activation", f"{len(lines)} line(s) parse (bash -n); they run as written in the batch shell"


def check_profile(cli: SlurmCLI, cfg: Any, parts: Optional[Sequence[Any]]) -> List[Result]:
    """Every profile check, for doctor's list; the Slurm ones only where Slurm answers."""
    p = cfg.profile
    head = ("OK", "profile", f"{p.name} from {p.source}: gpu_request {p.gpu_request}"
            f"{' (' + p.gpu_type + ')' if p.gpu_type else ''}, {len(p.activate or [])} activation line(s)")
    results = [head]
    if parts is not None:
        results += [check_partition(cfg, parts), check_accounting_name(cli, cfg, "account"),
                    check_accounting_name(cli, cfg, "qos"), check_gpu_style(cli, cfg, parts), check_quirks(cli, cfg)]
    return results + [check_activation([str(x) for x in p.activate or []])]
