"""What to do, as pure functions of facts: the watcher's decision after an attempt ends (``decide``), THE OOM ladder
and the memory estimate (``memory``), which partition to run on (``partitions``; GPU speeds in ``gpu_types``),
the adaptive LR schedule's rules (``adaptive_lr``) and submit's memory check (``preflight``). No I/O: the job
(``launch/``) asks the same rules for its in-job repairs.
"""
