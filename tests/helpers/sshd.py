"""A throw-away sshd on a free 127.0.0.1 port, for the ``--remote`` tests: its own host key, config and
authorized_keys in a temporary folder, a client key beside them; nothing in ~/.ssh or /etc/ssh is read or
changed. Needs root (sshd's privilege separation) and OpenSSH (scripts/cluster.sh installs it)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, Optional

SSHD = "/usr/sbin/sshd"  # sshd re-executes itself and insists on an absolute path


def missing() -> Optional[str]:
    """Why no test sshd can run here, or None."""
    if os.geteuid() != 0:
        return "the test sshd needs root"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (apt-get install openssh-server; scripts/cluster.sh installs it)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install openssh-client)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hpc_agent-test", "-f", str(path)],
                   check=True, capture_output=True, timeout=60)


@contextmanager
def local_sshd(folder: Path) -> Iterator[Dict[str, str]]:
    """Run sshd; yields the environment a client needs (``HPC_AGENT_SSH_OPTS``, a short ``XDG_RUNTIME_DIR``
    for the control socket). Stops sshd, and the shared connection's session, afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    _keygen(folder / "host_key")
    _keygen(folder / "client_key")
    auth = folder / "authorized_keys"
    auth.write_text((folder / "client_key.pub").read_text())
    auth.chmod(0o600)
    port = _free_port()
    config = folder / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {folder / 'host_key'}",
        f"AuthorizedKeysFile {auth}", f"PidFile {folder / 'sshd.pid'}", "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM no", "StrictModes no", "LogLevel VERBOSE", ""]))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # Debian's privilege separation directory
    log = open(folder / "sshd.log", "wb")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    runtime = Path(tempfile.mkdtemp(prefix="hr", dir="/tmp"))  # short: a socket path has ~100 bytes
    known = folder / "known_hosts"
    env = {"HPC_AGENT_SSH_OPTS": f"Port={port} IdentityFile={folder / 'client_key'} IdentitiesOnly=yes "
                                 f"UserKnownHostsFile={known} StrictHostKeyChecking=accept-new",
           "XDG_RUNTIME_DIR": str(runtime)}
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"sshd exited {proc.returncode}: {(folder / 'sshd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("sshd did not listen within 30 s")
                time.sleep(0.1)
        yield env
    finally:
        _close_master(env)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)


def _close_master(env: Dict[str, str]) -> None:
    """``ssh -O exit`` on the shared connection the tests opened (ControlPersist would keep it 10 min)."""
    import argparse

    from hpc_agent.remote.ssh import Remote

    args = argparse.Namespace(remote="root@127.0.0.1", remote_python=None, remote_dir=None, ssh_option=[])
    try:
        Remote(args, environ={**os.environ, **env}).close()
    except Exception:  # noqa: BLE001 - teardown: sshd is stopped next either way
        pass
