"""The watcher's pure core, edge by edge: (run state, observation) -> (phase, effects, audit).

No ledger, no Slurm, no files: every input is a value. tests/unit/test_watcher.py drives the same core through
the watcher with a fake Slurm; tests/cluster/test_watch_slurm.py through the real cluster.
"""
from __future__ import annotations

import math
from typing import Optional

import pytest

from hpc_agent.config.load import build_config
from hpc_agent.core.rundir import LogText
from hpc_agent.metrics.alarm_kinds import Alarm
from hpc_agent.slurm.sacct import group_attempts, parse_sacct
from hpc_agent.state.lifecycle import Phase
from hpc_agent.watcher.follow import follow, history_from, situation_from, wants
from hpc_agent.watcher.follow_model import (EXCLUDE, EXPEDITE, NOT_ASKED, NOTIFY, RELEASE_LEASE, REQUEUE_EFFECT,
                                            RESUBMIT_EFFECT, Observation, RunFiles, RunState, Wants)

HEADER = "JobID|JobName|State|ExitCode|NodeList|Start|End|Elapsed"
T0, T1 = "2026-11-30T10:00:00", "2026-11-30T10:01:00"
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)\n"
       "[hpc_agent] out of memory at step 4 during training (micro_batch_size 8, ZeRO-1); exiting 3\n")
CODE = 'Traceback (most recent call last):\n  File "/w/engine.py", line 1, in f\nZeroDivisionError: division by zero\n'
PREEMPT = "[hpc_agent] signal SIGUSR2 at step 12: checkpoint step_00000012 complete in 0.0s; exiting 75\n"
NODE_FAIL_ROW = f"9|hpc_agent:r|NODE_FAIL|0:0|node2|{T0}|{T1}|00:01:00"
CFG = build_config([{"run": {"name": "t"}, "train": {"micro_batch_size": 8, "grad_accum_steps": 1, "max_steps": 100}}])


def attempts(*rows: str):
    found = group_attempts(parse_sacct(HEADER + "\n" + "\n".join(rows) + "\n"))
    return tuple(found["9"]) if found else ()


def row(state: str, exit_code: str = "0:0") -> str:
    end = "Unknown" if state in ("RUNNING", "PENDING") else T1
    return f"9|hpc_agent:r|{state}|{exit_code}|node1|{T0}|{end}|00:01:00"


def files(log: str = "", steps=(), problems=(), alarms=(), config=CFG) -> RunFiles:
    return RunFiles(config, (LogText("9_0_log.out", log),) if log else (), tuple(alarms), tuple(steps), tuple(problems))


def state(phase: Phase = Phase.RUNNING, **kw) -> RunState:
    return RunState("r", phase, "9", **kw)


def kinds(outcome):
    return [e.kind for e in outcome.effects]


# (name, state, sacct rows, queue, files, expected phase, expected effect kinds)
CASES = [
    ("nothing in sacct yet", state(Phase.PENDING), (), NOT_ASKED, None, Phase.PENDING, []),
    ("pending job starts", state(Phase.PENDING), (row("RUNNING"),), NOT_ASKED, None, Phase.RUNNING, []),
    ("running stays running", state(), (row("RUNNING"),), NOT_ASKED, None, Phase.RUNNING, []),
    ("submitting with a job id starts", state(Phase.SUBMITTING), (row("RUNNING"),), NOT_ASKED, None, Phase.RUNNING, []),
    ("first attempt queued again", state(), (row("PENDING"),), NOT_ASKED, None, Phase.PENDING, []),
    ("slurm requeued a preemption: expedite", state(), (row("REQUEUED"), row("PENDING")), NOT_ASKED,
     files(PREEMPT), Phase.PENDING, [EXPEDITE]),
    ("squeue shows the requeued attempt before sacct", state(), (row("REQUEUED"),), "PENDING", files(PREEMPT),
     Phase.PENDING, [EXPEDITE]),
    ("requeued but the old attempt still completing: no expedite yet", state(), (row("REQUEUED"),), "COMPLETING",
     files(PREEMPT), Phase.PENDING, []),
    ("requeued attempt already expedited", state(expedited=frozenset({1})), (row("REQUEUED"), row("PENDING")),
     NOT_ASKED, None, Phase.PENDING, []),
    ("node failure requeued by slurm: exclude + expedite", state(), (NODE_FAIL_ROW, row("PENDING")), NOT_ASKED,
     files("[hpc_agent] step 3 loss 2.0\n"), Phase.PENDING, [EXCLUDE, EXPEDITE]),
    ("gpu oom: ask squeue before acting", state(), (row("FAILED", "3:0"),), NOT_ASKED, files(OOM), Phase.RUNNING, []),
    ("gpu oom: free the ended job's run lease, resubmit with a smaller micro-batch", state(), (row("FAILED", "3:0"),),
     "", files(OOM), Phase.RECOVERING, [RELEASE_LEASE, RESUBMIT_EFFECT]),
    ("gpu oom but squeue did not answer: wait", state(), (row("FAILED", "3:0"),), None, files(OOM), Phase.RUNNING, []),
    ("timeout: requeue and expedite", state(), (row("TIMEOUT", "0:15"),), "", files(), Phase.RECOVERING,
     [REQUEUE_EFFECT, EXPEDITE]),
    ("code error: stop", state(), (row("FAILED", "1:0"),), NOT_ASKED, files(CODE), Phase.STOPPED, [NOTIFY]),
    ("completed", state(), (row("COMPLETED"),), NOT_ASKED, files(), Phase.COMPLETED, []),
    ("final checkpoint complete: done whatever the exit", state(), (row("FAILED", "15:0"),), NOT_ASKED,
     files("terminate called\n", steps=(100,)), Phase.COMPLETED, []),
    ("attempt already decided", state(decided=frozenset({0})), (row("FAILED", "3:0"),), NOT_ASKED, None,
     Phase.RUNNING, []),
    ("unreadable files: needs attention", state(), (row("FAILED", "3:0"),), NOT_ASKED,
     files(OOM, problems=("9_0_log.out is not a regular file (a FIFO); not reading it",)), Phase.NEEDS_ATTENTION,
     [NOTIFY]),
    ("invalid config: needs attention", state(), (row("FAILED", "3:0"),), NOT_ASKED, files(OOM, config=None),
     Phase.NEEDS_ATTENTION, [NOTIFY]),
    ("unreadable files while requeued: needs attention", state(), (row("REQUEUED"), row("PENDING")), NOT_ASKED,
     files(PREEMPT, problems=("config.yaml: bad",)), Phase.NEEDS_ATTENTION, [NOTIFY]),
    ("nan loss: resubmit with rollback", state(), (row("FAILED", "65:0"),), "",
     files("[hpc_agent] step 24 loss 2.1\n", steps=(10, 20, 30), alarms=(Alarm("nonfinite_loss", 25, "loss nan"),)),
     Phase.RECOVERING, [RELEASE_LEASE, RESUBMIT_EFFECT]),
    ("legacy recovering run: recovered once a newer attempt exists",
     state(Phase.RECOVERING, last_decision={"job_id": "9", "attempt": 0, "action": "requeue", "cause": "timeout",
                                            "reason": "x", "patch": {}, "decision": {}}),
     (row("TIMEOUT", "0:15"), row("PENDING")), NOT_ASKED, None, Phase.PENDING, []),
    ("legacy recovering run: the recorded resubmission is carried out",
     state(Phase.RECOVERING, last_decision={"job_id": "9", "attempt": 0, "action": "resubmit", "cause": "gpu_oom",
                                            "reason": "x", "patch": {"train.micro_batch_size": 4}, "decision": {}}),
     (row("FAILED", "3:0"),), NOT_ASKED, None, Phase.RECOVERING, [RESUBMIT_EFFECT]),
]


@pytest.mark.parametrize("name, run, rows, queue, found, phase, effects", CASES, ids=[c[0] for c in CASES])
def test_follow_edge(name, run, rows, queue, found, phase, effects):
    outcome = follow(run, Observation(attempts(*rows), queue, found))
    assert outcome.phase is phase
    assert kinds(outcome) == effects


def test_resubmit_carries_the_ladder_patch_and_the_audit_names_the_config_diff():
    outcome = follow(state(), Observation(attempts(row("FAILED", "3:0")), "", files(OOM)))
    release, effect = outcome.effects
    assert (release.kind, release.job_id) == (RELEASE_LEASE, effect.job_id)  # only that job's lease, if it holds one
    assert effect.args["patch"] == {"train.micro_batch_size": 4, "train.grad_accum_steps": 2}
    (audit,) = outcome.audit
    assert audit["config_diff"]["train.micro_batch_size"] == {"from": 8, "to": 4}
    assert outcome.decision["cause"] == "gpu_oom" and outcome.decision["attempt"] == 0


def test_an_ended_attempt_s_decision_comes_with_the_effects_that_carry_it_out():
    """The decision row and its audit record are part of the same outcome as the effects, with the cause and the
    detail, so the watcher journals all of them in one transaction before any effect runs (the one definition of
    an effect is ``follow_model.Effect``; ``lifecycle.transition`` only gives the phase)."""
    outcome = follow(state(), Observation(attempts(row("TIMEOUT", "0:15")), "", files()))
    assert outcome.phase is Phase.RECOVERING
    assert [(e.kind, e.job_id) for e in outcome.effects] == [(REQUEUE_EFFECT, "9"), (EXPEDITE, "9")]
    decision = outcome.decision
    assert (decision["cause"], decision["action"], decision["job_id"]) == ("timeout", "requeue", "9")
    (audit,) = outcome.audit
    assert (audit["cause"], audit["decision"]["action"]) == ("timeout", "requeue")
    assert audit["evidence"][0].startswith("sacct: job 9 attempt 1: TIMEOUT")


def test_needs_attention_reason_lists_every_problem():
    problems = ("config.yaml: got '<file>'; expected a readable YAML mapping", "9_0_log.out is a FIFO",
                "9_0_log.err is a symbolic link; not following it")
    outcome = follow(state(), Observation(attempts(row("FAILED", "9:0")), NOT_ASKED, files(problems=problems, config=None)))
    (audit,) = outcome.audit
    assert audit["action"] == "needs_attention" and all(p in audit["reason"] for p in problems)


def test_expedite_marks_the_synthetic_attempt_seen_only_in_squeue():
    outcome = follow(state(), Observation(attempts(row("REQUEUED")), "PENDING", files(PREEMPT)))
    assert outcome.expedite_attempt == 1 and outcome.phase is Phase.PENDING


def test_exclude_patch_and_decision_row_for_the_failed_node():
    outcome = follow(state(), Observation(attempts(NODE_FAIL_ROW, row("PENDING")), NOT_ASKED, files("x\n")))
    exclude = outcome.effects[0]
    assert exclude.args["nodes"] == "node2" and exclude.args["patch"] == {"slurm.exclude": "node2"}
    assert outcome.decision["attempt"] == 0 and outcome.decision["cause"] == "node_fail"


@pytest.mark.parametrize("run, rows, expected", [
    (state(), (row("RUNNING"),), Wants(live=True)),  # heartbeats only (tests/unit/test_follow_hang.py)
    (state(), (row("PENDING"),), Wants()),
    (state(), (row("REQUEUED"),), Wants(queue=True, files=True)),
    (state(), (row("REQUEUED"), row("PENDING")), Wants(files=True)),
    (state(expedited=frozenset({1})), (row("REQUEUED"), row("PENDING")), Wants()),
    (state(), (row("FAILED", "3:0"),), Wants(files=True)),
    (state(decided=frozenset({0})), (row("FAILED", "3:0"),), Wants()),
    (state(Phase.RECOVERING), (row("FAILED", "3:0"),), Wants()),
])
def test_wants_reads_files_only_for_attempts_that_ended_or_were_requeued(run, rows, expected):
    assert wants(run, attempts(*rows)) == expected


class _Row:
    def __init__(self, job_id: str, ckpt_step: Optional[int]):
        self.job_id, self.cause, self.action, self.patch, self.ckpt_step = job_id, "timeout", "requeue", {}, ckpt_step


def test_history_progress_is_the_checkpoint_moving_forward():
    history = history_from([_Row("1", 10), _Row("1", 10), _Row("2", 20), _Row("2", None)])
    assert [h.made_progress for h in history] == [True, False, True, False]


def test_situation_takes_the_gpu_capacity_from_the_oom_message():
    from hpc_agent.diagnosis.classify import classify_job

    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.15 GiB of which 1.10 GiB is free.\n")
    diagnoses = classify_job(attempts(row("FAILED", "3:0")), [LogText("9_0_log.out", oom)], job_id="9")
    situation = situation_from(diagnoses)
    assert situation.gpu_capacity_bytes and math.isclose(situation.gpu_capacity_bytes / 2**30, 79.15, rel_tol=1e-3)


def test_placement_auto_asks_for_the_partitions_facts_then_moves_the_run_and_audits_the_table():
    from types import SimpleNamespace as NS

    cfg = build_config([{"run": {"name": "t"}, "slurm": {"partition": "gpu_small", "gpus_per_node": 1,
                                                         "tasks_per_node": 1},
                         "train": {"micro_batch_size": 8, "max_steps": 100},
                         "placement": {"mode": "auto", "tolerance_s": 0}}])
    ended = attempts(row("FAILED", "3:0"))
    asked = follow(state(), Observation(ended, "", files(OOM, config=cfg)))
    assert asked.ask_placement == {} and not asked.effects and asked.phase is Phase.RUNNING  # nothing done yet
    facts = (NS(name="gpu_small", gpu_type="a10", gpu_gib=24.0, blocked="", start_s=0.0),
             NS(name="gpu_big", gpu_type="h100", gpu_gib=80.0, blocked="", start_s=0.0))
    outcome = follow(state(), Observation(ended, "", files(OOM, config=cfg), placement=facts))
    assert outcome.phase is Phase.RECOVERING and outcome.ask_placement is None
    _, effect = outcome.effects
    assert effect.args["patch"] == {"slurm.partition": "gpu_big"}
    (audit,) = outcome.audit
    assert audit["config_diff"] == {"slurm.partition": {"from": "gpu_small", "to": "gpu_big"}}
    table = audit["decision"]["placement"]["table"]
    assert table[0].split()[:2] == ["partition", "gpu"] and any("chosen" in line for line in table)
    assert any("gpu_big" in line and "chosen" in line for line in outcome.lines)  # the watcher's output shows it
    # Facts that could not be gathered (the watcher passes ()): the ladder rung in place, as without placement.
    fallback = follow(state(), Observation(ended, "", files(OOM, config=cfg), placement=()))
    assert fallback.effects[1].args["patch"] == {"train.micro_batch_size": 4, "train.grad_accum_steps": 2}
