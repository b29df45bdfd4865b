"""fsutil: atomic writes and the single-instance lock of watch and sweep."""
from __future__ import annotations

import os

from hpc_agent.core.fsutil import atomic_write_json, atomic_write_text, hold_lock


def test_hold_lock_is_exclusive_and_released_on_close(tmp_path):
    path = tmp_path / "watch.lock"
    first = hold_lock(path)
    assert first is not None and path.read_text() == f"{os.getpid()}\n"
    assert hold_lock(path) is None  # a second holder (another open file) is refused...
    assert path.read_text() == f"{os.getpid()}\n"  # ...without emptying the holder's pid
    first.close()
    again = hold_lock(path)
    assert again is not None
    again.close()


def test_atomic_writes_leave_no_temp_files(tmp_path):
    atomic_write_text(tmp_path / "a" / "x.txt", "hello")
    atomic_write_json(tmp_path / "a" / "y.json", {"k": 1})
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.txt", "y.json"]
    assert (tmp_path / "a" / "x.txt").read_text() == "hello"


# --- ENOLCK: flock fails on NFS without a lock daemon ------------------------------------------------------
import errno  # noqa: E402
import socket  # noqa: E402

import pytest  # noqa: E402

from hpc_agent.core import fsutil  # noqa: E402


@pytest.fixture
def no_flock(monkeypatch):
    def enolck(handle, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fsutil.fcntl, "flock", enolck)


def test_hold_lock_without_flock_uses_an_owner_file(tmp_path, no_flock):
    path = tmp_path / "watch.lock"
    first = hold_lock(path)
    assert first is not None
    owner = fsutil.owner_path(path)
    assert owner.read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    assert path.read_text() == f"{os.getpid()}\n"  # callers read the holder's pid from the lock file itself
    assert hold_lock(path) is None  # held: a second taker is refused
    first.close()
    assert not owner.exists()
    again = hold_lock(path)
    assert again is not None
    again.close()


def test_hold_lock_without_flock_takes_over_a_dead_local_holder(tmp_path, no_flock):
    path = tmp_path / "watch.lock"
    fsutil.owner_path(path).write_text(f"999999 {socket.gethostname()}\n")  # no such pid: killed holder
    handle = hold_lock(path)
    assert handle is not None and fsutil.owner_path(path).read_text().startswith(f"{os.getpid()} ")
    handle.close()


def test_hold_lock_without_flock_reports_a_holder_on_another_host(tmp_path, no_flock, capsys):
    path = tmp_path / "watch.lock"
    fsutil.owner_path(path).write_text("4242 othernode\n")
    assert hold_lock(path) is None
    err = capsys.readouterr().err
    assert "ENOLCK" in err and "pid 4242 on othernode" in err and "delete" in err


def test_hold_lock_reraises_other_flock_errors(tmp_path, monkeypatch):
    def eio(handle, op):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fsutil.fcntl, "flock", eio)
    with pytest.raises(OSError):
        hold_lock(tmp_path / "x.lock")


# --- filesystem type ------------------------------------------------------------------------------------
MOUNTINFO = r"""22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
25 22 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=8G
30 22 0:25 / /tmp rw,nosuid,nodev shared:5 - tmpfs tmpfs rw
40 22 0:40 / /home rw,relatime shared:20 - nfs4 fs1:/export/home rw,vers=4.2,rsize=1048576
41 40 0:41 / /home/alice/scratch rw,relatime shared:21 - nfs fs2:/scratch rw,vers=3,nolock
42 22 0:42 / /lustre rw,relatime shared:22 - lustre 10.0.0.1@o2ib:/fs rw,flock
43 22 0:43 / /gpfs rw,relatime shared:23 - gpfs gpfs0 rw
44 22 0:44 / /beegfs rw,relatime shared:24 - beegfs beegfs_nodev rw
45 22 0:45 / /mnt/win rw,relatime shared:25 - cifs //srv/share rw,vers=3.0
46 22 0:46 / /mnt/remote rw,nosuid,nodev,relatime shared:26 - fuse.sshfs alice@host:/data rw,user_id=1000
47 22 259:3 / /data rw,relatime shared:27 - xfs /dev/nvme1n1 rw,attr2
48 22 0:48 / /var/lib/docker/overlay2/abc/merged rw,relatime - overlay overlay rw,lowerdir=/l
49 22 259:4 / /mnt/my\040disk rw,relatime shared:28 - ext4 /dev/sdb1 rw
50 22 0:50 / /data rw,relatime shared:29 - tmpfs tmpfs rw
"""

PROC_MOUNTS = """/dev/sda1 / ext4 rw,relatime 0 0
fs1:/export /shared nfs4 rw,vers=4.1 0 0
/dev/sdb1 /shared/local xfs rw 0 0
"""


@pytest.mark.parametrize("path,fstype,network", [
    ("/", "ext4", False),
    ("/etc/hosts", "ext4", False),
    ("/tmp/x", "tmpfs", False),
    ("/home/alice/runs", "nfs4", True),
    ("/home/alice/scratch/runs", "nfs", True),
    ("/home/alice/scratchy", "nfs4", True),  # a prefix of the name is not a mount point above it
    ("/lustre/proj/runs", "lustre", True),
    ("/gpfs/x", "gpfs", True),
    ("/beegfs/x", "beegfs", True),
    ("/mnt/win/runs", "cifs", True),
    ("/mnt/remote/runs", "fuse.sshfs", True),
    ("/data", "tmpfs", False),  # mounted over the xfs: the later mount wins
    ("/var/lib/docker/overlay2/abc/merged/app", "overlay", False),
    ("/mnt/my disk/runs", "ext4", False),  # \040 in mountinfo is a space
])
def test_filesystem_type_from_mountinfo(path, fstype, network):
    mounts = fsutil.parse_mounts(MOUNTINFO)
    assert fsutil.fs_type_for(path, mounts) == fstype
    assert fsutil.is_network_type(fstype) is network


@pytest.mark.parametrize("path,fstype", [("/x", "ext4"), ("/shared/runs", "nfs4"), ("/shared/local/a", "xfs")])
def test_filesystem_type_from_proc_mounts(path, fstype):
    assert fsutil.fs_type_for(path, fsutil.parse_mounts(PROC_MOUNTS)) == fstype


def test_parse_mounts_skips_garbage_and_empty_is_unknown():
    assert fsutil.parse_mounts("\n  \nnonsense\n1 2 3 - \n") == []
    assert fsutil.fs_type_for("/a", []) == "unknown"


def test_filesystem_type_of_this_machine_and_of_a_path_not_created_yet(tmp_path):
    here = fsutil.filesystem_type(tmp_path)
    assert here and here != "unknown"
    assert fsutil.filesystem_type(tmp_path / "not" / "yet") == here
    # A given mountinfo text is used as is (the table above): the nearest existing folder is matched.
    assert fsutil.filesystem_type("/", mountinfo="1 0 0:1 / / rw - nfs4 fs:/ rw\n") == "nfs4"
    assert fsutil.is_network_fs("/", mountinfo="1 0 0:1 / / rw - nfs4 fs:/ rw\n")


@pytest.mark.parametrize("fstype,mode,words", [
    ("ext4", "WAL", "local ext4"),
    ("xfs", "WAL", "local xfs"),
    ("nfs4", "DELETE", "runs root is on nfs4: SQLite WAL needs shared memory that network filesystems do not provide"),
    ("lustre", "DELETE", "on lustre"),
    ("fuse.sshfs", "DELETE", "on fuse.sshfs"),
])
def test_sqlite_journal_mode(fstype, mode, words):
    got, reason = fsutil.sqlite_journal_mode("/runs", mountinfo=f"1 0 0:1 / / rw - {fstype} src rw\n")
    assert got == mode and words in reason


def test_sqlite_journal_mode_when_the_type_cannot_be_told():
    got, reason = fsutil.sqlite_journal_mode("/runs", mountinfo="")
    assert got == "DELETE" and "cannot tell" in reason
