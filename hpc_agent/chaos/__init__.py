"""The chaos driver: run a training job under the watcher and inject a schedule of faults.

``schedule`` (parse a file or make one from a seed), ``progress`` (attempts and steps from the job logs)
and ``report`` (steps lost, ETTR, the nothing-lost checks, the printed report) are pure; ``driver`` and
``inject`` are the imperative shell; ``__main__`` is the CLI (``python -m hpc_agent.chaos --help``).
"""
