"""Diagnosis: (sacct records, log tails, training alarms) -> cause + evidence. Pure, no I/O.

- ``causes``: the cause taxonomy (``Cause``) and its one-line explanations;
- ``exit_codes``: the training job's own exit codes -> cause (the one table to align with ``launch/``);
- ``logscan``: log lines -> findings (cause, position, timestamp, rank, node);
- ``alarms``: TensorBoard scalar series -> NaN/inf loss and loss-scale alarms;
- ``classify``: all of it -> a ``Diagnosis`` per attempt (root cause across ranks).
"""
