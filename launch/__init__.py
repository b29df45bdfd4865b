"""What runs inside the job: the training entry point and its parts (imports torch)."""
