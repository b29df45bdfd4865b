"""What a training alarm is, and the names of its kinds: the vocabulary of the one divergence detector
(``hpc_agent/metrics/divergence.py``, which computes them with numpy) for everyone who only reads, names or
passes alarms on (the classifier, ``diagnose``, the watcher's pure core, the job). Pure, standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Alarm:
    kind: str
    """One of ``KINDS``, or (from ``hpc_agent.diagnosis.alarms``) its ``LEGACY_KIND`` name."""
    step: int
    """First step of the problem (where training should be rolled back *before*)."""
    detail: str


NAN_LOSS = "nan_loss"
LOSS_SPIKE = "loss_spike"
GRAD_EXPLOSION = "grad_explosion"
LOSS_SCALE_COLLAPSE = "loss_scale_collapse"
STALLED_THROUGHPUT = "stalled_throughput"
KINDS = (NAN_LOSS, LOSS_SPIKE, GRAD_EXPLOSION, LOSS_SCALE_COLLAPSE, STALLED_THROUGHPUT)
FATAL_KINDS = (NAN_LOSS, LOSS_SCALE_COLLAPSE)
"""The kinds that make an ended attempt count as diverged (the others are shown by review only)."""
NONFINITE_LOSS = "nonfinite_loss"
LOSS_SCALE_AT_MINIMUM = "loss_scale_at_minimum"
LEGACY_KIND = {NAN_LOSS: NONFINITE_LOSS, LOSS_SCALE_COLLAPSE: LOSS_SCALE_AT_MINIMUM}
"""Our kind -> the kind ``hpc_agent.diagnosis.alarms`` reports for the same trouble."""
