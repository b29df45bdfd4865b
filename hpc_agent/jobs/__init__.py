"""Turning a config into a Slurm job: the submitit executor and job script (``executor``), submitting an attempt with
its ledger intent (``submission``, the one place the login side hands ``launch.job``'s callable to submitit), the
job's Python and container (``containers``), the code snapshot taken at submit (``code_snapshot``) and
``submit --place auto`` (``place``).
"""
