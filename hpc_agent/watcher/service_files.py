"""Keep the watcher running on a login node: the systemd user unit and the scrontab entry, rendered in one place.

``hpc-agent watch --install-systemd`` writes the unit, ``--print-scrontab`` prints the entry, and
docs/watcher.md and docs/remote.md show what these functions render, so the documented examples and the
installed files cannot drift apart. Both name the runs root and the Python *absolutely*: a unit or a cron job
starts in another directory with another PATH, where ``./runs`` and ``python3`` mean something else.
The Python is the virtualenv's own ``bin/python`` as the command was started with (``sys.executable``), never
resolved through its link: the link's target is the system Python, without hpc_agent.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Mapping, Sequence

UNIT_NAME = "hpc-agent-watch.service"
SCRON_OPTIONS = "--time=1-00:00:00 --job-name=hpc-agent-watch"
SCRON_MAX_TICKS = 700  # ~1 h at the default 5 s interval: the next @hourly run takes over the lease


class ServiceError(ValueError):
    """A path no unit file or crontab line can carry (a newline, a '%' in a crontab)."""


def watch_words(python: str, runs_root: Path, extra: Sequence[str] = ()) -> List[str]:
    words = [str(python), "-m", "hpc_agent.watch", "--runs-root", str(runs_root), *extra]
    if any(not w or any(ord(c) < 32 or c == "\x7f" for c in w) for w in words):
        raise ServiceError(f"{words!r}: an empty word or a control character cannot go into a unit or crontab")
    return words


def systemd_word(word: str) -> str:
    """One ExecStart word in systemd's syntax: ``%`` specifiers and ``$`` variables escaped, quoted if needed."""
    escaped = word.replace("%", "%%").replace("$", "$$")
    if escaped and not any(c in escaped for c in " \t\"'\\;"):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(python: str, runs_root: Path) -> str:
    exec_start = " ".join(systemd_word(w) for w in watch_words(python, runs_root))
    return ("[Unit]\nDescription=hpc_agent watcher\n"
            "[Service]\n"
            f"ExecStart={exec_start}\n"
            "Restart=always\nRestartSec=10\n"
            "[Install]\nWantedBy=default.target\n")


def scrontab_lines(python: str, runs_root: Path) -> str:
    words = watch_words(python, runs_root, ["--max-ticks", str(SCRON_MAX_TICKS)])
    if any("%" in w for w in words):  # cron turns % into a newline
        raise ServiceError(f"{runs_root}: a '%' cannot go into a crontab line; use a runs root without one")
    return f"#SCRON {SCRON_OPTIONS}\n@hourly {shlex.join(words)}\n"


def unit_path(environ: Mapping[str, str] = os.environ) -> Path:
    config = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(config) / "systemd" / "user" / UNIT_NAME


ENABLE = ["systemctl", "--user", "enable", "--now", UNIT_NAME]
RELOAD = ["systemctl", "--user", "daemon-reload"]


def install_systemd(python: str, runs_root: Path, now: bool = False, environ: Mapping[str, str] = os.environ) -> int:
    """Write the unit (replacing an older one of ours), then print the commands that start it, or run them
    with ``now``. ``loginctl enable-linger`` (the unit outlives your login) is only printed: a site may forbid it."""
    path = unit_path(environ)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(systemd_unit(python, runs_root), encoding="utf-8")
    os.replace(tmp, path)
    print(f"wrote {path}")
    linger = f"loginctl enable-linger {shlex.quote(environ.get('USER') or 'USER')}"
    if not now:
        print(f"start it now and at every boot:  {shlex.join(RELOAD)} && {shlex.join(ENABLE)}")
        print(f"keep it running after you log out:  {linger}")
        return 0
    for argv in (RELOAD, ENABLE):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            print(f"{shlex.join(argv)} failed: {exc}", file=sys.stderr)
            return 1
        if proc.returncode != 0:
            print(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}", file=sys.stderr)
            return 1
    print(f"started {UNIT_NAME}; keep it running after you log out:  {linger}")
    return 0


def main(args) -> int:
    """``watch --install-systemd [--now]`` / ``watch --print-scrontab`` (hpc_agent.watch)."""
    runs_root = Path(args.runs_root).expanduser().resolve()
    try:
        if args.print_scrontab:
            print(scrontab_lines(sys.executable, runs_root), end="")
            print("# add these two lines with: scrontab -e", file=sys.stderr)
            return 0
        return install_systemd(sys.executable, runs_root, now=args.now)
    except (ServiceError, OSError) as exc:
        print(f"watch: {exc}", file=sys.stderr)
        return 2
