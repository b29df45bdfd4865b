"""``bash -n``: does a piece of shell parse? The one runner of it (submit's job-script check, doctor's profile check).

``bash -n`` reads and parses without executing anything. It runs without startup files and without ``BASH_ENV``
(which a non-interactive bash would source), in a bounded time, with the text on stdin (no argv limit).
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Optional

TIMEOUT_S = 5.0
ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def bash_syntax_problem(text: str, timeout_s: float = TIMEOUT_S) -> Optional[str]:
    """None when bash parses ``text`` without an error or warning, else what bash said (one line, bounded).
    A warning counts: ``here-document delimited by end-of-file`` is bash's only word for a here-doc that
    swallowed the rest of the script. Without bash on PATH: ``bash not found`` (never silently passed)."""
    bash = shutil.which("bash", path=ENV["PATH"]) or shutil.which("bash")
    if bash is None:
        return "bash not found on this machine to check the job script's syntax"
    try:
        res = subprocess.run([bash, "--norc", "--noprofile", "-n"], input=text.encode("utf-8", "replace"),
                             capture_output=True, timeout=timeout_s, env=ENV)
    except subprocess.TimeoutExpired:
        return f"bash -n did not finish in {timeout_s:g} s"
    except OSError as exc:
        return f"bash -n could not run ({exc.strerror or exc})"
    said = " / ".join(line.strip().replace(f"{bash}: ", "bash: ")
                      for line in res.stderr.decode("utf-8", "replace").splitlines() if line.strip())
    if res.returncode == 0 and not said:
        return None
    return (said or f"bash -n exited {res.returncode}")[:300]
