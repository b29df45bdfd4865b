"""``--remote USER@LOGIN``: run an hpc-agent command on a login node over ssh, from a laptop.

The command itself runs on the login node (``python3 -m hpc_agent <command> <args>``), so every Slurm
call happens there through the usual adapters and nothing on the laptop has to stay alive: the watcher
keeps running on the login node (systemd user unit or scrontab, :mod:`hpc_agent.watcher.service_files`).

How the ssh command is built (pure functions, table-tested in tests/unit/test_remote.py):

* ssh always hands the remote login shell one *string*. Each argv word is ``shlex.quote``d exactly once and
  joined, so the remote shell splits it back into the same words; no value is ever pasted unquoted.
* ``BatchMode=yes``: never a password or host-key prompt that would hang a script; ``ConnectTimeout`` and a
  subprocess timeout bound every call, ``ServerAlive*`` notices a dead connection.
* One multiplexed connection (``ControlMaster=auto``, ``ControlPersist``): a status, a review and a TB pull
  in a row authenticate once. The control socket lives in a private directory (0700, owned by the user,
  checked before every use): anyone who can reach the socket can run commands as the user on the login node.
* Extra client options (port, identity, known-hosts file) come from ``--ssh-option Key=value`` or
  ``$HPC_AGENT_SSH_OPTS`` and always go through ``-o``, so no option can be taken for the destination. They
  come first: ssh keeps the first value of an option, so a user can change a timeout or the port.

Login-node code and laptop code: no torch.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

SSH_OPTS_ENV = "HPC_AGENT_SSH_OPTS"
REMOTE_PYTHON_ENV = "HPC_AGENT_REMOTE_PYTHON"
DEFAULT_REMOTE_PYTHON = "python3"
CONNECT_TIMEOUT_S = 15
CONTROL_PERSIST_S = 600
DEFAULT_TIMEOUT_S = 900.0
EXIT_REMOTE = 255  # exit_status.REMOTE; ssh's own code for "could not connect / ssh failed"; a remote command never returns it
MAX_SOCKET_DIR = 50  # a Unix socket path is at most 104-108 bytes; ssh adds "/" + 40 (%C) + 17 (temp suffix)
REMOTE_FLAGS = ("--remote", "--remote-python", "--remote-dir", "--ssh-option")
_TARGET = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9._+-]*@)?(?:[A-Za-z0-9][A-Za-z0-9._-]*|\[[0-9A-Fa-f:.]+\])$")
_OPTION = re.compile(r"^[A-Za-z][A-Za-z0-9]*=[^\x00-\x1f\x7f]*$")


class RemoteError(Exception):
    """A remote option or the local ssh set-up is unusable (exit 2, nothing was run)."""


# --- pure argv builders -----------------------------------------------------------------------------------
def check_target(target: str) -> str:
    """``host`` or ``user@host`` (a name, an IPv4 address or ``[IPv6]``): never anything ssh could read as
    an option (``-oProxyCommand=...``) or that carries spaces or control characters."""
    if not _TARGET.match(target or "") or target.startswith("-"):
        raise RemoteError(f"--remote {target!r}: give HOST or USER@HOST (letters, digits, . _ - +)")
    return target


def check_options(options: Sequence[str]) -> List[str]:
    """``Key=value`` ssh options (``Port=2222``, ``IdentityFile=/k``), each later passed as ``-o Key=value``."""
    for option in options:
        if not _OPTION.match(option):
            raise RemoteError(f"--ssh-option {option!r}: give Key=value, as in ssh_config (e.g. Port=2222)")
    return list(options)


def env_options(environ: Mapping[str, str] = os.environ) -> List[str]:
    """The options in ``$HPC_AGENT_SSH_OPTS`` (shell words, e.g. ``"Port=2222 IdentityFile=/k"``)."""
    try:
        return check_options(shlex.split(environ.get(SSH_OPTS_ENV, "")))
    except ValueError as exc:
        raise RemoteError(f"${SSH_OPTS_ENV}: {exc}") from None


def remote_command(words: Sequence[str], remote_dir: Optional[str] = None) -> str:
    """The one string the remote shell runs: every word quoted exactly once; ``cd`` first with ``remote_dir``
    (relative to the login home, where ssh starts; a leading ``~/`` means the same)."""
    if any("\0" in w for w in words):
        raise RemoteError("an argument contains a NUL byte; no shell can carry it")
    command = "exec " + shlex.join(words)
    if remote_dir:
        if "\0" in remote_dir or "\n" in remote_dir:
            raise RemoteError(f"--remote-dir {remote_dir!r}: no NUL or newline")
        folder = remote_dir[2:] if remote_dir.startswith("~/") else remote_dir
        command = f"cd -- {shlex.quote(folder or '.')} && {command}"
    return command


def hpc_agent_words(python: str, command: str, args: Sequence[str]) -> List[str]:
    """``[python, -m, hpc_agent, command, *args]``: what runs on the login node."""
    if not python or "\0" in python:
        raise RemoteError("--remote-python: give the login node's Python (a path, or a name on its PATH)")
    return [python, "-m", "hpc_agent", command, *args]


def ssh_argv(target: str, command: str, socket_dir: Path, options: Sequence[str] = (),
             connect_timeout: int = CONNECT_TIMEOUT_S, persist_s: int = CONTROL_PERSIST_S) -> List[str]:
    """The local ssh argv. ``--`` ends ssh's options, so the destination is never read as one."""
    path = str(socket_dir).replace("%", "%%")  # ssh expands %-tokens in ControlPath; ours is %C only
    if any(c.isspace() or c == '"' for c in path):
        path = f'"{path}"' if '"' not in path else path  # a quote in the path: ensure_socket_dir refused it
    argv = ["ssh", "-T"]
    for option in check_options(options):  # first: ssh keeps the first value given for an option, so these win
        argv += ["-o", option]
    argv += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}",
             "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
             "-o", "ControlMaster=auto", "-o", f"ControlPath={path}/%C", "-o", f"ControlPersist={persist_s}"]
    return argv + ["--", check_target(target), command]


def close_argv(ssh: Sequence[str]) -> List[str]:
    """``ssh -O exit``: stop the shared connection that :func:`ssh_argv`'s options name (before ``--``)."""
    cut = list(ssh).index("--")
    return [*ssh[:cut], "-O", "exit", "--", ssh[cut + 1]]


def split_argv(argv: Sequence[str]) -> List[str]:
    """``argv`` without the remote options: what the login node's command gets. Abbreviated remote options
    are refused (argparse would accept ``--remote-p``; it must not reach the login node unseen)."""
    rest, words, i = [], list(argv), 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return rest + words[i:]
        name = word.split("=", 1)[0]
        if name in REMOTE_FLAGS:
            i += 1 if "=" in word else 2
            continue
        if name.startswith("--") and len(name) > 2 and any(f.startswith(name) for f in REMOTE_FLAGS):
            raise RemoteError(f"{name}: spell out the remote option ({', '.join(REMOTE_FLAGS)})")
        rest.append(word)
        i += 1
    return rest


# --- the control socket directory -------------------------------------------------------------------------
def socket_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$XDG_RUNTIME_DIR/hpc_agent-ssh`` (per-user, tmpfs), else ``~/.cache/hpc_agent/ssh``; a path too long
    for a Unix socket falls back to ``/tmp/hpc_agent-ssh-<uid>``."""
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        folder = Path(runtime) / "hpc_agent-ssh"
    else:
        cache = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
        folder = Path(cache) / "hpc_agent" / "ssh"
    if len(str(folder)) > MAX_SOCKET_DIR:
        folder = Path("/tmp") / f"hpc_agent-ssh-{os.getuid()}"
    return folder


def ensure_socket_dir(folder: Path) -> Path:
    """Create ``folder`` 0700 and check it is a directory (not a link) owned by us that nobody else can
    enter; a folder someone else made (a planted /tmp path) is refused, never used."""
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise RemoteError(f"{folder} (ssh control sockets) is not a directory owned by you: remove it")
    if st.st_mode & 0o077:
        os.chmod(folder, 0o700)  # ours, with a loose mode (a umask, a hand-made folder): tighten it
    if '"' in str(folder):
        raise RemoteError(f"{folder}: a double quote in the control socket path; set XDG_RUNTIME_DIR")
    return folder


# --- running ----------------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The remote options, the same on every command that supports them."""
    group = parser.add_argument_group("remote (run on a login node over ssh; docs/remote.md)")
    group.add_argument("--remote", metavar="USER@HOST", help="run this command on the login node USER@HOST over ssh")
    group.add_argument("--remote-python", metavar="PATH", default=None,
                       help=f"the login node's Python with hpc_agent installed (default ${REMOTE_PYTHON_ENV} "
                            f"or {DEFAULT_REMOTE_PYTHON})")
    group.add_argument("--remote-dir", metavar="DIR", default=None,
                       help="working directory on the login node (default: your home there)")
    group.add_argument("--ssh-option", action="append", default=[], metavar="KEY=VALUE",
                       help=f"an ssh -o option, repeatable (Port=2222, IdentityFile=...); also ${SSH_OPTS_ENV}")


class Remote:
    """One login node as the remote options name it; :meth:`run` runs a hpc-agent command there."""

    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str] = os.environ):
        self.target = check_target(args.remote)
        self.python = args.remote_python or environ.get(REMOTE_PYTHON_ENV) or DEFAULT_REMOTE_PYTHON
        self.remote_dir = args.remote_dir
        self.options = env_options(environ) + check_options(args.ssh_option or [])
        self.environ = environ

    def argv(self, command: str, args: Sequence[str]) -> List[str]:
        words = hpc_agent_words(self.python, command, args)
        folder = ensure_socket_dir(socket_dir(self.environ))
        return ssh_argv(self.target, remote_command(words, self.remote_dir), folder, self.options)

    def run(self, command: str, args: Sequence[str], stdin: Optional[bytes] = None, capture: bool = False,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> subprocess.CompletedProcess:
        """Run it; stdout/stderr go to ours unless ``capture`` (then bytes). A timeout kills the local ssh
        (the remote command gets SIGPIPE/SIGHUP when its connection closes) and reads as EXIT_REMOTE."""
        argv = self.argv(command, args)
        try:
            proc = subprocess.run(argv, input=stdin if stdin is not None else b"", timeout=timeout_s,
                                  stdout=subprocess.PIPE if capture else None,
                                  stderr=subprocess.PIPE if capture else None, check=False)
        except FileNotFoundError:
            raise RemoteError("ssh is not installed on this machine (OpenSSH client)") from None
        except subprocess.TimeoutExpired:
            print(f"hpc-agent: {command} on {self.target} did not finish within {timeout_s:.0f} s", file=sys.stderr)
            return subprocess.CompletedProcess(argv, EXIT_REMOTE, b"", b"")
        if proc.returncode == EXIT_REMOTE:
            said = proc.stderr.decode(errors="replace").strip()[-2000:] if capture and proc.stderr else ""
            print(f"hpc-agent: ssh to {self.target} failed (exit 255){': ' + said if said else ''}; check "
                  f"`ssh {self.target} true` works without a prompt (BatchMode: keys or an agent)", file=sys.stderr)
        return proc


    def close(self) -> None:
        """Stop the shared connection now instead of after ControlPersist (tests; a laptop going offline)."""
        argv = close_argv(self.argv("status", []))
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)


def forward(command: str, argv: Sequence[str], args: argparse.Namespace, stdin: Optional[bytes] = None,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Run ``command`` with ``argv`` minus the remote options on the login node; its exit code."""
    try:
        return Remote(args).run(command, split_argv(argv), stdin=stdin, timeout_s=timeout_s).returncode
    except RemoteError as exc:
        print(f"hpc-agent {command}: {exc}", file=sys.stderr)
        return 2


def local_argv(argv: Optional[Sequence[str]]) -> List[str]:
    """The words a command was given (``sys.argv[1:]`` when called as ``python -m hpc_agent.<command>``)."""
    return list(sys.argv[1:] if argv is None else argv)
