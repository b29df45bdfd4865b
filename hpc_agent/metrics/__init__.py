"""Training metrics on the login node (no torch, no deepspeed, no TensorFlow).

- ``tb_reader``: ``RunScalars``, incremental reading of a run's TensorBoard event files (one per attempt,
  ``purge_step`` applied, newest attempt wins); TensorBoard itself is imported only when files are read;
- ``divergence``: ``detect(loss, grad_norm, loss_scale, throughput)`` -> ``Alarm``s (pure).
"""
