"""Slurm time limits (``--time``, ``TimeLeft``): the formats Slurm writes, in whole minutes. Pure.

Both sides read them: ``jobs.executor`` gives the local executor the config's ``slurm.time`` in minutes, and the
job (``launch/signals.py``) compares squeue's ``TimeLeft`` with its signal lead.
"""
from __future__ import annotations

UNLIMITED_MINUTES = 365 * 24 * 60
"""What an UNLIMITED (or INFINITE) Slurm time becomes: a year, i.e. no limit in practice."""


def slurm_time_to_minutes(value: str) -> int:
    """Slurm ``--time`` (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) to whole minutes, rounded up."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return UNLIMITED_MINUTES
    return max(1, -(-slurm_time_to_seconds(value) // 60))


def slurm_time_to_seconds(value: str) -> int:
    """A Slurm duration (``--time``'s forms, and ``scontrol``'s ``RunTime``/``TimeLimit``) in seconds;
    UNLIMITED/INFINITE is :data:`UNLIMITED_MINUTES` worth. Raises ValueError on anything else."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return UNLIMITED_MINUTES * 60
    days, _, rest = value.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        parts += [0] * (3 - len(parts))  # D-H, D-H:M
        hours, minutes, seconds = parts
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, parts[0], parts[1]
    else:
        hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
