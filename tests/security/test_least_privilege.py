"""Asset: the ledger and other runs. A second user in the runs root's group reads nothing hpc_agent keeps
private: the ledger of a private runs root, and, in a group-shared one, only what the group was given."""
from __future__ import annotations

import os
import stat

from hpc_agent.state.ledger import Ledger


def test_another_user_cannot_read_a_private_ledger(tmp_path, other_user):
    root = tmp_path / "runs"
    ledger = Ledger.in_runs_root(root)
    ledger.add_run("r1", "r1", str(root / "r1"))
    ledger.close()
    os.chmod(tmp_path, 0o755)
    assert stat.S_IMODE(os.stat(root / "ledger.sqlite").st_mode) == 0o600
    out = other_user.run(["cat", str(root / "ledger.sqlite")])
    assert out.returncode != 0 and "Permission denied" in out.stderr
