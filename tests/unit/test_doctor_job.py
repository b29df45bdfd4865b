"""doctor's job-python check (hpc_agent/checks/job_python.py): a fake runner for OK/FAIL/timeout (the real cluster:
tests/cluster/test_doctor_job_slurm.py)."""
from __future__ import annotations

import subprocess
import sys

from hpc_agent.checks import job_python
from hpc_agent.config.load import load_config
from hpc_agent.slurm.cli import Result, SlurmCLI, SlurmError
from hpc_agent.slurm.queries import own_jobs

HERE = "%d.%d" % sys.version_info[:2]


class FakeCLI:
    """Answers srun with a canned (rc, stdout, stderr), or times out; records every argv."""

    def __init__(self, rc=0, out="", err="", timeout=False):
        self.answer, self.timeout, self.calls = (rc, out, err), timeout, []

    def run(self, argv, check=True, timeout_s=None):
        self.calls.append((list(argv), timeout_s))
        if argv[0] == "srun" and self.timeout:
            raise SlurmError("srun timed out") from subprocess.TimeoutExpired(argv, timeout_s)
        rc, out, err = self.answer if argv[0] == "srun" else (0, "", "")
        return Result(list(argv), rc, out, err)


def _check(cli, *overrides):
    return job_python.check_job_python(cli, load_config("quickstart", list(overrides), env={}), repo="/opt/hpc agent")


def test_ok_names_the_node_and_the_python():
    cli = FakeCLI(out=f"HPC_AGENT_PROBE node1 {HERE} /venv/bin/python\n")
    level, name, detail = _check(cli, "slurm.python=/venv/bin/python", "slurm.partition=low", "slurm.qos=normal")
    assert (level, name) == ("OK", "job python") and "node1" in detail and "/venv/bin/python" in detail
    argv, timeout_s = cli.calls[0]
    assert argv[0] == "srun" and f"--immediate={job_python.IMMEDIATE_S}" in argv and timeout_s == job_python.TIMEOUT_S
    assert "--partition=low" in argv and "--qos=normal" in argv and "--time=1" in argv
    assert argv[-3:-1] == ["/venv/bin/python", "-c"] and "import os, socket, hpc_agent, submitit" in argv[-1]


def test_a_missing_interpreter_fails_naming_the_fix():
    err = ("slurmstepd-node1: error: execve(): /nonexistent/bin/python: No such file or directory\n"
           "srun: error: node1: task 0: Exited with exit code 2\n")
    level, _, detail = _check(FakeCLI(rc=2, err=err), "slurm.python=/nonexistent/bin/python")
    assert level == "FAIL"
    assert "slurm.python /nonexistent/bin/python does not exist on node1" in detail
    assert "set slurm.python to a venv on the shared file system" in detail


def test_an_interpreter_without_hpc_agent_fails_naming_the_module():
    err = "ModuleNotFoundError: No module named 'submitit'\nsrun: error: node2: task 0: Exited with exit code 1\n"
    level, _, detail = _check(FakeCLI(rc=1, err=err), "slurm.python=/usr/bin/python3")
    assert level == "FAIL" and "No module named 'submitit'" in detail and "node2" in detail


def test_another_python_minor_version_warns():
    level, _, detail = _check(FakeCLI(out="HPC_AGENT_PROBE node1 2.7 /usr/bin/python\n"))
    assert level == "WARN" and "same Python minor version" in detail


def test_a_timeout_warns_and_cancels_the_probe():
    cli = FakeCLI(timeout=True)
    level, _, detail = _check(cli)
    assert level == "WARN" and "not checked" in detail
    name = next(a for a in cli.calls[0][0] if a.startswith("--job-name="))[len("--job-name="):]
    assert cli.calls[-1][0] == ["scancel", *own_jobs(), f"--name={name}"]  # never another user's job


def test_no_free_node_warns():
    err = "srun: error: Unable to allocate resources: Immediate execution impossible, insufficient priority\n"
    level, _, detail = _check(FakeCLI(rc=1, err=err))
    assert level == "WARN" and "no node free" in detail


def test_an_srun_refusal_before_any_task_warns():
    level, _, detail = _check(FakeCLI(rc=1, err="srun: error: QOSMaxCpuPerJobLimit\n"))
    assert level == "WARN" and "could not start the probe" in detail


def test_pyxis_probe_passes_the_image_as_one_word_and_fails_without_the_plugin():
    image = "nvcr.io#nvidia/pytorch:24.05-py3@sha256:" + "a" * 64
    cli = FakeCLI(rc=255, err="srun: unrecognized option '--container-image=x'\n")
    level, _, detail = _check(cli, "container.runtime=pyxis", f"container.image={image}")
    argv = cli.calls[0][0]
    assert f"--container-image={image}" in argv and "--container-mounts=/opt/hpc agent:/opt/hpc agent" in argv
    assert argv[-3:-1] == ["python", "-c"] and "sys.path.insert(0, '/opt/hpc agent')" in argv[-1]
    assert level == "FAIL" and "no pyxis plugin" in detail


def test_apptainer_probe_runs_apptainer_exec_and_names_a_missing_apptainer():
    err = ("slurmstepd-node1: error: execve(): apptainer: No such file or directory\n"
           "srun: error: node1: task 0: Exited with exit code 2\n")
    cli = FakeCLI(rc=2, err=err)
    level, _, detail = _check(cli, "container.runtime=apptainer", "container.image=/img/pt.sif")
    argv = cli.calls[0][0]
    start = argv.index("apptainer")
    assert argv[start:start + 6] == ["apptainer", "exec", "--bind", "/opt/hpc agent:/opt/hpc agent", "/img/pt.sif",
                                     "python"]
    assert cli.calls[0][1] == job_python.CONTAINER_TIMEOUT_S
    assert level == "FAIL" and "apptainer is not installed on node1" in detail


def test_the_probe_is_an_argv_list_through_the_slurm_adapter(monkeypatch):
    """SlurmCLI runs it: argv list, timeout, srun on the allow-list (never shell=True)."""
    seen = {}

    def fake_run(argv, **kwargs):
        seen.update(kwargs, argv=argv)
        return subprocess.CompletedProcess(argv, 0, f"HPC_AGENT_PROBE n {HERE} x\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert _check(SlurmCLI())[0] == "OK"
    assert isinstance(seen["argv"], list) and seen["timeout"] == job_python.TIMEOUT_S and not seen.get("shell")


def test_doctor_finds_your_code_as_submit_will(tmp_path):
    """doctor's code check makes submit's snapshot plan: built-in -> nothing to copy; a package next to you ->
    OK naming it; a reference nobody can find -> FAIL naming train.workload and the fix."""
    from hpc_agent.config.load import load_config
    from hpc_agent.checks.job_python import check_code

    assert check_code(load_config("quickstart", [], env={}), str(tmp_path))[0] == "OK"
    (tmp_path / "my_model").mkdir()
    (tmp_path / "my_model" / "__init__.py").write_text("")
    (tmp_path / "my_model" / "model.py").write_text("def build(cfg, device):\n    raise NotImplementedError\n")
    cfg = load_config("quickstart", ["train.workload=my_model.model:build"], env={})
    status, name, detail = check_code(cfg, str(tmp_path))
    assert (status, name) == ("OK", "code") and str(tmp_path / "my_model") in detail and "2 files" in detail
    missing = load_config("quickstart", ["train.workload=nowhere_pkg_x.model:build"], env={})
    status, _, detail = check_code(missing, str(tmp_path))
    assert status == "FAIL" and "train.workload" in detail
    opted_out = load_config("quickstart", ["train.workload=nowhere_pkg_x.model:build", "train.snapshot_code=false"], env={})
    assert check_code(opted_out, str(tmp_path))[0] == "OK"


def test_check_code_says_why_nothing_is_snapshotted(tmp_path):
    """Issue 44: with train.snapshot_code=true (the default) and a built-in workload, doctor said
    "train.snapshot_code=false: the job imports your code live" (an inverted condition)."""
    from hpc_agent.config.load import load_config
    from hpc_agent.checks.job_python import check_code

    builtin = check_code(load_config("quickstart", [], env={}), str(tmp_path))
    assert builtin == ("OK", "code", "built-in workload: nothing of yours to snapshot")
    off = load_config("quickstart", ["train.workload=nowhere_pkg_x.model:build", "train.snapshot_code=false"], env={})
    assert check_code(off, str(tmp_path)) == ("OK", "code", "train.snapshot_code=false: the job imports your code live")
    off_builtin = load_config("quickstart", ["train.snapshot_code=false"], env={})
    assert "snapshot_code=false" in check_code(off_builtin, str(tmp_path))[2]
