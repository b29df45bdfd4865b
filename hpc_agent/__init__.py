"""hpc_agent: submit, watch, repair and review deep-learning training jobs on Slurm.

Login-node modules (submit, watch, diagnose, review) never import torch or deepspeed; only the code
that runs inside the job (``launch/``) does.
"""
__version__ = "0.1.0"
