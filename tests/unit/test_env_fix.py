"""``env_fix``: the evidence of an ``env_error`` -> the fix it calls for, in the decision's reason. One row per kind of
line (as the classifier's evidence carries it: ``file:line: text``, or bare), then the order among several lines."""
from __future__ import annotations

import pytest

from hpc_agent.config.load import build_config
from hpc_agent.policy.decide import STOP, Situation, decide
from hpc_agent.policy.env_fix import env_fix

# (id, evidence line, the words the fix must hold, words it must not)
TABLE = [
    ("op-build-ninja", "slurm/9_0_log.out:88: ninja: build stopped: subcommand failed.",
     ["`python -m hpc_agent.prepare`", "login node", "prebuilds the ops"], []),
    ("op-build-extension", "9_0_log.out:90: RuntimeError: Error building extension 'fused_adam'",
     ["DeepSpeed op fused_adam", "`python -m hpc_agent.prepare`", "login node"], []),
    ("op-not-prepared-names-its-command",
     "9_0_log.out:4: [hpc_agent] environment problem: DeepSpeed op deepspeed_shm_comm is not prepared, and a job never "
     "compiles one. Fix: `/shared/venv/bin/python -m hpc_agent.prepare`, then resubmit. Why: no manifest; exiting 72",
     ["DeepSpeed op deepspeed_shm_comm", "`/shared/venv/bin/python -m hpc_agent.prepare`", "login node"], []),
    ("hpc-agent-extra-missing",
     "9_0_log.out:4: [hpc_agent] environment problem: the classifier workload needs scikit-learn, which is not "
     "installed: pip install 'hpc_agent[classifier]'; exiting 72",
     ["`pip install 'hpc_agent[classifier]'`", "job's environment"], ["prepare"]),
    ("srun-execve", "slurmstepd: error: execve(): torchrun: No such file or directory",
     ["`torchrun`", "`slurm.python`", "`profile.activate`", "`slurm.template`"], []),
    ("shell-command-not-found", "/var/spool/slurmd/job00009/slurm_script: line 12: torchrun: command not found",
     ["`torchrun`", "`slurm.python`", "`profile.activate`"], []),
    ("python-popen-missing-binary", "FileNotFoundError: [Errno 2] No such file or directory: 'deepspeed'",
     ["`deepspeed`", "`slurm.python`", "`profile.activate`"], []),
    ("python-popen-missing-binary-in-a-bin-folder",
     "FileNotFoundError: [Errno 2] No such file or directory: '/opt/venv/bin/deepspeed'", ["`deepspeed`"], []),
    ("missing-package", "9_0_log.out:7: ModuleNotFoundError: No module named 'einops'",
     ["`pip install einops`", "job's environment"], []),
    ("missing-package-other-distribution-name", "ModuleNotFoundError: No module named 'sklearn'",
     ["`pip install scikit-learn`", "module sklearn"], []),
    ("driver-too-old", "RuntimeError: The NVIDIA driver on your system is too old (found version 11040). Please "
     "update your GPU driver", ["CUDA 11.4", "CUDA module", "`profile.activate`", "torch build"], []),
    ("cuda-driver-insufficient", "RuntimeError: CUDA error: CUDA driver version is insufficient for CUDA runtime "
     "version", ["CUDA module", "torch build for the driver's CUDA"], []),
    ("missing-shared-library", "ImportError: libcudnn.so.8: cannot open shared object file: No such file or directory",
     ["`libcudnn.so.8`", "`profile.activate`"], ["not found in the job's environment"]),
]


@pytest.mark.parametrize("line, words, absent", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_env_fix_table(line, words, absent):
    fix = env_fix(["sacct: job 9 attempt 1: FAILED, exit 72:0, on node1", line])
    for word in words:
        assert word in fix, (word, fix)
    for word in absent:
        assert word not in fix, (word, fix)
    # The decision carries it: env_error stays a stop, its reason names the fix.
    decision = decide("env_error", [], build_config([{}]), Situation(evidence=("sacct: ...", line)))
    assert decision.action == STOP and fix in decision.reason


def test_nothing_recognised_is_no_fix():
    assert env_fix([]) == ""
    assert env_fix(["sacct: job 9 attempt 1: FAILED, exit 72:0", "exit code 72 of 9: environment"]) == ""
    # A missing data file is not a missing program.
    assert env_fix(["FileNotFoundError: [Errno 2] No such file or directory: '/data/train.bin'"]) == ""


def test_the_first_recognised_line_wins():
    """The classifier puts the root cause's line first: a missing package that broke an op build is the package."""
    lines = ["ModuleNotFoundError: No module named 'ninja'", "RuntimeError: Error building extension 'fused_adam'"]
    assert env_fix(lines).startswith("`pip install ninja`")
    assert "prepare" in env_fix(lines[::-1])
