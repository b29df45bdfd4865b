"""Torch-free facts shared by the login side and the job: the run directory and the only safe way to read what a
job wrote (``rundir``), crash-safe files and modes (``fsutil``, ``filemodes``, ``nfs_files``), the run lease
(``runlease``, ``lease_rules``), the formats both sides read and write (``checkpoint_format``, ``heartbeat_format``,
``in_job_journal``, ``code_manifest``), why an attempt ended (``causes``) and the job's exit codes (``exit_codes``),
the preemption hand-back protocol (``handback``), the shipped files (``paths``), optional extras (``extras``), the
prepared DeepSpeed ops (``ops_cache``) and a pickle reader that never unpickles (``pickle_scan``).

Imports nothing above it: no config, no Slurm, no torch at module level.
"""
