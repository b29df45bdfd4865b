"""The policy: (cause, history, config) -> decision + config patch. One table row per rule, then budgets."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

import pytest

from hpc_agent.config.load import apply_patch, build_config, patch_as_overrides
from hpc_agent.config.problems import ConfigError
from hpc_agent.core.causes import ALL_CAUSES
from hpc_agent.policy.decide import (ACTIONS, DONE, REQUEUE, RESUBMIT, STOP, WAIT, PastAttempt, PolicyLimits, Situation, decide,
                                     format_mem, merge_exclude, parse_mem_mb)
from hpc_agent.policy.memory import gpu_oom_rung


def cfg(**overrides: Any):
    """A validated config from dotted overrides: cfg(**{"train.zero_stage": 2})."""
    return build_config([dict(overrides)])


def past(cause: str, action: str = RESUBMIT, patch: Optional[Dict[str, Any]] = None,
         progress: Optional[bool] = True) -> PastAttempt:
    return PastAttempt("1", cause, action, patch or {}, progress)


@dataclass
class Row:
    id: str
    cause: str
    action: str
    config: Dict[str, Any] = field(default_factory=dict)
    history: Sequence[PastAttempt] = ()
    situation: Situation = Situation()
    limits: PolicyLimits = PolicyLimits()
    patch: Optional[Dict[str, Any]] = None
    expedite: Optional[bool] = None
    reason: str = ""
    extra: Dict[str, Any] = field(default_factory=dict)


ROWS = [
    # --- nothing ended ----------------------------------------------------------------------------------
    Row("completed-done", "completed", DONE),
    Row("running-wait", "running", WAIT, expedite=False),
    Row("pending-wait", "pending", WAIT, expedite=False),
    Row("unknown-wait-never-requeue", "unknown", WAIT, reason="never requeue"),
    Row("pending-after-preemption-expedite", "pending", WAIT, situation=Situation(requeued_after="preempted"),
        expedite=True, reason="121 s"),
    # --- preemption and time limit ----------------------------------------------------------------------
    Row("preempted-requeue-expedite", "preempted", REQUEUE, patch={}, expedite=True),
    Row("preempted-is-free-of-the-overall-budget", "preempted", REQUEUE, {"watch.max_retries": 1},
        history=[past("preempted", REQUEUE, progress=False)] * 20),
    Row("timeout-resume", "timeout", REQUEUE, patch={}, expedite=True, situation=Situation(made_progress=True)),
    Row("timeouts-with-progress-are-free", "timeout", REQUEUE, {"watch.max_retries": 2},
        history=[past("timeout", REQUEUE)] * 10, situation=Situation(made_progress=True)),
    Row("timeout-hang-no-progress-stops", "timeout", STOP, history=[past("timeout", REQUEUE, progress=False)],
        situation=Situation(made_progress=False), reason="no progress"),
    Row("preemptions-do-not-break-a-no-progress-streak", "timeout", STOP,
        history=[past("timeout", REQUEUE, progress=False), past("preempted", REQUEUE, progress=False)],
        situation=Situation(made_progress=False), reason="2 attempts"),
    Row("unknown-progress-never-guessed", "timeout", REQUEUE, history=[past("timeout", REQUEUE, progress=None)],
        situation=Situation(made_progress=None)),
    # --- nodes ------------------------------------------------------------------------------------------
    Row("node-fail-exclude-merged", "node_fail", RESUBMIT, {"slurm.exclude": "node3"},
        situation=Situation(nodes=("node1", "node7"), bad_nodes=("node7",)), patch={"slurm.exclude": "node3,node7"}),
    Row("node-fail-one-node-job", "node_fail", RESUBMIT, situation=Situation(nodes=("gpu-a17",)),
        patch={"slurm.exclude": "gpu-a17"}),
    Row("node-fail-unnamed-node-requeue", "node_fail", REQUEUE, situation=Situation(nodes=("node1", "node2")),
        reason="unnamed"),
    Row("gpu-hw-error-exclude", "gpu_hw_error", RESUBMIT, situation=Situation(nodes=("n1", "n2"), bad_nodes=("n2",)),
        patch={"slurm.exclude": "n2"}),
    # --- collectives ------------------------------------------------------------------------------------
    Row("nccl-first-resume-once", "nccl_error", REQUEUE, situation=Situation(bad_nodes=("node2",)), patch={}),
    Row("nccl-again-exclude-nodes", "nccl_error", RESUBMIT, history=[past("nccl_error", REQUEUE)],
        situation=Situation(bad_nodes=("node2", "node1")), patch={"slurm.exclude": "node2,node1"}),
    Row("nccl-again-no-node-named-stop", "nccl_error", STOP, history=[past("nccl_error", REQUEUE)], reason="interconnect"),
    # --- GPU memory ladder (keeps micro_batch_size x grad_accum_steps) ---------------------------------------
    Row("gpu-oom-halve-batch", "gpu_oom", RESUBMIT, {"train.micro_batch_size": 8, "train.grad_accum_steps": 1},
        patch={"train.micro_batch_size": 4, "train.grad_accum_steps": 2}),
    Row("gpu-oom-odd-batch", "gpu_oom", RESUBMIT, {"train.micro_batch_size": 6, "train.grad_accum_steps": 3},
        patch={"train.micro_batch_size": 3, "train.grad_accum_steps": 6}),
    Row("gpu-oom-prime-batch", "gpu_oom", RESUBMIT, {"train.micro_batch_size": 3},
        patch={"train.micro_batch_size": 1, "train.grad_accum_steps": 3}),
    Row("gpu-oom-activation-checkpointing", "gpu_oom", RESUBMIT, {"train.micro_batch_size": 1},
        patch={"train.activation_checkpointing": True}),
    Row("gpu-oom-raise-zero-stage", "gpu_oom", RESUBMIT,
        {"train.micro_batch_size": 1, "train.activation_checkpointing": True, "slurm.tasks_per_node": 4},
        patch={"train.zero_stage": 2}, extra={"needs_universal_checkpoint": True}),
    Row("gpu-oom-one-rank-skips-zero", "gpu_oom", RESUBMIT, {"train.micro_batch_size": 1,
                                                              "train.activation_checkpointing": True},
        patch={"train.offload": "optimizer", "train.zero_stage": 2}),
    Row("gpu-oom-offload-params-last", "gpu_oom", RESUBMIT,
        {"train.micro_batch_size": 1, "train.activation_checkpointing": True, "train.zero_stage": 3,
         "train.offload": "optimizer"}, patch={"train.offload": "optimizer+params", "train.zero_stage": 3},
        extra={"needs_universal_checkpoint": False}),
    Row("gpu-oom-ladder-exhausted", "gpu_oom", STOP,
        {"train.micro_batch_size": 1, "train.activation_checkpointing": True, "train.zero_stage": 3,
         "train.offload": "optimizer+params"}, reason="nothing left"),
    Row("gpu-oom-no-offload-after-a-host-oom", "gpu_oom", STOP,
        {"train.micro_batch_size": 1, "train.activation_checkpointing": True, "train.zero_stage": 3},
        history=[past("host_oom")], reason="nothing left"),
    # --- host memory --------------------------------------------------------------------------------------
    Row("host-oom-more-mem", "host_oom", RESUBMIT, {"slurm.mem": "4G"}, patch={"slurm.mem": "6G"}),
    Row("host-oom-more-mem-in-mb", "host_oom", RESUBMIT, {"slurm.mem": "16000M"}, patch={"slurm.mem": "24G"}),
    Row("host-oom-capped-by-partition", "host_oom", RESUBMIT, {"slurm.mem": "6G"}, limits=PolicyLimits(max_mem_mb=8192),
        patch={"slurm.mem": "8G"}),
    Row("host-oom-at-cap-offload-less", "host_oom", RESUBMIT,
        {"slurm.mem": "8G", "train.zero_stage": 3, "train.offload": "optimizer+params"},
        limits=PolicyLimits(max_mem_mb=8192), patch={"train.offload": "optimizer"}),
    Row("host-oom-at-cap-nothing-offloaded-stop", "host_oom", STOP, {"slurm.mem": "8G"},
        limits=PolicyLimits(max_mem_mb=8192), reason="most the partition allows"),
    Row("host-oom-partition-default-mem", "host_oom", RESUBMIT, {"slurm.mem": None},
        limits=PolicyLimits(max_mem_mb=64000), patch={"slurm.mem": "64000M"}),
    Row("host-oom-factor-2", "host_oom", RESUBMIT, {"slurm.mem": "4G"}, limits=PolicyLimits(mem_factor=2.0),
        patch={"slurm.mem": "8G"}),
    # --- shared memory (/dev/shm) -------------------------------------------------------------------------
    Row("shm-halves-the-loader-workers", "shm_exhausted", RESUBMIT, {"train.loader_workers": 8},
        patch={"train.loader_workers": 4}, reason="train.loader_workers 8 -> 4"),
    Row("shm-one-worker-goes-to-none", "shm_exhausted", RESUBMIT, {"train.loader_workers": 1},
        patch={"train.loader_workers": 0}),
    Row("shm-no-workers-more-mem", "shm_exhausted", RESUBMIT, {"train.loader_workers": 0, "slurm.mem": "4G"},
        patch={"slurm.mem": "6G"}, reason="counts against the job's memory"),
    Row("shm-no-workers-partition-default-mem", "shm_exhausted", RESUBMIT, {"train.loader_workers": 0, "slurm.mem": None},
        limits=PolicyLimits(max_mem_mb=64000), patch={"slurm.mem": "64000M"}),
    Row("shm-never-offloads-less", "shm_exhausted", STOP,
        {"train.loader_workers": 0, "slurm.mem": "8G", "train.zero_stage": 3, "train.offload": "optimizer"},
        limits=PolicyLimits(max_mem_mb=8192), reason="no more memory to ask for (--mem 8G"),
    Row("shm-default-mem-unknown-cap-stops", "shm_exhausted", STOP, {"train.loader_workers": 0, "slurm.mem": None},
        reason="the partition's default --mem"),
    Row("shm-in-a-container-same-ladder", "shm_exhausted", RESUBMIT,
        {"train.loader_workers": 0, "container.runtime": "pyxis", "container.image": "nvcr.io#nvidia/pytorch:24.05-py3"},
        patch={"slurm.mem": "6G"}),
    Row("shm-in-a-container-at-the-cap-stops-with-advice", "shm_exhausted", STOP,
        {"train.loader_workers": 0, "slurm.mem": "8G", "container.runtime": "apptainer", "container.image": "/i.sif"},
        limits=PolicyLimits(max_mem_mb=8192), reason="the apptainer container shares the node's /dev/shm"),
    Row("shm-per-cause-budget", "shm_exhausted", STOP, history=[past("shm_exhausted")] * 3,
        reason="budget for shm_exhausted used up (3 of 3)"),
    # --- divergence ---------------------------------------------------------------------------------------
    Row("diverged-rollback-and-lower-lr", "diverged", RESUBMIT, {"train.lr": 4e-4},
        situation=Situation(divergence_step=120, checkpoint_steps=(50, 100, 150)), patch={"train.lr": 2e-4},
        extra={"rollback_to_step": 100, "rollback_before_step": 120}),
    Row("diverged-unknown-step-goes-one-back", "diverged", RESUBMIT,
        situation=Situation(checkpoint_steps=(50, 100, 150)), extra={"rollback_to_step": 100}),
    Row("diverged-before-the-first-checkpoint-starts-over", "diverged", RESUBMIT,
        situation=Situation(divergence_step=20, checkpoint_steps=(50,)), extra={"rollback_to_step": 0}),
    Row("diverged-checkpoints-unknown", "diverged", RESUBMIT, situation=Situation(divergence_step=57),
        extra={"rollback_to_step": None, "rollback_before_step": 57}, reason="before step 57"),
    # --- never requeued -----------------------------------------------------------------------------------
    Row("code-error-stop", "code_error", STOP, reason="fix it"),
    Row("env-error-stop-names-the-fix", "env_error", STOP,
        situation=Situation(evidence=("sacct: job 9 attempt 1: FAILED", "9_0_log.out:3: ModuleNotFoundError: No "
                                      "module named 'einops'")), reason="fix: `pip install einops` in the job's"),
    Row("env-error-stop-without-a-recognised-line", "env_error", STOP, reason="run the fix in the evidence"),
    Row("cancelled-stop", "cancelled", STOP, reason="cancelled by a person"),
    # --- budgets ------------------------------------------------------------------------------------------
    Row("per-cause-budget", "host_oom", STOP, history=[past("host_oom")] * 3, reason="budget for host_oom"),
    Row("per-cause-budget-override", "host_oom", RESUBMIT, history=[past("host_oom")] * 3,
        limits=PolicyLimits(per_cause={"host_oom": 5})),
    Row("overall-budget", "gpu_oom", STOP, {"watch.max_retries": 2},
        history=[past("node_fail"), past("host_oom")], reason="watch.max_retries=2"),
    Row("overall-budget-ignores-free-attempts", "gpu_oom", RESUBMIT, {"watch.max_retries": 2},
        history=[past("node_fail"), past("preempted", REQUEUE), past("timeout", REQUEUE)]),
    Row("ladder-is-not-a-no-progress-loop", "gpu_oom", RESUBMIT, {"train.micro_batch_size": 2},
        history=[past("gpu_oom", patch={"train.micro_batch_size": 4}, progress=False),
                 past("gpu_oom", patch={"train.micro_batch_size": 2}, progress=False)],
        situation=Situation(made_progress=False)),
    Row("watch-disabled-stops", "gpu_oom", STOP, {"watch.enabled": False}, reason="watch.enabled is false"),
    Row("watch-disabled-preempted-waits", "preempted", WAIT, {"watch.enabled": False}),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_policy_table(row: Row):
    config = cfg(**row.config)
    decision = decide(row.cause, row.history, config, row.situation, row.limits)
    assert decision.action == row.action, decision.reason
    assert decision.cause == row.cause
    if row.patch is not None:
        assert decision.patch == row.patch
    if row.expedite is not None:
        assert decision.expedite is row.expedite
    assert row.reason in decision.reason
    for key, value in row.extra.items():
        assert getattr(decision, key) == value, key
    if decision.patch:
        apply_patch(config, decision.patch)  # every patch the policy proposes validates


@pytest.mark.parametrize("cause", ALL_CAUSES)
def test_every_cause_has_a_decision(cause):
    decision = decide(cause, [], cfg())
    assert decision.action in (WAIT, DONE, REQUEUE, RESUBMIT, STOP) and decision.reason
    assert decision.to_dict()["cause"] == cause
    ended = decide(cause, [], cfg(), Situation(ended=True))  # an unknown *cause* of an ended attempt too
    assert ended.action in ACTIONS and ended.reason


def climb(cause, config, each_rung=lambda config: None):
    """Climb a ladder as the watcher would: resubmit with each patch, applied, until the policy stops.
    ``each_rung`` checks every patched config. Returns (the patches, the stopping decision)."""
    history, rungs = [], []
    while True:
        decision = decide(cause, history, config, Situation(made_progress=False))
        if decision.action == STOP:
            return rungs, decision
        assert decision.action == RESUBMIT
        rungs.append(decision.patch)
        config = apply_patch(config, decision.patch)
        each_rung(config)
        history.append(past(cause, patch=decision.patch, progress=False))


def test_shm_ladder_from_the_defaults_to_the_budget():
    """Climb it as the watcher would: workers halved to none, then more --mem, until the per-cause budget (3)."""
    rungs, decision = climb("shm_exhausted", cfg(**{"train.loader_workers": 2, "slurm.mem": "4G"}))
    assert rungs == [{"train.loader_workers": 1}, {"train.loader_workers": 0}, {"slurm.mem": "6G"}]
    assert "retry budget for shm_exhausted used up" in decision.reason


def test_unknown_cause_string_is_an_error():
    with pytest.raises(ValueError):
        decide("martians", [], cfg())


def test_gpu_oom_ladder_from_the_defaults_to_exhaustion():
    """Climb the ladder as the watcher would: every rung keeps the global batch and validates."""
    config = cfg(**{"train.micro_batch_size": 16, "train.grad_accum_steps": 2, "slurm.tasks_per_node": 2,
                    "watch.max_retries": 20})

    def global_batch_kept(patched):
        assert patched.train.micro_batch_size * patched.train.grad_accum_steps == 32

    rungs, decision = climb("gpu_oom", config, global_batch_kept)
    assert rungs[:4] == [{"train.micro_batch_size": m, "train.grad_accum_steps": a}
                         for m, a in ((8, 4), (4, 8), (2, 16), (1, 32))]
    assert rungs[4:] == [{"train.activation_checkpointing": True}, {"train.zero_stage": 2}, {"train.zero_stage": 3},
                         {"train.offload": "optimizer", "train.zero_stage": 3},
                         {"train.offload": "optimizer+params", "train.zero_stage": 3}]
    assert "nothing left to trade" in decision.reason


def test_gpu_oom_rung_exhaustion_directly():
    config = cfg(**{"train.micro_batch_size": 1, "train.activation_checkpointing": True, "train.zero_stage": 3,
                    "train.offload": "optimizer+params"})
    assert gpu_oom_rung(config.train, ranks=8) is None


def test_apply_patch_validates_and_leaves_the_original_alone():
    config = cfg()
    patched = apply_patch(config, {"train.micro_batch_size": 4, "train.grad_accum_steps": 2, "slurm.exclude": "n1,n2"})
    assert (patched.train.micro_batch_size, patched.train.grad_accum_steps, patched.slurm.exclude) == (4, 2, "n1,n2")
    assert config.train.micro_batch_size == 8 and config.slurm.exclude is None
    with pytest.raises(ConfigError) as err:
        apply_patch(config, {"train.offload": "optimizer"})  # needs ZeRO 2 or 3
    assert "train.offload" in err.value.render()
    with pytest.raises(ConfigError):
        apply_patch(config, {"train.no_such_key": 1})


@pytest.mark.parametrize("existing,nodes,merged", [
    (None, ["node7"], "node7"),
    ("node3", ["node7"], "node3,node7"),
    ("node[1-2]", ["node2", "node5"], "node1,node2,node5"),
    (None, [], None),
])
def test_merge_exclude(existing, nodes, merged):
    assert merge_exclude(existing, nodes) == merged


@pytest.mark.parametrize("mem,mb", [("4G", 4096), ("16000M", 16000), ("4000", 4000), ("2T", 2097152),
                                    ("512000K", 500), ("lots", None), (None, None)])
def test_parse_mem_mb(mem, mb):
    assert parse_mem_mb(mem) == mb


def test_format_mem_and_overrides():
    assert (format_mem(6144), format_mem(24000)) == ("6G", "24000M")
    assert patch_as_overrides({"train.lr": 0.00015, "train.activation_checkpointing": True, "slurm.mem": None}) == [
        "train.lr=0.00015", "train.activation_checkpointing=true", "slurm.mem=null"]
