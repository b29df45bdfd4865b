"""``submit --remote USER@LOGIN CONFIG [key=value ...]``: validate here, submit on the login node.

The laptop loads and validates the config (every problem at once, exit 2, nothing sent), then sends the
*resolved* config as YAML on the ssh connection's stdin to ``python3 -m hpc_agent submit - ...`` on the
login node, which reads it from stdin (:func:`config_from_stdin`) and submits as usual. Overrides are
already in the resolved YAML, so they are not sent again; the other flags (``--wait``, ``--executor``,
``--dry-run``, ...) are. No file is copied by path, so no remote path is ever built from a local value.

What stays on the login node side: ``run.runs_root`` (relative to ``--remote-dir`` or the login home, and the
login node's ``$HPC_AGENT_RUNS``, never the laptop's), project ``sbatch_templates/`` and the code snapshot of
``train.workload: pkg.mod:build`` (taken from the login node's working directory: the code must be there).
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import List, Sequence

from hpc_agent.config.load import RUNS_ENV, load_config, to_yaml
from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.yaml_safe import MAX_BYTES
from hpc_agent.remote import ssh

STDIN = "-"


def remote_args(argv: Sequence[str], args: argparse.Namespace) -> List[str]:
    """The login node's submit arguments: ``-`` for the config, no overrides (they are in the YAML), the
    remote options dropped, every other flag as typed. Positionals are taken out by their first occurrence."""
    words = ssh.split_argv(argv)
    for positional in [args.config, *args.overrides]:
        if positional in words:
            words.remove(positional)
    return [STDIN, *words]


def submit_remote(args: argparse.Namespace, argv: Sequence[str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != RUNS_ENV}  # the login node's runs root, not the laptop's
    try:
        cfg = load_config(args.config, args.overrides, env=env, profile=getattr(args, "profile", None))  # profiles/ here
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        print("Nothing was sent to the login node. Fix the values above and run the command again.", file=sys.stderr)
        return 2
    timeout = args.wait_timeout + 600 if getattr(args, "wait", False) else ssh.DEFAULT_TIMEOUT_S
    try:
        return ssh.forward("submit", remote_args(argv, args), args, stdin=to_yaml(cfg).encode(), timeout_s=timeout)
    except ssh.RemoteError as exc:
        print(f"hpc-agent submit: {exc}", file=sys.stderr)
        return 2


def config_from_stdin(stream=None) -> str:
    """The login-node half: the YAML on stdin, bounded like any config file, into a private temporary
    directory (0700: its ``sbatch_templates/`` cannot be planted by another user); removed at exit."""
    stream = stream if stream is not None else sys.stdin.buffer
    data = stream.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigError([Problem("CONFIG", "-", f"a config on stdin of at most {MAX_BYTES} bytes")])
    if not data.strip():
        raise ConfigError([Problem("CONFIG", "-", "a YAML config on stdin (submit --remote sends one)")])
    folder = tempfile.mkdtemp(prefix="hpc_agent-submit-")
    atexit.register(shutil.rmtree, folder, True)
    path = Path(folder) / "config.yaml"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return str(path)
