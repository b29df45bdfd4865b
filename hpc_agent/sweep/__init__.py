"""Hyperparameter sweeps (``python -m hpc_agent.sweep``): Optuna ask/tell over ordinary runs.

spec.py parses the sweep file (pure), batch.py submits trials as job arrays, driver.py runs the loop,
adopt.py takes over what a killed driver left, trial_attrs.py names the attributes each trial records.
Optuna is imported only where a study is built, never when this package is imported.
"""
