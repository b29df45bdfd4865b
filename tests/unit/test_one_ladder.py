"""One OOM ladder: submit's preflight advice, the watcher's policy and ``diagnose`` propose the same next
rung (the same config patch) for the same config and situation (issue 15, "must show" 5).

Each *decider* turns a :class:`Case` into the patch it proposes; every decider must give the case's
``expected`` patch. To add a leg (the pure follow core, say), add a function to ``DECIDERS``: a case
carries everything one needs (the config, the GPU's capacity, the run's earlier attempts as the policy
sees them, and the sacct text + OOM log a replay reads).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List

import pytest

from hpc_agent.config.load import build_config
from hpc_agent.config.schema import Config
from hpc_agent.core.causes import Cause
from hpc_agent.core.rundir import LogText
from hpc_agent.diagnose import diagnose
from hpc_agent.policy.decide import RESUBMIT, STOP, PastAttempt, Situation, decide
from hpc_agent.policy.memory import GPU_HEADROOM, estimate_from_config, estimate_with_patch
from hpc_agent.policy.preflight import REFUSE, memory_verdict

GIB = 2**30
JOB = "201"
BASE = {"model.n_layers": 24, "model.d_model": 1024, "model.seq_len": 4096, "model.n_heads": 16,
        "train.precision": "bf16", "slurm.nodes": 1}
HEADER = "JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed"


def _attempt_rows(state: str, exit_code: str, start: str, end: str) -> List[str]:
    return [f"{JOB}|hpc_agent:gpt-20261201-100000|{state}|{exit_code}|node1|{start}|{end}|00:05:00",
            f"{JOB}.batch|batch|{state}|{exit_code}|node1|{start}|{end}|00:05:00",
            f"{JOB}.0|python|{state}|{exit_code}|node1|{start}|{end}|00:05:00"]


@dataclass(frozen=True)
class Case:
    name: str
    overrides: Dict[str, Any]
    capacity_gib: float
    """The GPU's memory, as CUDA's out-of-memory message states it (two decimals, like CUDA)."""
    offload_allowed: bool
    """False: the run already ran out of *host* memory once (an earlier attempt was a host OOM)."""
    expected: Dict[str, Any]
    """The next rung; {} when the ladder has nothing that fits (preflight refuses with no fix, the
    watcher stops)."""

    @property
    def cfg(self) -> Config:
        return build_config([{**BASE, **self.overrides}])

    @property
    def capacity_bytes(self) -> int:
        return int(float(f"{self.capacity_gib:.2f}") * GIB)

    @property
    def history(self) -> List[PastAttempt]:
        """The earlier attempts as the policy sees them (what ``diagnose`` derives from the sacct text)."""
        return [] if self.offload_allowed else [PastAttempt(JOB, Cause.HOST_OOM.value, action="requeue")]

    @property
    def sacct_text(self) -> str:
        rows = [HEADER]
        if not self.offload_allowed:  # the first attempt: killed by the cgroup (host OOM), requeued
            rows += _attempt_rows("OUT_OF_MEMORY", "0:125", "2026-12-01T10:00:02", "2026-12-01T10:05:02")
        rows += _attempt_rows("FAILED", "1:0", "2026-12-01T10:10:02", "2026-12-01T10:15:02")
        return "\n".join(rows) + "\n"

    @property
    def oom_log(self) -> LogText:
        return LogText(f"{JOB}_0_log.out", "[rank 0/1] host=node1 job=201 training gpt\n"
                       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                       f"capacity of {self.capacity_gib:.2f} GiB of which 0 bytes is free.\n")


# --- the deciders ------------------------------------------------------------------------------------
def by_preflight(case: Case) -> Dict[str, Any]:
    """submit's refusal and the fix it proposes."""
    verdict = memory_verdict(case.cfg, case.capacity_bytes, "test", offload_allowed=case.offload_allowed)
    assert verdict.level == REFUSE, verdict.message
    return dict(verdict.fix)


def by_policy(case: Case) -> Dict[str, Any]:
    """What the watcher calls after a GPU OOM: ``policy.decide.decide`` with the capacity from the OOM message."""
    decision = decide(Cause.GPU_OOM, case.history, case.cfg,
                      Situation(job_id=JOB, gpu_capacity_bytes=case.capacity_bytes))
    assert decision.action == (RESUBMIT if case.expected else STOP), decision.reason
    return dict(decision.patch)


def by_diagnose(case: Case) -> Dict[str, Any]:
    """The diagnose CLI's core, fed the sacct text and the OOM log."""
    report = diagnose(JOB, case.sacct_text, [case.oom_log], [], case.cfg)
    assert report["cause"] == Cause.GPU_OOM.value, report["evidence"]
    assert [a["cause"] for a in report["attempts"]][:-1] == [h.cause for h in case.history]
    return dict(report["decision"]["patch"])


def by_watcher_core(case: Case) -> Dict[str, Any]:
    """The watcher's pure core (``hpc_agent.watcher.follow``), fed what the watcher observes: the sacct attempts,
    squeue's "not queued", and the run's files (config + OOM log); its history comes from the ledger."""
    from hpc_agent.watcher.follow_model import NOTIFY, RESUBMIT_EFFECT, Observation, RunFiles, RunState
    from hpc_agent.watcher.follow import follow
    from hpc_agent.state.lifecycle import Phase
    from hpc_agent.slurm.sacct import group_attempts, parse_sacct

    attempts = tuple(group_attempts(parse_sacct(case.sacct_text))[JOB])
    state = RunState("run", Phase.RUNNING, JOB, history=tuple(case.history))
    outcome = follow(state, Observation(attempts, "", RunFiles(case.cfg, (case.oom_log,))))
    effect = outcome.effects[-1]  # a resubmission comes after the release of the ended job's run lease
    assert effect.kind == (RESUBMIT_EFFECT if case.expected else NOTIFY), outcome.effects
    return dict(effect.args.get("patch", {}))


DECIDERS: Dict[str, Callable[[Case], Dict[str, Any]]] = {
    "preflight": by_preflight,
    "policy.decide": by_policy,
    "diagnose": by_diagnose,
    "watcher (follow core)": by_watcher_core,
}

ONE_RANK = {"slurm.tasks_per_node": 1, "slurm.gpus_per_node": 1}
MB16 = {"train.micro_batch_size": 16, "train.grad_accum_steps": 1, "train.zero_stage": 1, **ONE_RANK}
MB1_CKPT = {"train.micro_batch_size": 1, "train.grad_accum_steps": 16, "train.activation_checkpointing": True}
MB6_4RANKS = {"train.micro_batch_size": 6, "train.grad_accum_steps": 2, "train.zero_stage": 2,
              "slurm.tasks_per_node": 4, "slurm.gpus_per_node": 4}
MB8_2X2 = {"train.micro_batch_size": 8, "train.activation_checkpointing": True, "train.zero_stage": 2,
           "slurm.nodes": 2, "slurm.tasks_per_node": 2, "slurm.gpus_per_node": 2}
OFFLOAD_OPT = {"train.offload": "optimizer", "train.zero_stage": 2}

CASES = [
    # ~300M-parameter GPT, one GPU, estimate 56.1 GiB at micro-batch 16.
    Case("mb16-1rank-16GiB", MB16, 16, True, {"train.micro_batch_size": 2, "train.grad_accum_steps": 8}),
    Case("mb16-1rank-8GiB-checkpointing", MB16, 8, True,
         {"train.micro_batch_size": 1, "train.grad_accum_steps": 16, "train.activation_checkpointing": True}),
    Case("mb16-1rank-4GiB-offload", MB16, 4, True,
         {"train.micro_batch_size": 1, "train.grad_accum_steps": 16, "train.activation_checkpointing": True,
          **OFFLOAD_OPT}),
    Case("mb16-1rank-8GiB-after-host-oom", MB16, 8, False,
         {"train.micro_batch_size": 1, "train.grad_accum_steps": 16, "train.activation_checkpointing": True}),
    # Micro-batch 1 and checkpointing already: 8 ranks climb the ZeRO stages; one rank has nothing to shard.
    Case("mb1-ckpt-8ranks-zero1", {**MB1_CKPT, "train.zero_stage": 1, "slurm.tasks_per_node": 8,
                                   "slurm.gpus_per_node": 8}, 2.5, True, {"train.zero_stage": 3}),
    Case("mb1-ckpt-1rank-zero0-offload", {**MB1_CKPT, "train.zero_stage": 0, **ONE_RANK}, 5, True, OFFLOAD_OPT),
    Case("mb1-ckpt-1rank-zero0-after-host-oom-exhausted", {**MB1_CKPT, "train.zero_stage": 0, **ONE_RANK}, 5, False,
         {}),
    # An odd micro-batch loses its smallest factor (6 -> 3 -> 1), the global batch kept.
    Case("mb6-4ranks-zero2-12GiB", MB6_4RANKS, 12, True, {"train.micro_batch_size": 1, "train.grad_accum_steps": 12}),
    Case("mb6-4ranks-zero2-3GiB", MB6_4RANKS, 3, False,
         {"train.micro_batch_size": 1, "train.grad_accum_steps": 12, "train.activation_checkpointing": True,
          "train.zero_stage": 3}),
    # 2 nodes x 2 ranks, checkpointing on, ZeRO-2.
    Case("mb8-ckpt-2x2-zero2-4GiB", MB8_2X2, 4, True, {"train.micro_batch_size": 2, "train.grad_accum_steps": 4}),
    Case("mb8-ckpt-2x2-zero2-2GiB", MB8_2X2, 2, True,
         {"train.micro_batch_size": 1, "train.grad_accum_steps": 8, "train.zero_stage": 3,
          "train.offload": "optimizer"}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_decider_proposes_the_same_rung(case: Case):
    assert estimate_from_config(case.cfg).total_bytes > case.capacity_bytes  # preflight's situation: it does not fit
    proposed = {name: decide_(case) for name, decide_ in DECIDERS.items()}
    assert proposed == {name: case.expected for name in DECIDERS}
    if case.expected:  # the rung fits the headroom by the estimate and keeps the global batch
        assert estimate_with_patch(case.cfg, case.expected).total_bytes <= GPU_HEADROOM * case.capacity_bytes
        t = case.cfg.train
        mbs = case.expected.get("train.micro_batch_size", t.micro_batch_size)
        assert mbs * case.expected.get("train.grad_accum_steps", t.grad_accum_steps) == \
            t.micro_batch_size * t.grad_accum_steps


def test_where_preflight_and_the_watcher_part_on_purpose():
    """When rungs remain but none fits by the estimate, preflight refuses with no fix, while the watcher
    (and diagnose, which says what it would do) tries the next rung alone: the estimate may be pessimistic,
    and the job already ran. Both read the same ladder (its first rung)."""
    case = Case("mb16-1rank-4GiB-after-host-oom", MB16, 4, False, {"train.micro_batch_size": 8,
                                                                 "train.grad_accum_steps": 2})
    verdict = memory_verdict(case.cfg, case.capacity_bytes, "test", offload_allowed=False)
    assert verdict.level == REFUSE and verdict.fix == {} and "no rung of the OOM ladder" in verdict.message
    decision = decide(Cause.GPU_OOM, case.history, case.cfg,
                      Situation(job_id=JOB, gpu_capacity_bytes=case.capacity_bytes))
    assert decision.patch == case.expected and "trying the next one" in decision.reason
    assert by_diagnose(case) == case.expected
