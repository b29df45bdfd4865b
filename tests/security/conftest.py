"""Fixtures for tests/security: the attacks of docs/security.md's threat model, one test file per finding.

These tests run login-side code only (no Slurm, no torch, no training job): an attacker writes files into a
run directory, a runs root or a journal, or answers HTTP slowly, and the test checks that the watcher and the
commands stay up, run nothing and go on with the other runs.

``other_user`` is a second, unprivileged account for the findings that need one (a member of the runs root's
group). CI runs as root, so it can create one; a non-root run skips those tests and says why.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pytest

from tests.helpers import users

OTHER_USER = "hpcagent_mallory"
SHARED_GROUP = "hpcagent_team"


@dataclass(frozen=True)
class OtherUser:
    """An unprivileged account in SHARED_GROUP; ``run`` runs argv as it (no root, no shell)."""

    name: str
    uid: int
    gid: int
    group: str
    group_gid: int

    def run(self, argv: Sequence[str], cwd: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        return users.User(self.name, self.uid, self.gid, (self.group_gid,)).run(argv, cwd=cwd, timeout=timeout)


@pytest.fixture(scope="session")
def other_user() -> OtherUser:
    """A second user in a group shared with root; needs root (CI) and useradd/setpriv."""
    if (why := users.why_not()) is not None:
        pytest.skip(why)
    user = users.ensure_user(OTHER_USER, groups=[SHARED_GROUP])
    return OtherUser(user.name, user.uid, user.gid, SHARED_GROUP, user.groups[0])


def share_with_group(path: Path, user: OtherUser) -> None:
    """Make ``path`` (a runs root or run dir) group-owned by the shared group and group-writable, setgid, as a
    project directory on a cluster is."""
    for p in [path, *path.rglob("*")]:
        if p.is_symlink():
            continue
        os.chown(p, -1, user.group_gid)
        os.chmod(p, (p.stat().st_mode | (0o2070 if p.is_dir() else 0o060)) & 0o7777)
    for parent in list(path.parents)[:-1]:  # the others must be able to reach it (tmp_path is 0700)
        os.chmod(parent, parent.stat().st_mode | 0o011)
