"""What runs did and are doing, for people: a run's history from its directory and the ledger (``history``), live
progress (``progress``, ``progress_view``), the live hang hint (``liveness``), plots (``plot``) and ``review --serve``
(``serve``).
"""
