"""Why a job got SIGUSR2, from what slurmctld says about it (``scontrol --oneliner show job``). Pure.

hpc_agent asks Slurm for ``--signal=USR2@<slurm.signal_lead_s>``. Slurm sends it in two cases, and a person can
send it too:

- **preemption** (``SlurmctldParameters=preempt_send_user_signal``): slurmctld sets the job's ``PreemptTime``
  when it starts to preempt it (and shortens ``EndTime`` to the end of the partition's ``GraceTime``: so the
  time left cannot tell a preemption from the time limit, ``PreemptTime`` can);
- **the time limit**: ``signal_lead_s`` before it. Slurm checks for due signals in its background loop, so the
  signal may come up to 60 s early (``man sbatch``, ``--signal``); the rule allows :data:`EARLY_SLACK_S`;
- **anyone else**, e.g. ``scancel --signal=USR2 JOB``: no ``PreemptTime`` and more time left than that. The
  job treats it as a checkpoint request (it saves and trains on) and never hands over to a successor.

When Slurm cannot be asked (scontrol failed, timed out, or does not know the job) the reason is
:data:`~hpc_agent.core.handback.UNKNOWN`: the job saves and hands itself back to Slurm with the plain requeue,
as a preemption must never be ignored, but does not hand over to a successor.
"""
from __future__ import annotations

from typing import Dict, Tuple

from hpc_agent.core.handback import PREEMPTED, STRAY, TIME_LIMIT, UNKNOWN
from hpc_agent.slurm.timelimit import slurm_time_to_seconds

EARLY_SLACK_S = 90
"""How much earlier than ``signal_lead_s`` before the limit the time-limit signal may arrive (Slurm: up to 60 s),
with room for scontrol's whole seconds and the time the job took to ask."""
_NOT_SET = ("", "None", "Unknown", "N/A", "(null)")


def usr2_reason(fields: Dict[str, str], lead_s: int) -> Tuple[str, str]:
    """(reason, what Slurm said) for one job's ``scontrol`` fields (``hpc_agent.slurm.fallback.parse_scontrol_jobs``)."""
    if not fields or "JobState" not in fields:
        return UNKNOWN, "Slurm does not know the job"
    preempt = fields.get("PreemptTime", "")
    if preempt not in _NOT_SET:
        return PREEMPTED, f"PreemptTime={preempt}"
    limit, run = fields.get("TimeLimit", ""), fields.get("RunTime", "")
    if limit.upper() in ("UNLIMITED", "INFINITE"):
        return STRAY, "no preemption and no time limit"
    try:
        left = slurm_time_to_seconds(limit) - slurm_time_to_seconds(run)
    except ValueError:
        return UNKNOWN, f"unreadable TimeLimit={limit!r} RunTime={run!r}"
    if left <= lead_s + EARLY_SLACK_S:
        return TIME_LIMIT, f"{max(left, 0)} s left of TimeLimit={limit}"
    return STRAY, f"no preemption and {left} s left of TimeLimit={limit} (the signal comes {lead_s} s before it)"
