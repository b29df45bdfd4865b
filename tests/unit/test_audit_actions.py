"""Every action on Slurm writes an audit record with who, what, why and the config diff (hpc_agent/state/audit.py).

The action types are enumerated from the code: every effect the watcher can carry out (``effects._HANDLERS``,
bar the ones ``audit.NOT_ACTIONS`` names) is journaled, carried out against the canonical FakeSlurm and must
leave exactly one action record. A new effect kind without a case here, or not in ``audit.ACTIONS``, fails.
The sweep's and the submit CLI's actions are covered in tests/unit/test_sweep.py and tests/unit/test_submit_orphans.py."""
from __future__ import annotations

import getpass
import json
import os
import socket

import pytest

from hpc_agent.runs.plot import boundary_labels
from hpc_agent.state import audit
from hpc_agent.state.journal import Journal
from hpc_agent.state.lifecycle import Phase
from hpc_agent.watcher import effects
from hpc_agent.watcher.follow_model import (Adopt, Cancel, Exclude, Expedite, Outcome, ReleaseLease, RequestStacks,
                                            Requeue, Resubmit)
from tests.unit.test_watcher import OOM_LOG, add_run, world  # noqa: F401 (world: the fixture)

PATCH = {"train.micro_batch_size": 4}
DIFF = {"train.micro_batch_size": {"from": 8, "to": 4}}
# effect kind -> (how the job stands in Slurm before, the effect, does it carry a config change)
CASES = {
    "requeue": ("failed", lambda job: Requeue(job), False),
    "expedite": ("pending", lambda job: Expedite(job), False),
    "resubmit": ("failed", lambda job: Resubmit(job, PATCH, "gpu_oom: halve micro_batch"), True),
    "exclude": ("pending", lambda job: Exclude(job, "node1", {"slurm.exclude": "node1"}), True),
    "cancel": ("running", lambda job: Cancel(job), False),
    "request_stacks": ("running", lambda job: RequestStacks(job), False),  # a hung job (tests/unit/test_follow_hang.py)
    "release_lease": ("failed", lambda job: ReleaseLease(job), False),
    "adopt": ("pending", lambda job: Adopt(job, "99999"), False),  # the job handed over to 99999 (handback.py)
}
ACTED = sorted(set(effects._HANDLERS) - set(audit.NOT_ACTIONS))


def action_records(ledger, run_id):
    return [(seq, rec) for seq, _, rec in Journal(ledger).audit_records(run_id) if "by" in rec]


def assert_who(record, process):
    assert record["by"] == {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid(),
                            "process": process}


def test_every_effect_kind_has_a_case_and_is_a_declared_action():
    assert sorted(CASES) == ACTED, "a new effect kind: add its case here (and to audit.ACTIONS)"
    assert set(ACTED) <= set(audit.ACTIONS)


@pytest.mark.parametrize("kind", ACTED)
def test_each_watcher_action_is_audited_with_who_what_why_and_diff(world, kind):  # noqa: F811
    slurm, ledger, watcher = world["slurm"], world["ledger"], world["watcher"]
    before, make, patched = CASES[kind]
    run_dir, job = add_run(world, "r", start=before != "pending")
    if before == "failed":
        slurm.fail(job, 3)
    effect = make(job)
    decision = {"job_id": job, "attempt": 1, "cause": "gpu_oom", "evidence": ["CUDA out of memory"],
                "decision": {"action": kind, "reason": f"the test asks for {kind}"},
                "config_diff": (DIFF if kind == "resubmit" else {"slurm.exclude": {"from": "", "to": "node1"}})
                if patched else {}}
    phase = ledger.run("r").phase
    after = Phase.RECOVERING if kind in ("requeue", "resubmit") else Phase(phase)  # as follow() decides them
    assert watcher.journal.commit("r", phase, Outcome(after, (effect,), audit=(decision,)))
    watcher.carrier.run_effects(ledger.run("r"))
    assert [s for _, _, s in Journal(ledger).effects("r")] == ["done"]
    (seq, record), = action_records(ledger, "r")
    assert_who(record, "watcher")
    assert record["action"] == kind and record["job_id"] == job and record["result"]  # what, and what came of it
    assert record["reason"] == f"the test asks for {kind}" and record["decided_in"] == seq - 1  # why
    assert record["config_diff"] == decision["config_diff"]  # the diff (empty where nothing changed)
    assert (record["attempt"], record["cause"]) == (1, "gpu_oom")
    # events.jsonl carries it too, and review merges it into its decision's boundary (no extra marker).
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in events if "by" in e] == [seq]
    assert len(boundary_labels(events)) == 1


def test_an_action_carried_out_twice_after_a_crash_is_recorded_once(world):  # noqa: F811
    slurm, ledger, watcher = world["slurm"], world["ledger"], world["watcher"]
    _, job = add_run(world, "r")
    slurm.fail(job, 3)
    watcher.journal.commit("r", "running", Outcome(Phase.RECOVERING, (Requeue(job),), audit=({"job_id": job},)))
    watcher.carrier.run_effects(ledger.run("r"))
    watcher.carrier.run_effects(ledger.run("r"))  # nothing pending any more: nothing recorded again
    assert len(action_records(ledger, "r")) == 1


def test_watcher_scenarios_leave_action_records(world):  # noqa: F811
    """End to end through tick(): an OOM resubmission (config diff from/to) and a preemption's expedite."""
    slurm, ledger, watcher = world["slurm"], world["ledger"], world["watcher"]
    _, job = add_run(world, "oom", log=OOM_LOG)
    slurm.fail(job, 3)
    watcher.tick()
    (_, release), (_, resubmit) = action_records(ledger, "oom")  # the ended job's run lease first (it held none)
    assert release["action"] == "release_lease" and release["result"] == "no lease of this job"
    assert resubmit["action"] == "resubmit" and resubmit["config_diff"]["train.micro_batch_size"] == {"from": 8, "to": 4}
    assert resubmit["result"].startswith("submitted as job ") and resubmit["cause"] == "gpu_oom"
    _, job = add_run(world, "pre")
    slurm.advance(240)
    slurm.preempt(job)
    watcher.tick()
    (_, expedite), = action_records(ledger, "pre")
    assert expedite["action"] == "expedite" and expedite["job_id"] == job and expedite["config_diff"] == {}
    assert_who(expedite, "watcher")


@pytest.mark.parametrize("action, process, problem", [
    ("reboot", "watcher", "unknown action"),
    ("submit", "cron", "unknown process"),
])
def test_undeclared_actions_and_processes_are_refused(action, process, problem):
    with pytest.raises(ValueError, match=problem):
        audit.action_record(action, "1", "why", audit.who(process))


@pytest.mark.parametrize("kind, records, expected", [
    ("requeue", [], None),
    ("requeue", [(1, 10.0, {"job_id": "5", "decision": {"action": "requeue"}})], 1),
    ("requeue", [(1, 10.0, {"job_id": "6"})], None),  # another job
    ("requeue", [(1, 20.0, {"job_id": "5"})], None),  # another commit, much later
    ("expedite", [(1, 10.0, {"job_id": "5", "config_diff": {"a": 1}}), (2, 10.0, {"job_id": "5", "action": "expedite"})], 2),
    ("exclude", [(1, 10.0, {"job_id": "5"}), (2, 10.0, {"job_id": "5", "config_diff": {"slurm.exclude": {}}})], 2),
    ("requeue", [(1, 10.0, {"job_id": "5", "by": {}}), (2, 10.0, {"job_id": "5"})], 2),  # never an action record
])
def test_decision_for(kind, records, expected):
    found = audit.decision_for(kind, "5", 10.0, records)
    assert (found[0] if found else None) == expected
