"""The watcher: a thin loop (``loop``) around a pure core (``follow``, ``follow_hang``, ``follow_model``: observation in,
phase, effects and audit out), what it observes each tick (``observe``), the effects carried out idempotently
(``effects``), notifications (``notify_events`` decides, ``notifier`` delivers), the job's own repairs recorded
(``in_job``), the watcher inside waiting commands (``embedded``, ``submit_wait``) and its systemd/scrontab files
(``service_files``).
"""
