"""Trial user attributes: each trial's own durable record of where its run is.

The driver writes them to the Optuna storage one by one, before it acts (``A_INTENT`` last, just before
sbatch), so that a restarted driver (``adopt.py``) can tell from them how far a killed one got.
"""
A_RUN_ID, A_RUN_DIR, A_BATCH, A_INDEX, A_SIZE, A_INTENT, A_JOB = (
    "run_id", "run_dir", "batch", "batch_index", "batch_size", "intent_at", "job_id")
A_PRUNED = "pruned_at_step"
A_FAIL = "fail_reason"
