"""Training metrics on the login node (no torch, no deepspeed, no TensorFlow).

- ``tb_reader``: ``RunScalars``, incremental reading of a run's TensorBoard event files (one per attempt,
  ``purge_step`` applied, newest attempt wins); TensorBoard itself is imported only when files are read;
- ``divergence``: ``detect(loss, grad_norm, loss_scale, throughput)`` -> ``Alarm``s (pure).
"""
from hpc_agent.metrics.divergence import KINDS, LEGACY_KIND, Alarm, detect
from hpc_agent.metrics.tb_reader import Point, RunScalars

__all__ = ["Alarm", "detect", "KINDS", "LEGACY_KIND", "Point", "RunScalars"]
