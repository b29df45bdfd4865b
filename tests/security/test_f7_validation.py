"""Finding 7 of issue 42: config values that passed validation but should not.

Each test reproduces the attack as the issue states it, mostly through the real command line
(``python -m hpc_agent.submit CONFIG``, in a subprocess, with a fake ``sbatch`` first on PATH that keeps the
job script it is given), and asserts: exit 2, no traceback, a message naming the field and the fix, nothing
left in the runs root. Where a job script is made, it must pass ``bash -n``, and for the activation-line and
environment cases it is run under bash with stub ``srun``/``scontrol``/``touch`` on PATH: it must reach srun,
with exactly the intended words, and run nothing injected.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from hpc_agent.config.fields import INT_LIMIT, OWNED_OPTIONS
from hpc_agent.config.load import _field_types, build_config
from hpc_agent.config.problems import ConfigError
from hpc_agent.config.schema import SECTIONS
from hpc_agent.core.shell_syntax import bash_syntax_problem
from hpc_agent.state.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]
CANARY = "PWNED"

FAKE_SBATCH = """#!/bin/bash
# keeps the job script it was given, answers as sbatch does (or refuses, when $SBATCH_REFUSE says so)
for last; do :; done
cp "$last" "$DUMP/job.sh"
if [ -n "${SBATCH_REFUSE:-}" ]; then echo "sbatch: error: $SBATCH_REFUSE" >&2; exit 1; fi
echo "Submitted batch job 4242"
"""
STUB_SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$DUMP/srun.argv"
"""
STUB_RECORD = """#!/bin/bash
echo "$(basename "$0") $*" >> "$DUMP/executed"
"""


@pytest.fixture
def sandbox(tmp_path):
    """A runs root, a dump folder, fake Slurm commands, and a clean environment for the subprocesses."""
    bin_dir, dump, runs = tmp_path / "bin", tmp_path / "dump", tmp_path / "runs"
    for folder in (bin_dir, dump, runs):
        folder.mkdir()
    for name, body in (("sbatch", FAKE_SBATCH), ("srun", STUB_SRUN), ("scontrol", STUB_RECORD),
                       ("touch", STUB_RECORD), ("squeue", STUB_RECORD), ("sacct", STUB_RECORD)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_AGENT_", "SLURM_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT), DUMP=str(dump))
    return {"tmp": tmp_path, "bin": bin_dir, "dump": dump, "runs": runs, "env": env}


def write_config(sandbox, text: str, name: str = "attack.yaml") -> Path:
    path = sandbox["tmp"] / name
    path.write_text(f"run:\n  name: f7\n  runs_root: {sandbox['runs']}\n" + text)
    return path


def submit(sandbox, config: Path | str, *overrides: str, dry_run: bool = False,
           env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "hpc_agent.submit", str(config), *overrides, "--executor", "slurm"]
    return subprocess.run(argv + (["--dry-run"] if dry_run else []), cwd=sandbox["tmp"], capture_output=True,
                          text=True, timeout=120, env={**sandbox["env"], **(env or {})})


def assert_refused(res: subprocess.CompletedProcess, sandbox, key: str, *fix: str) -> None:
    """Exit 2, no traceback, the field and its fix named, and nothing left in the runs root."""
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr + res.stdout
    assert key in res.stderr, res.stderr
    for words in fix:
        assert words in res.stderr, (words, res.stderr)
    assert list(sandbox["runs"].iterdir()) == [], list(sandbox["runs"].iterdir())
    assert not (sandbox["dump"] / "job.sh").exists(), "sbatch ran"


def run_job_script(sandbox, script: str) -> Dict[str, object]:
    """Run a job script under bash as the batch shell would, with stub srun/scontrol/touch first on PATH, in an
    empty folder: what srun got (None if it was never reached), what else ran, what appeared."""
    work = sandbox["tmp"] / "node"
    work.mkdir(exist_ok=True)
    (work / "job.sh").write_text(script)
    env = {"PATH": sandbox["env"]["PATH"], "DUMP": str(sandbox["dump"]), "SLURM_JOB_ID": "4242",
           "HOME": str(work)}
    res = subprocess.run(["bash", "job.sh"], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    argv_file = sandbox["dump"] / "srun.argv"
    executed = sandbox["dump"] / "executed"
    out = {"rc": res.returncode, "stderr": res.stderr,
           "srun": argv_file.read_bytes().decode().split("\0")[:-1] if argv_file.exists() else None,
           "executed": executed.read_text() if executed.exists() else "",
           "files": sorted(p.name for p in work.iterdir() if p.name != "job.sh")}
    for leftover in (argv_file, executed):
        if leftover.exists():
            leftover.unlink()
    return out


def dry_run_script(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 0, res.stderr[-2000:]
    text = res.stdout
    start = text.index("# Job script (sbatch)\n") + len("# Job script (sbatch)\n")
    return text[start:text.index("# Dry run: nothing was created or submitted.")]


def leaves_of(section: str, kind: type) -> List[str]:
    """Every field of ``kind`` (int or float, optional or not) in a section."""
    out = []
    for name, tp in _field_types(SECTIONS[section]).items():
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if tp is kind or (typing.get_origin(tp) is typing.Union and args == [kind]):
            out.append(f"{section}.{name}")
    return out


def nested(key: str, value) -> dict:
    head, *rest = key.split(".")
    return {head: nested(".".join(rest), value)} if rest else {head: value}


# --- a lone surrogate -----------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["yaml", "override"])
def test_lone_surrogate_is_a_config_problem_and_leaves_no_run_dir(sandbox, where):
    """Before: ``"\\ud800"`` passed validation, then writing config.yaml raised UnicodeEncodeError with a
    traceback, after the run dir (tb/, checkpoints/) was made."""
    if where == "yaml":
        config = write_config(sandbox, 'train:\n  command: [python, "train.py", "\\ud800"]\n')
        res = submit(sandbox, config)
    else:
        res = submit(sandbox, write_config(sandbox, ""), 'train.command=[python, train.py, "\\ud800"]')
    assert_refused(res, sandbox, "train.command[2]", "lone surrogate", "write the character itself")


def test_a_failure_after_the_run_dir_is_made_removes_it(sandbox, monkeypatch, tmp_path, capsys):
    """Whatever fails between making the run dir and sbatch (here: writing config.yaml, as the surrogate did),
    the run dir goes again and the user gets a message, not a traceback."""
    from hpc_agent import submit as submit_cmd

    def encode_error(*args, **kwargs):
        raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")

    monkeypatch.setattr(submit_cmd, "write_run_config", encode_error)
    rc = submit_cmd.main(["quickstart", "--executor", "local", f"run.runs_root={sandbox['runs']}"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "UnicodeEncodeError" in err and "Nothing was submitted" in err and "Traceback" not in err
    assert list(sandbox["runs"].iterdir()) == []


def test_sbatch_refusing_leaves_no_run_dir_and_the_ledger_says_why(sandbox):
    res = submit(sandbox, write_config(sandbox, ""), env={"SBATCH_REFUSE": "invalid partition specified: nope"})
    assert res.returncode == 3 and "Traceback" not in res.stderr
    assert "invalid partition specified" in res.stderr
    assert sorted(p.name for p in sandbox["runs"].iterdir()) == ["ledger.sqlite"]  # no run dir
    ledger = Ledger.in_runs_root(sandbox["runs"])
    (run,) = ledger.runs()
    (sub,) = ledger.submissions(run.run_id)
    assert run.phase == "stopped" and sub.job_id is None and "invalid partition" in sub.error
    ledger.close()
    # a submit that sbatch accepts keeps everything
    ok = submit(sandbox, write_config(sandbox, ""))
    assert ok.returncode == 0, ok.stderr[-2000:]
    made = [p for p in sandbox["runs"].iterdir() if p.is_dir()]
    assert len(made) == 1 and (made[0] / "config.yaml").is_file() and (made[0] / "slurm").is_dir()


# --- non-finite floats ----------------------------------------------------------------------------------

def test_nan_and_inf_learning_rate_and_grad_clip_are_refused(sandbox):
    config = write_config(sandbox, "train:\n  lr: .nan\n  grad_clip: .inf\n")
    res = submit(sandbox, config, "train.weight_decay=nan")  # a string the loader coerces to a float
    assert_refused(res, sandbox, "train.lr", "train.grad_clip", "train.weight_decay", "a finite number")
    assert "3 problems" in res.stderr  # every problem at once


FLOAT_FIELDS = [key for section in SECTIONS for key in leaves_of(section, float)]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "nan", "1e999"])
def test_every_float_field_refuses_non_finite_values(value):
    assert len(FLOAT_FIELDS) >= 20, FLOAT_FIELDS
    for key in FLOAT_FIELDS:
        with pytest.raises(ConfigError) as info:
            build_config([nested(key, value)])
        found = {p.key: p.expected for p in info.value.problems}
        assert key in found, (key, found)
    with pytest.raises(ConfigError) as info:  # inside a mapping of floats too
        build_config([{"faults": {"gpu_memory_gib_by_partition": {"gpu": value}}}])
    assert "faults.gpu_memory_gib_by_partition.gpu" in {p.key for p in info.value.problems}


# --- integers out of range ------------------------------------------------------------------------------

def test_a_29_digit_integer_from_a_string_is_refused(sandbox):
    config = write_config(sandbox, 'train:\n  max_steps: "12345678901234567890123456789"\n')
    res = submit(sandbox, config, 'train.seed="99999999999999999999999999999"')
    assert_refused(res, sandbox, "train.max_steps", "train.seed", str(INT_LIMIT), "2**32-1")


INT_FIELDS = [key for section in SECTIONS for key in leaves_of(section, int)]


def test_every_int_field_has_a_bound():
    assert len(INT_FIELDS) >= 40, INT_FIELDS
    for key in INT_FIELDS:
        for value in (str(10 ** 28), -(10 ** 28), 2 ** 53 + 1):
            with pytest.raises(ConfigError) as info:
                build_config([nested(key, value)])
            assert key in {p.key for p in info.value.problems}, (key, value)
    with pytest.raises(ConfigError) as info:
        build_config([{"train": {"seed": -1}}])
    assert "0 to 4294967295" in info.value.render()
    with pytest.raises(ConfigError) as info:
        build_config([{"slurm": {"signal_lead_s": 70000}}])
    assert "65535" in info.value.render()


# --- extra_sbatch overriding what hpc_agent owns ---------------------------------------------------------

ATTACKS = {"output": "'/tmp/elsewhere.log'", "signal": "KILL@1", "open-mode": "truncate", "array": "0-3",
           "outp": "/tmp/elsewhere.log", "sig": "KILL@1", "open": "truncate", "arr": "0-3",
           "requeue": "''", "job-name": "innocent", "comment": "'hpc_agent run_id=other'", "parsable": "null",
           "wrap": "'true'", "chdir": "/tmp", "error": "/tmp/e.log", "no-requeue": "null", "wait": "null",
           "test-only": "''", "partition": "other", "exclude": "''", "time": "'99:00:00'"}


@pytest.mark.parametrize("option", sorted(ATTACKS))
def test_extra_sbatch_cannot_set_an_option_hpc_agent_owns(sandbox, option):
    config = write_config(sandbox, f"slurm:\n  extra_sbatch:\n    {option}: {ATTACKS[option]}\n")
    res = submit(sandbox, config)
    owned = next(name for name in OWNED_OPTIONS if name.startswith(option))
    setting = OWNED_OPTIONS[owned].split(" (")[0]
    assert_refused(res, sandbox, f"slurm.extra_sbatch.{option}", f"--{owned}", "remove it from slurm.extra_sbatch",
                   setting)


def test_every_option_in_the_job_script_is_owned_and_listed_in_the_docs(sandbox):
    """The list is the full one: every #SBATCH option hpc_agent writes (with GPUs, a partition, an exclude...)
    is refused in extra_sbatch, except wckey (submitit's default, for the user to change), and docs/config.md
    lists every owned option."""
    config = write_config(sandbox, "slurm:\n  gpus_per_node: 1\n  gpu_memory_gib: 80\n  partition: gpu\n"
                                   "  account: a\n  qos: q\n  constraint: c\n  exclude: node1\n")
    script = dry_run_script(submit(sandbox, config, "--force", dry_run=True))
    options = {line.split()[1][2:].split("=")[0] for line in script.splitlines() if line.startswith("#SBATCH")}
    assert "signal" in options and "output" in options and "gpus-per-node" in options
    assert options - set(OWNED_OPTIONS) == {"wckey"}, options - set(OWNED_OPTIONS)
    docs = (ROOT / "docs" / "config.md").read_text()
    missing = [name for name in OWNED_OPTIONS if f"`{name}`" not in docs]
    assert not missing, f"docs/config.md does not list the owned sbatch options {missing}"


# --- an environment value on the srun line ---------------------------------------------------------------

INJECT = f"; touch {CANARY}1 $(touch {CANARY}2) `touch {CANARY}3`"


def test_environment_values_reach_the_srun_line_quoted_once(sandbox):
    """$HPC_AGENT_RUNS (run.runs_root: srun --output and submitit's folder) and ${oc.env:PYBIN} (slurm.python:
    the program srun starts) carry shell payloads: the script srun gets them as single words, and runs
    nothing else."""
    runs = sandbox["runs"] / f"r{INJECT}"
    python = f"/opt/py{INJECT}/bin/python"
    config = write_config(sandbox, "slurm:\n  python: ${oc.env:PYBIN}\n  env_in_metadata: [python, run.runs_root]\n")
    config.write_text(config.read_text().replace(f"  runs_root: {sandbox['runs']}\n", ""))
    res = submit(sandbox, config, env={"HPC_AGENT_RUNS": str(runs), "PYBIN": python})
    assert res.returncode == 0, res.stderr[-2000:]
    script = (sandbox["dump"] / "job.sh").read_text()
    assert bash_syntax_problem(script) is None
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    ran = run_job_script(sandbox, script)
    assert ran["srun"] == ["--unbuffered", "--output", f"{run_dir}/slurm/%j_%t_log.out", "--kill-on-bad-exit=1",
                           python, "-u", "-m", "submitit.core._submit", f"{run_dir}/slurm"], ran
    assert ran["executed"] == "" and not [f for f in ran["files"] if CANARY in f], ran
    assert ran["rc"] == 0, ran["stderr"]


@pytest.mark.parametrize("variable,key", [("HPC_AGENT_RUNS", "run.runs_root"), ("PYBIN", "slurm.python")])
def test_an_environment_value_with_a_newline_is_refused(sandbox, variable, key):
    config = write_config(sandbox, "slurm:\n  python: ${oc.env:PYBIN}\n  env_in_metadata: [python, run.runs_root]\n")
    config.write_text(config.read_text().replace(f"  runs_root: {sandbox['runs']}\n", ""))
    env = {"HPC_AGENT_RUNS": str(sandbox["runs"]), "PYBIN": "/usr/bin/python3"}
    env[variable] = env[variable] + f"\ntouch {CANARY}"
    res = submit(sandbox, config, env=env)
    assert_refused(res, sandbox, key, "a newline")


# --- activation lines that swallow the srun line ----------------------------------------------------------

SWALLOWERS = {
    "cat <<\\EOF": "here-document", "cat <<.": "here-document", "cat <<@": "here-document",
    "cat <<'EOF'": "here-document", "cat <<-EOF": "here-document", "echo 'unclosed": "never closed",
    'echo "unclosed': "never closed", "echo $(unclosed": "never closed",
    "echo `unclosed": "never closed", 'echo "$(unclosed': "never closed", "if true; then": "bash parses on its own",
    "{": "bash parses on its own",
}


@pytest.fixture
def good_script(sandbox):
    """A real job script with harmless activation lines, from submit --dry-run."""
    config = write_config(sandbox, "profile:\n  activate:\n    - export HPC_AGENT_TEST_ACTIVATED=1\n")
    return dry_run_script(submit(sandbox, config, dry_run=True))


@pytest.mark.parametrize("line", sorted(SWALLOWERS))
def test_an_activation_line_that_would_swallow_srun_is_refused(sandbox, good_script, line):
    # the attack is real: spliced into the job script as written, the job ends 0 without ever reaching srun
    spliced = good_script.replace("export HPC_AGENT_TEST_ACTIVATED=1\n", line + "\n")
    ran = run_job_script(sandbox, spliced)
    assert ran["srun"] is None, (line, ran)
    # and submit refuses it: exit 2, naming the line and why, nothing made, sbatch never run
    quoted = "'" + line.replace("'", "''") + "'"
    config = write_config(sandbox, f"profile:\n  activate:\n    - {quoted}\n")
    assert_refused(submit(sandbox, config), sandbox, "profile.activate[0]", SWALLOWERS[line])


def test_activation_lines_that_close_on_their_line_run_and_reach_srun(sandbox, good_script):
    lines = ["export A=1", "cat <<< here-string-is-fine > /dev/null", "if true; then export B=2; fi",
             "echo \"it's $(echo ok)\" > /dev/null  # a comment's 'quote", "f() { :; }; f"]
    items = "".join("    - '" + line.replace("'", "''") + "'\n" for line in lines)
    res = submit(sandbox, write_config(sandbox, f"profile:\n  activate:\n{items}"))
    assert res.returncode == 0, res.stderr[-2000:]
    script = (sandbox["dump"] / "job.sh").read_text()
    assert bash_syntax_problem(script) is None
    ran = run_job_script(sandbox, script)
    assert ran["srun"] is not None and ran["srun"][-3:-1] == ["-m", "submitit.core._submit"] and ran["executed"] == "" and ran["rc"] == 0, ran
