"""Malformed and hostile configs through the real CLI: exit 2, the location named, never a traceback.

Each case is a config file (bytes, or a non-file made by a setup function) plus overrides, run through
``python -m hpc_agent.submit CFG --dry-run``: in-process ``main()`` for the table, a few as real
subprocesses below. "Location" is ``file:line:column`` for anything the YAML reader refuses and the key
path for a value that is valid YAML but a bad config.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional

import pytest

from hpc_agent import submit
from hpc_agent.config.yaml_safe import MAX_BYTES, MAX_DEPTH

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-token-value"


class Case(NamedTuple):
    name: str
    text: Optional[bytes]                 # the file's bytes (None: ``make`` builds the path)
    where: str                            # what the output must name: "{f}:L:C" (f = the file) or a key path
    overrides: List[str] = []
    make: Optional[Callable[[Path], Path]] = None


def _fifo(d: Path) -> Path:
    os.mkfifo(d / "cfg.yaml")
    return d / "cfg.yaml"


def _dir(d: Path) -> Path:
    (d / "cfg.yaml").mkdir()
    return d / "cfg.yaml"


def _loop(d: Path) -> Path:
    (d / "a.yaml").symlink_to(d / "b.yaml")
    (d / "b.yaml").symlink_to(d / "a.yaml")
    return d / "a.yaml"


def _huge(d: Path) -> Path:
    path = d / "cfg.yaml"
    with open(path, "wb") as f:  # 100 MB, sparse: the reader must refuse it from its size alone
        f.truncate(100 * 1000 * 1000)
    return path


BOMB = b"".join([b'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'] +
                [f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n".encode() for p, c in zip("abcdefgh", "bcdefghi")])

CASES = [
    Case("unclosed flow list", b"train:\n  lr: [1, 2\n", "{f}:3:1"),
    Case("bad indentation", b"train:\n  lr: 1\n   max_steps: 2\n", "{f}:3:13"),
    Case("tab indentation", b"train:\n\tlr: 1\n", "{f}:2:1"),
    Case("unterminated quote", b"run:\n  name: 'abc\n", "{f}:3:1"),
    Case("billion laughs", BOMB, "{f}:1:4"),
    Case("undefined alias", b"train:\n  lr: *x\n", "{f}:2:7"),
    Case("merge key from an anchor", b"base: &b {lr: 1}\ntrain:\n  <<: *b\n", "{f}:1:7"),
    Case("duplicate top-level key", b"train: {}\nslurm: {}\ntrain: {}\n", "{f}:3:1"),
    Case("duplicate nested key", b"train:\n  lr: 1\n  lr: 2\n", "{f}:3:3"),
    Case("duplicate key in a flow mapping", b"train: {lr: 1, lr: 2}\n", "{f}:1:16"),
    Case("top level is a list", b"- train\n- slurm\n", "{f}:1:1"),
    Case("top level is a scalar", b"just a string\n", "{f}:1:1"),
    Case("two documents", b"train: {}\n---\nslurm: {}\n", "{f}:2:1"),
    Case("latin-1 byte", b"run:\n  name: caf\xe9\n", "{f}:2:12"),
    Case("UTF-16 file", "run: {}\n".encode("utf-16"), "{f}:1:1"),
    Case("NUL byte", b"run:\n  name: a\x00b\n", "{f}:2:10"),
    Case("escape character", b"run:\n  name: \x1b[31mred\n", "{f}:2:9"),
    Case("python object tag", b"run:\n  name: !!python/object/apply:os.system ['touch /tmp/hpc_agent_pwned']\n",
         "{f}:2:9"),
    Case("python name tag", b"train:\n  lr: !!python/name:os.system\n", "{f}:2:7"),
    Case("binary tag", b"run:\n  name: !!binary aGVsbG8=\n", "{f}:2:9"),
    Case("custom tag", b"slurm:\n  account: !env SECRET\n", "{f}:2:12"),
    Case("set tag", b"slurm: !!set {a, b}\n", "{f}:1:8"),
    Case("list as a key", b"? [a, b]\n: 1\n", "{f}:1:3"),
    Case("nesting too deep", b"a: " + b"[" * (MAX_DEPTH + 200) + b"]" * (MAX_DEPTH + 200) + b"\n", "{f}:1:"),
    Case("integer beyond 64 bits", b"train:\n  max_steps: 123456789012345678901234\n", "{f}:2:14"),
    Case("100 MB file", None, f"{MAX_BYTES} bytes", make=_huge),
    Case("directory", None, "a directory", make=_dir),
    Case("FIFO", None, "a FIFO", make=_fifo),
    Case("symlink loop", None, "symbolic link loop", make=_loop),
    Case("missing file", None, "CONFIG", make=lambda d: d / "no-such-dir" / "cfg.yaml"),
    Case("unknown key", b"train:\n  lrr: 1\n", "train.lrr"),
    Case("wrong type", b"train:\n  max_steps: lots\n", "train.max_steps"),
    Case("null key", b"~: 1\n", "None"),
    Case("section is a list", b"train: [1, 2]\n", "train"),
    Case("key reference interpolation", b"run:\n  name: ${train.lr}\n", "run.name"),
    Case("interpolation bomb", b"slurm:\n  extra_sbatch:\n    a: xxxxxxxx\n    b: ${.a}${.a}${.a}\n    c: ${.b}${.b}\n",
         "slurm.extra_sbatch.b"),
    Case("unset environment variable", b"data:\n  path: ${oc.env:HPC_AGENT_TEST_UNSET_VAR}\n", "data.path"),
    Case("secret in #SBATCH", b"slurm:\n  account: ${oc.env:HPC_AGENT_TEST_SECRET}\n", "slurm.account"),
    Case("secret in the job name", b"run:\n  name: ${oc.env:HPC_AGENT_TEST_SECRET}\n", "run.name"),
    Case("value of 5000 characters", b"data:\n  path: /" + b"x" * 5000 + b"\n", "data.path"),
    Case("forged env_origin record", b"env_origin: [1, 2]\n", "env_origin"),
    Case("override without '='", b"{}\n", "override", overrides=["train.lr"]),
    Case("override with an empty key", b"{}\n", "override", overrides=["=5"]),
    Case("override with a bad key", b"{}\n", "override", overrides=["train..lr=1"]),
    Case("override with an alias", b"{}\n", "override train.lr=:1:1", overrides=["train.lr=*a"]),
    Case("override with an anchor list", b"{}\n", "override slurm.exclude=:1:2", overrides=["slurm.exclude=[&a x, *a]"]),
    Case("override with a syntax error", b"{}\n", "override train.lr=:1:", overrides=["train.lr=[1,"]),
    Case("override with a python tag", b"{}\n", "override run.name=:1:1",
         overrides=["run.name=!!python/object/apply:os.system [id]"]),
    Case("override nested too deep", b"{}\n", "override train.lr=:1:", overrides=["train.lr=" + "[" * 100]),
]


def _config_path(case: Case, tmp_path: Path) -> Path:
    if case.make is not None:
        return case.make(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_bytes(case.text or b"")
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_config_exits_2_naming_the_location(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HPC_AGENT_TEST_SECRET", SECRET)
    monkeypatch.delenv("HPC_AGENT_TEST_UNSET_VAR", raising=False)
    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    path = _config_path(case, tmp_path)
    start = time.monotonic()
    rc = submit.main([str(path), *case.overrides, "--dry-run", "--executor", "local"])
    out, err = capsys.readouterr()
    assert rc == submit.EXIT_CONFIG, (out, err)
    assert case.where.format(f=path) in err, err
    assert "Traceback" not in out + err
    assert SECRET not in out + err  # an environment value is never echoed back
    assert "Nothing was submitted" in err
    assert time.monotonic() - start < 10, "a hostile config must be refused quickly"
    assert not Path("/tmp/hpc_agent_pwned").exists()


def test_the_table_has_at_least_30_cases_and_covers_each_threat():
    names = " ".join(c.name for c in CASES)
    assert len(CASES) >= 30
    for threat in ("billion laughs", "syntax", "duplicate", "tab", "top level", "latin-1", "100 MB", "python"):
        assert threat in names


@pytest.mark.parametrize("text", [b"", b"# only a comment\n\n# another\n", b"\xef\xbb\xbfrun:\n  name: bom\n",
                                  b"run:\r\n  name: crlf\r\nslurm:\r\n  time: 1:30:00\r\n"],
                         ids=["empty", "only comments", "UTF-8 BOM", "CRLF and a base-60 looking time"])
def test_harmless_oddities_load(text, tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_bytes(text)
    rc = submit.main([str(path), "--dry-run", "--executor", "local"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "# Dry run" in out
    if b"1:30:00" in text:  # YAML 1.1 would have read 1:30:00 as the integer 5400
        assert "time: '1:30:00'" in out or 'time: "1:30:00"' in out or "time: 1:30:00" in out


SUBPROCESS_CASES = [c for c in CASES if c.name in
                    ("billion laughs", "unclosed flow list", "python object tag", "100 MB file", "FIFO",
                     "override with an alias")]


@pytest.mark.parametrize("case", SUBPROCESS_CASES, ids=[c.name for c in SUBPROCESS_CASES])
def test_real_process_exits_2_without_traceback(case, tmp_path):
    path = _config_path(case, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("HPC_AGENT_RUNS", None)
    proc = subprocess.run([sys.executable, "-m", "hpc_agent.submit", str(path), *case.overrides, "--dry-run",
                           "--executor", "local"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr
    assert case.where.format(f=path) in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_sweep_file_and_chaos_schedule_use_the_same_reader(tmp_path):
    from hpc_agent.chaos.schedule import ScheduleError, load_schedule_text
    from hpc_agent.config.problems import ConfigError
    from hpc_agent.sweep.__main__ import load_spec

    sweep = tmp_path / "sweep.yaml"
    sweep.write_bytes(BOMB)
    with pytest.raises(ConfigError) as info:
        load_spec(str(sweep), None, None, None)
    assert f"{sweep}:1:4" in info.value.render() and "anchor" in info.value.render()
    with pytest.raises(ScheduleError, match=r"schedule:1:3: .*anchor"):
        load_schedule_text("- &f {kind: nan, at_s: 1}\n- *f\n")
