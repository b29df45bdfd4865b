"""The config the watcher acts on: kept in the ledger, never read back from the run directory.

A run directory can be written by the job's own code, and, in a group-shared runs root, renamed or replaced
by any member of the group (docs/security.md). Its ``config.yaml`` is the *job's* copy: the job reads it at
start and writes its own repairs into it. The watcher must not take anything from it that it would run,
submit or send to: ``train.command``, ``slurm.python``, the container image, activation lines, ``notify.*``.

So the ledger, which only the watcher's user can write, keeps every version of each run's config (table
``run_configs``, the YAML and its SHA-256):

* ``submit`` (and every resubmission, through ``jobs.submission.submit_attempt``) records the config it
  submits, before sbatch runs;
* the watcher records each patch it applies (an exclusion, a resubmission's repair) and writes the job's
  copy from its own (:func:`commit`);
* the job's own repairs reach the watcher as lines of its in-job journal; the watcher applies only the keys
  of :data:`IN_JOB_KEYS` to its copy (:func:`apply_in_job`) and audits the rest as refused.

A run recorded before the ledger kept configs has no version yet: its run directory's config is adopted
once, on first use, and the adoption is audited (``config_adopted``); from then on the ledger's copy rules.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hpc_agent.config.load import apply_patch, load_run_config, load_snapshot_text, to_yaml, write_run_config
from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.schema import Config

IN_JOB_KEYS = frozenset({
    "train.micro_batch_size", "train.grad_accum_steps", "train.lr", "train.activation_checkpointing",
    "train.offload", "train.zero_stage",
})
"""The settings the job's own repairs may change (the OOM ladder and the divergence rollback): memory layout
and learning rate. Nothing that names a program, a path, an image, a partition or a notification target."""

ADOPTED = "adopted from the run directory (a run recorded before the ledger kept configs)"


# --- pure ------------------------------------------------------------------------------------------------
def split_in_job_patch(patch: Mapping[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """``(the keys the job may change, the keys it may not)`` of one in-job repair's patch."""
    allowed = {k: v for k, v in patch.items() if k in IN_JOB_KEYS}
    return allowed, sorted(k for k in patch if k not in IN_JOB_KEYS)


def digest(yaml_text: str) -> str:
    return hashlib.sha256(yaml_text.encode("utf-8")).hexdigest()


def parse_recorded(run_id: str, row: Tuple[int, str, str, str]) -> Config:
    """A recorded version back into a Config; its hash is checked (a ledger edited by hand, or torn)."""
    version, _source, text, sha = row
    where = f"ledger config v{version} of run {run_id}"
    if digest(text) != sha:
        raise ConfigError([Problem(where, "<hash mismatch>", "the SHA-256 recorded with it")])
    return load_snapshot_text(text, source=where)


# --- on the ledger ---------------------------------------------------------------------------------------
def record(ledger: Any, run_id: str, cfg: Config, source: str) -> int:
    """Record ``cfg`` as the run's newest config; returns its version."""
    return ledger.record_config(run_id, to_yaml(cfg), source)


def current(ledger: Any, run_id: str, run_dir: Optional[str | Path] = None) -> Config:
    """The config the watcher acts on: the ledger's newest version. A run without one adopts its run
    directory's config once (``run_dir`` given), audited as ``config_adopted``. Raises ConfigError or OSError
    when there is none to be had."""
    row = ledger.latest_config(run_id)
    if row is not None:
        return parse_recorded(run_id, row)
    if run_dir is None:
        raise ConfigError([Problem(f"run {run_id}", "<no config in the ledger>", "a config recorded at submit")])
    cfg = load_run_config(Path(run_dir))  # bounded, regular file only (rundir.read_text)
    from hpc_agent.state.journal import Journal

    version = record(ledger, run_id, cfg, ADOPTED)
    Journal(ledger).add_audit(run_id, {"action": "config_adopted", "version": version, "reason": ADOPTED})
    return cfg


def commit(ledger: Any, run_id: str, run_dir: str | Path, cfg: Config, source: str,
           name: Optional[str] = None) -> Path:
    """Record ``cfg`` in the ledger, then write the job's copy from it (``config.yaml``, or the attempt copy
    ``name``); returns the written path."""
    record(ledger, run_id, cfg, source)
    return write_run_config(Path(run_dir), cfg) if name is None else write_run_config(Path(run_dir), cfg, name=name)


def apply_in_job(ledger: Any, run_id: str, run_dir: str | Path, patch: Mapping[str, Any], source: str) -> Dict[str, Any]:
    """One in-job repair, as the watcher takes it: the allowed keys applied to its own copy (a new version,
    validated like every config), the others refused. Returns ``{"applied": {...}, "refused": [...],
    "problem": str|None}``; never writes the run directory (the job has its own copy)."""
    allowed, refused = split_in_job_patch(patch)
    out: Dict[str, Any] = {"applied": {}, "refused": refused, "problem": None}
    if allowed:
        try:
            cfg = apply_patch(current(ledger, run_id, run_dir), allowed)
        except (ConfigError, OSError) as exc:
            out["problem"] = " ".join(str(exc).split())[:300]
        else:
            record(ledger, run_id, cfg, source)
            out["applied"] = allowed
    return out
