"""Unprivileged accounts for tests that must not run as root (CI runs as root, a user never does).

``ensure_user`` creates the account once (needs root, ``useradd`` and ``setpriv``; the caller skips otherwise,
saying why), and ``User.run`` runs an argv list as it: its own uid and gid, only the groups named, the
environment given and nothing of root's.
"""
from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple

TOOLS = ("useradd", "groupadd", "setpriv")


@dataclass(frozen=True)
class User:
    """An unprivileged account; ``run`` runs argv as it (no root, no shell)."""

    name: str
    uid: int
    gid: int
    groups: Tuple[int, ...] = ()

    def run(self, argv: Sequence[str], cwd: Optional[Path] = None, timeout: float = 60,
            env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
        groups = [f"--groups={','.join(map(str, self.groups))}"] if self.groups else ["--clear-groups"]
        return subprocess.run(["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", *groups, "--",
                               *map(str, argv)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env=dict(env) if env is not None else {"PATH": "/usr/bin:/bin", "HOME": "/tmp"})


def why_not() -> Optional[str]:
    """Why no account can be made here (None when one can)."""
    if os.geteuid() != 0:
        return "needs root to create an unprivileged user (CI runs as root)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)} to create and run as a second user"
    return None


def ensure_group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", name], check=True, capture_output=True, timeout=30)
        return grp.getgrnam(name).gr_gid


def ensure_user(name: str, groups: Sequence[str] = (), home: Optional[Path] = None) -> User:
    """The account ``name`` (created when missing, in ``groups``, with ``home`` as its home directory, which
    is not created). Call :func:`why_not` first."""
    gids = tuple(ensure_group(g) for g in groups)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        argv = ["useradd", "--no-create-home", "--shell", "/bin/bash"]
        argv += ["--groups", ",".join(groups)] if groups else []
        argv += ["--home-dir", str(home)] if home else []
        subprocess.run([*argv, name], check=True, capture_output=True, timeout=30)
        entry = pwd.getpwnam(name)
    return User(name, entry.pw_uid, entry.pw_gid, gids)


def reachable_by_others(path: Path, within: Sequence[Path]) -> Optional[str]:
    """Give others search permission (o+x) on ``path``'s folders that lack it, but only folders under one of
    ``within`` (temp dirs, the checkout): never anything else. Returns why ``path`` stays unreachable, or None."""
    path = Path(path).resolve()
    roots = [Path(w).resolve() for w in within]
    for folder in [*reversed(path.parents), path]:
        if folder == Path("/"):
            continue
        mode = folder.stat().st_mode
        if mode & 0o001:
            continue
        if not any(folder == r or r in folder.parents for r in roots):
            return f"{folder} is not searchable by other users, and it is outside the folders a test may change"
        os.chmod(folder, (mode | 0o001) & 0o7777)
    return None
