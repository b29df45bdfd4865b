"""In-job recovery (issue 17 item 2): the pure decision and agreement rules as tables, the journal's reader
against hostile lines, the watcher-side ingestion (exactly once), and 2-rank CPU runs (gloo) that repair an
injected OOM and an injected NaN inside the same processes."""
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.common import run_ranks, snapshot
from hpc_agent.config.load import build_config, load_run_config
from hpc_agent.core import in_job_journal, rundir
from hpc_agent.core.exit_codes import EXIT_DIVERGED, EXIT_OUT_OF_MEMORY
from hpc_agent.policy.adaptive_lr import adaptation_kind, adaptation_reason
from hpc_agent.state import run_config
from hpc_agent.state.journal import Journal
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher.in_job import InJobIngest, audit_record
from launch.recovery import (CONTINUE, EXIT, REPAIR, Fault, agree, carried_patch, carry_into_config, divergence_fault,
                             plan)


def _cfg(**train):
    base = {"workload": "gpt", "micro_batch_size": 4, "grad_accum_steps": 1, "lr": 1e-3, "zero_stage": 1}
    base.update(train)
    return build_config([{"train": base, "slurm": {"tasks_per_node": 2}}])


OOM = Fault("gpu_oom", 3, "gpu_oom", "CUDA out of memory.")
NAN = Fault("diverged", 5, "nan_loss", "train/loss is nan at step 5", divergence_step=5)
SPIKE = Fault("diverged", 30, "loss_spike", "spike", divergence_step=29)


@pytest.mark.parametrize("fault,train,left,budget,steps,action,patch,rollback,code", [
    (OOM, {}, 2, 2, (), REPAIR, {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}, None, 0),
    (OOM, {"micro_batch_size": 6}, 1, 2, (), REPAIR, {"train.micro_batch_size": 3, "train.grad_accum_steps": 2},
     None, 0),
    (OOM, {}, 0, 2, (), EXIT, {}, None, EXIT_OUT_OF_MEMORY),      # budget spent
    (OOM, {}, 0, 0, (), EXIT, {}, None, EXIT_OUT_OF_MEMORY),      # recovery off
    (OOM, {"micro_batch_size": 1, "activation_checkpointing": False}, 2, 2, (), REPAIR,
     {"train.activation_checkpointing": True}, None, 0),
    (OOM, {"micro_batch_size": 1, "activation_checkpointing": True, "zero_stage": 3, "offload": "optimizer+params"},
     2, 2, (), EXIT, {}, None, EXIT_OUT_OF_MEMORY),              # the ladder is exhausted
    (NAN, {}, 2, 2, (2, 4, 6), REPAIR, {"train.lr": 5e-4}, 4, 0),    # newest checkpoint before the NaN
    (NAN, {}, 2, 2, (6,), REPAIR, {"train.lr": 5e-4}, 0, 0),         # none before it: start over
    (NAN, {}, 0, 2, (2, 4), EXIT, {}, None, EXIT_DIVERGED),
    (SPIKE, {}, 1, 2, (10, 20, 30), REPAIR, {"train.lr": 5e-4}, 20, 0),
    (SPIKE, {}, 0, 2, (10, 20), CONTINUE, {}, None, 0),              # as before: a spike alone never stops a job
])
def test_plan_table(fault, train, left, budget, steps, action, patch, rollback, code):
    p = plan(fault, _cfg(**train), left, budget, steps)
    assert (p.action, p.patch, p.rollback_to_step, p.exit_code) == (action, patch, rollback, code), p.reason
    if action == REPAIR:
        assert p.reason
    if action == EXIT and left == 0:
        assert "resilience.in_job_retries" in p.reason


def test_oom_repair_keeps_the_global_batch():
    cfg = _cfg(micro_batch_size=8, grad_accum_steps=3)
    p = plan(OOM, cfg, 2, 2)
    assert p.patch["train.micro_batch_size"] * p.patch["train.grad_accum_steps"] == 8 * 3


def test_with_placement_auto_an_oom_is_left_to_the_watcher_and_a_nan_still_repaired_in_the_job():
    cfg = build_config([{"train": {"workload": "gpt", "micro_batch_size": 4}, "slurm": {"tasks_per_node": 2},
                         "placement": {"mode": "auto"}}])
    p = plan(OOM, cfg, 2, 2)
    assert (p.action, p.exit_code) == (EXIT, EXIT_OUT_OF_MEMORY) and "watcher weighs a partition" in p.reason
    assert plan(NAN, cfg, 2, 2, (2, 4, 6)).action == REPAIR


class _Stop:
    def __init__(self, signum):
        self.signum = signum

    def agreed(self, reduce):
        seen = reduce(self.signum)
        self.signum = self.signum or seen
        return seen


@pytest.mark.parametrize("mine,others,want", [
    ((0, False), [(0, False)], (False, 0)),
    ((0, True), [(0, False)], (True, 0)),       # one rank failed: every rank sees it
    ((0, False), [(0, True)], (True, 0)),
    ((15, False), [(0, False)], (False, 15)),   # a signal alone: the preemption path, as before
    ((0, False), [(12, True)], (True, 12)),
])
def test_agreement_rides_on_the_signal_all_reduce(mine, others, want):
    calls = []

    def max_int(value):
        calls.append(value)
        return max([value] + [(in_job_bit if failed else 0) | sig for sig, failed in others])

    in_job_bit = 1 << 16
    assert agree(_Stop(mine[0]), max_int, mine[1]) == want
    assert len(calls) == 1  # one collective per micro-step, as before


def test_divergence_fault_uses_the_one_detector():
    flat = [(s, 2.0 + 0.01 * (s % 3)) for s in range(1, 31)]
    assert divergence_fault(flat, [], 30, 1.0, True) is None
    nan = flat + [(31, float("nan"))]
    assert divergence_fault(nan, [], 31, 1.0, False).kind == "nan_loss"
    spike = flat + [(31, 50.0), (32, 60.0)]
    assert divergence_fault(spike, [], 32, 1.0, False) is None  # trends are judged only with a budget
    found = divergence_fault(spike, [], 32, 1.0, True)
    assert (found.kind, found.divergence_step, found.cause) == ("loss_spike", 31, "diverged")

    scales = [(s, 2.0 ** max(0, 10 - s)) for s in range(1, 16)]
    assert divergence_fault(flat[:15], scales, 15, 1.0, True).kind == "loss_scale_collapse"


def test_a_small_bump_on_a_smooth_loss_is_no_spike_to_roll_back_for():
    # A very smooth loss (MAD ~0) makes a 10 % bump many robust sigmas; the job must not roll back for it.
    smooth = [(s, 3.0 - 0.001 * s) for s in range(1, 41)]
    bump = smooth + [(41, 3.0 * 1.1), (42, 3.0 * 1.1)]
    assert divergence_fault(bump, [], 42, 1.0, True) is None
    jump = smooth + [(41, 3.0 * 1.5), (42, 3.0 * 1.5)]
    assert divergence_fault(jump, [], 42, 1.0, True).kind == "loss_spike"


def _decision(seq, job_id="7", attempt=0, patch=None, **extra):
    return in_job_journal.InJobDecision(seq, job_id, attempt, 3, "gpu_oom", in_job_journal.ACTION,
                                        patch or {"train.micro_batch_size": 2}, None, ("CUDA out of memory.",), 1.5e9, 1,
                                        **extra)


def test_a_requeued_attempt_carries_its_jobs_patches_only():
    lines = [_decision(1, patch={"train.micro_batch_size": 4, "train.grad_accum_steps": 2}),
             _decision(2, patch={"train.micro_batch_size": 2, "train.grad_accum_steps": 4}),
             _decision(3, job_id="8", patch={"train.lr": 1.0}),        # another job: a resubmission's own config
             _decision(4, attempt=1, patch={"train.zero_stage": 2})]   # this attempt's own (not earlier)
    assert carried_patch(lines, "7", 1) == {"train.micro_batch_size": 2, "train.grad_accum_steps": 4}
    assert carried_patch(lines, "7", 0) == {}


# --- the journal, untrusted -----------------------------------------------------------------------------
def test_encode_parse_round_trip():
    d = _decision(1, before={"train.micro_batch_size": 4}, reason="micro_batch_size 4 -> 2")
    assert in_job_journal.parse_line(in_job_journal.encode(d)) == d


GOOD = json.loads(in_job_journal.encode(_decision(1)))


def test_an_adaptation_line_round_trips_and_is_audited_as_decided_in_the_job():
    d = in_job_journal.InJobDecision(3, "7", 0, 12, in_job_journal.ADAPT_CAUSE, in_job_journal.ADAPT_ACTION, {}, None, ("[11, 0.5]", "[12, 9.0]"),
                                     1.5e9, 2, "lr_decay: grad norm 9 at step 12 ...")
    assert in_job_journal.parse_line(in_job_journal.encode(d)) == d
    record = audit_record(d)
    assert (record["action"], record["cause"], record["decided_in"], record["step"]) == \
        ("adaptive_schedule", "adaptive", "job", 12)
    assert carried_patch([d], "7", 1) == {}  # a requeue carries no setting from it


@pytest.mark.parametrize("line,problem", [
    ("not json", "Expecting value"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({**GOOD, "seq": True}), "seq"),
    (json.dumps({**GOOD, "seq": 0}), "seq"),
    (json.dumps({**GOOD, "job_id": "1; rm -rf /"}), "job_id"),
    (json.dumps({**GOOD, "cause": "code_error"}), "cause"),
    (json.dumps({**GOOD, "action": "resubmit"}), "action"),
    (json.dumps({**GOOD, "action": ["in_job_repair"]}), "action"),
    (json.dumps({**GOOD, "cause": "adaptive"}), "not a cause of action 'in_job_repair'"),
    (json.dumps({**GOOD, "action": "adaptive_schedule"}), "not a cause of action 'adaptive_schedule'"),
    (json.dumps({**GOOD, "action": "adaptive_schedule", "cause": "adaptive"}), "changes no setting"),
    (json.dumps({**GOOD, "patch": {"slurm.exclude": "node1"}}), "not a train.* setting"),
    (json.dumps({**GOOD, "patch": {"train.lr": {"nested": 1}}}), "plain scalar"),
    (json.dumps({**GOOD, "evidence": "one string"}), "evidence"),
    (json.dumps({**GOOD, "evidence": [1, 2]}), "evidence"),
    (json.dumps({**GOOD, "at": "yesterday"}), "at"),
    (json.dumps(GOOD).replace('"at": 1500000000.0', '"at": NaN'), "NaN is not JSON"),
    (json.dumps({**GOOD, "rollback_to_step": -1}), "rollback_to_step"),
    (json.dumps({**GOOD, "reason": "x" * 5000}), "too long" if False else "reason"),
    ("[" * 100000, "bytes allowed"),  # over the line cap: refused before any parsing (core/json_safe.py)
])
def test_hostile_lines_are_skipped_with_a_problem(line, problem):
    decisions, problems = in_job_journal.parse(line + "\n" + in_job_journal.encode(_decision(2)))
    assert [d.seq for d in decisions] == [2]
    assert len(problems) == 1 and problem in problems[0], problems


def test_a_torn_last_line_waits_for_the_next_read():
    text = in_job_journal.encode(_decision(1)) + in_job_journal.encode(_decision(2))[:40]
    assert ([d.seq for d in in_job_journal.parse(text)[0]], in_job_journal.parse(text)[1]) == ([1], [])


def test_read_refuses_links_and_huge_files(tmp_path):
    run_dir = tmp_path / "run"
    path = rundir.in_job_journal_path(run_dir)
    path.parent.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text(in_job_journal.encode(_decision(1)))
    os.symlink(secret, path)
    decisions, problems = in_job_journal.read(run_dir)
    assert decisions == [] and len(problems) == 1
    path.unlink()
    path.write_bytes(b"x" * (in_job_journal.MAX_BYTES + 1))
    decisions, problems = in_job_journal.read(run_dir)
    assert decisions == [] and "bytes" in problems[0]


def _submitted_run(ledger: Ledger, run_dir: Path) -> None:
    """Run r1 as submit leaves it: its config recorded in the ledger, its job 7 submitted (the ingest takes only
    lines of the run's own jobs, and each repair's patch into the ledger's copy of the config)."""
    ledger.add_run("r1", "n", str(run_dir))
    run_config.record(ledger, "r1", build_config([{"train": {"micro_batch_size": 4}}]), "submitted (submit)")
    ledger.record_submitted(ledger.record_intent("r1", "slurm", str(run_dir / "config.yaml"), "submit"), "7")


def test_ingest_records_each_line_once_as_a_job_decision(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    _submitted_run(ledger, tmp_path / "run")
    journal = Journal(ledger)
    said = []
    ingest = InJobIngest(ledger, journal, lambda run, text: said.append(text))
    path = rundir.in_job_journal_path(tmp_path / "run")
    path.parent.mkdir(parents=True)
    path.write_text(in_job_journal.encode(_decision(1, before={"train.micro_batch_size": 4})) + "garbage\n")
    assert [d.seq for d in ingest.tick("r1")] == [1]
    assert ingest.tick("r1") == []  # unchanged file: not read again
    with path.open("a") as f:
        f.write(in_job_journal.encode(_decision(2)))
    assert [d.seq for d in ingest.tick("r1")] == [2]
    again = InJobIngest(ledger, journal, lambda run, text: None)  # a restarted watcher
    assert again.tick("r1") == []
    records = [rec for _, _, rec in journal.audit_records("r1")]
    assert [r["in_job_seq"] for r in records] == [1, 2]
    first = records[0]
    assert first["decided_in"] == "job" and first["cause"] == "gpu_oom" and first["attempt"] == 1
    assert first["decision"]["action"] == in_job_journal.ACTION and first["step"] == 3
    assert first["config_diff"] == {"train.micro_batch_size": {"from": 4, "to": 2}}
    assert ledger.decisions("r1") == []  # the watcher's per-attempt decisions are untouched
    assert sum("skipped line 2" in text for text in said) == 1
    assert run_config.current(ledger, "r1").train.micro_batch_size == 2  # the repair reached the watcher's copy


def test_ingest_never_raises(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    _submitted_run(ledger, tmp_path / "run")
    said = []
    ingest = InJobIngest(ledger, SimpleNamespace(), lambda run, text: said.append(text))
    path = rundir.in_job_journal_path(tmp_path / "run")
    path.parent.mkdir(parents=True)
    path.write_text(in_job_journal.encode(_decision(1)))
    assert ingest.tick("r1") == [] and "not read" in said[0]  # a broken journal object: said, not raised
    assert ingest.tick("missing-run") == []


# --- 2 ranks on the CPU ---------------------------------------------------------------------------------
def _two_ranks(tmp_path: Path, faults, retries=2, ckpt_every=2, as_submitted=False):
    """``as_submitted``: the config snapshot is the run directory's ``config.yaml``, as ``submit`` writes it."""
    run_dir = tmp_path / "run"
    cfg = snapshot(rundir.config_path(run_dir) if as_submitted else tmp_path / "cfg.yaml",
                   train={"max_steps": 6, "ckpt_every": ckpt_every, "micro_batch_size": 4},
                   slurm={"tasks_per_node": 2}, faults=faults, resilience={"in_job_retries": retries})
    return run_dir, run_ranks(cfg, run_dir, world=2)


def _steps_logged(out):
    return sorted(int(line.split()[2]) for line in out.splitlines() if line.startswith("[hpc_agent] step "))


def _journal(run_dir):
    decisions, problems = in_job_journal.read(run_dir)
    assert problems == []
    return decisions


@pytest.mark.slow
def test_two_ranks_repair_an_injected_oom_in_the_same_processes(tmp_path):
    run_dir, results = _two_ranks(tmp_path, {"oom_above_micro_batch": 2}, as_submitted=True)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
        assert "fault: out of memory in forward" in r.stdout
    out = results[0].stdout
    assert "in-job repair 1 of 2: gpu_oom at step 1" in out and "done: 6 steps" in out
    assert "global batch 8 = 4 x 1 x 2 ranks" in out
    (d,) = _journal(run_dir)
    assert d.patch == {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}  # 2 x 2 x 2 = 8: kept
    assert (d.cause, d.step, d.budget_left, d.attempt) == ("gpu_oom", 1, 1, 0)
    assert _steps_logged(out) == [1, 2, 3, 4, 5, 6]
    # the next job of the run (a successor, a resubmission) loads config.yaml: it starts with the repair
    assert "in-job repair settings carried into config.yaml for later attempts" in out
    train = load_run_config(run_dir).train
    assert (train.micro_batch_size, train.grad_accum_steps, train.lr) == (2, 2, 1e-3)


@pytest.mark.slow
def test_an_oom_past_the_first_step_resumes_from_the_state_before_it_and_redoes_no_step(tmp_path):
    """No checkpoint since the start (ckpt_every 100): the state before step 4, intact after an OOM in its forward,
    is saved and loaded, so step 4 is the only step trained twice (its forward failed) and 1-3 are not redone."""
    run_dir, results = _two_ranks(tmp_path, {"oom_at_step": 4}, ckpt_every=100)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
    out = results[0].stdout
    assert "in-job repair 1 of 2: gpu_oom at step 4" in out and "done: 6 steps" in out
    assert "checkpoint step_00000003 complete" in out and "resumed at step 3" in out
    (d,) = _journal(run_dir)
    assert d.patch == {"train.micro_batch_size": 2, "train.grad_accum_steps": 2}  # the global batch is kept
    assert (d.cause, d.step, d.rollback_to_step) == ("gpu_oom", 4, None)
    assert _steps_logged(out) == [1, 2, 3, 4, 5, 6]
    # started by hand on a config elsewhere: that file is not the job's to change, and none is made
    assert "not carried into config.yaml: the run directory has none" in out
    assert not rundir.config_path(run_dir).exists() and "micro_batch_size: 4" in (tmp_path / "cfg.yaml").read_text()


@pytest.mark.slow
def test_two_ranks_roll_back_an_injected_nan_with_a_lower_lr(tmp_path):
    run_dir, results = _two_ranks(tmp_path, {"nan_at_step": 4}, as_submitted=True)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
    out = results[0].stdout
    assert "in-job repair 1 of 2: nan_loss at step 4" in out and "done: 6 steps" in out
    assert "resumed at step 2" in out and "train.lr 0.0005" in out
    (d,) = _journal(run_dir)
    assert (d.cause, d.patch, d.rollback_to_step, d.step) == ("diverged", {"train.lr": 5e-4}, 2, 4)
    after = [line for line in out.splitlines() if line.startswith("[hpc_agent] step 3 ")]
    assert len(after) == 2 and "lr 5.000e-04" in after[1]  # step 3 again, at half the learning rate
    assert "loss nan" not in out
    assert load_run_config(run_dir).train.lr == 5e-4  # and so does every later job of the run


@pytest.mark.slow
def test_budget_zero_exits_with_the_old_exit_code(tmp_path):
    run_dir, results = _two_ranks(tmp_path, {"oom_above_micro_batch": 2}, retries=0)
    for r in results:
        assert r.returncode == EXIT_OUT_OF_MEMORY, r.stdout[-4000:]
        assert f"out of memory at step 1 during training (micro_batch_size 4, ZeRO-1); exiting " \
               f"{EXIT_OUT_OF_MEMORY}" in r.stdout
    assert not rundir.in_job_journal_path(run_dir).exists()


# --- the job's loss history is cut to its last HISTORY points -------------------------------------------
def _noisy_healthy_loss(seed, n):
    """A falling training loss with multiplicative per-batch noise (log-sd 0.3), like the classifier's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    steps = np.arange(1, n + 1)
    trend = 0.25 + 0.6 * np.exp(-steps / 150)
    return [(int(s), float(v)) for s, v in zip(steps, trend * np.exp(0.3 * rng.standard_normal(n)))]


class _OneRank:
    @staticmethod
    def broadcast_object(value):
        return value


def _recovery(tmp_path):
    from hpc_agent.config.load import build_config
    from launch.recovery import InJobRecovery

    return InJobRecovery(build_config([{}]), tmp_path, 0, 0, _OneRank(), lambda _: None)


@pytest.mark.parametrize("seed", [2, 4])
def test_a_noisy_healthy_loss_past_the_kept_history_is_no_spike(tmp_path, seed):
    """The job keeps its last HISTORY losses. Judged on what was left of their trailing window, the first points
    of the cut history were judged against as few as 10 points, anew every step, and sooner or later one looked
    like a spike: the rollback went back hundreds of steps (10 of 20 classifier runs at 1:50 imbalance)."""
    from launch.recovery import HISTORY

    series = _noisy_healthy_loss(seed, 1500)
    history, old_verdict = [], None
    for step, value in series:  # what the job did before: the cut history judged whole
        history = (history + [(step, value)])[-HISTORY:]
        old_verdict = divergence_fault(history, [], step, 1.0, True)
        if old_verdict:
            break
    assert old_verdict is not None and old_verdict.divergence_step < step - HISTORY + 60, old_verdict
    recovery = _recovery(tmp_path)
    assert [f for s, v in series if (f := recovery.observe(s, v, None, 1.0))] == []
    assert recovery.cut and len(recovery.losses) == HISTORY


def test_a_real_spike_after_the_history_was_cut_is_still_found(tmp_path):
    series = _noisy_healthy_loss(0, 1000) + [(s, 3.0) for s in range(1001, 1010)]
    recovery = _recovery(tmp_path)
    found = [(s, f) for s, v in series if (f := recovery.observe(s, v, None, 1.0))]
    step, fault = found[0]
    assert (step, fault.kind, fault.divergence_step) == (1002, "loss_spike", 1001)  # the detector's patience: 2


@pytest.mark.parametrize("reason, kind", [
    (adaptation_reason("warm_restart", "train plateau: best 2.49"), "warm_restart"),
    (adaptation_reason("lr_decay", "gradient norm 96 > 10 x median"), "lr_decay"),
    ("escalate_rollback", "escalate_rollback"),
    ("\x1b[2Jsomething: else", None), ("", None), ("warm_restarts: typo", None),
])
def test_an_adaptations_kind_is_read_back_from_its_reason(reason, kind):
    assert adaptation_kind(reason) == kind


def test_an_adaptation_reason_is_clipped_to_the_journal_limit():
    assert len(adaptation_reason("lr_decay", "x" * (2 * in_job_journal.MAX_TEXT))) == in_job_journal.MAX_TEXT


def _with_spikes(seed, n, at, height):
    series = _noisy_healthy_loss(seed, n)
    return [(s, v * height if s in at else v) for s, v in series]


@pytest.mark.parametrize("seed, spikes", [
    (0, ()), (1, (300, 301)), (3, (120, 121, 122)), (5, (70, 71)), (6, (260, 261, 700, 701)), (7, (999,)),
])
def test_judging_only_the_newest_points_finds_what_the_whole_kept_history_finds(tmp_path, seed, spikes):
    """observe judges the newest JUDGED_EACH_STEP points after WINDOW points of context (not the whole kept
    history, ~3.7 ms a step). A point's trailing window never changes once logged, so step by step it must
    reach the verdicts that judging the whole kept history reached (with the cut history's context rule),
    spikes early (inside the first HISTORY steps), late and never finished (a one-point blip) included."""
    from launch.recovery import HISTORY, WINDOW

    series = _with_spikes(seed, 1000, set(spikes), 12.0)
    recovery, history, cut = _recovery(tmp_path), [], False
    verdicts_new, verdicts_old = [], []
    for step, value in series:
        history.append((step, value))
        if len(history) > HISTORY:
            history, cut = history[-HISTORY:], True
        old = divergence_fault(history, [], step, 1.0, True, cut=cut)
        new = recovery.observe(step, value, None, 1.0)
        verdicts_old.append(old and (step, old.kind, old.divergence_step))
        verdicts_new.append(new and (step, new.kind, new.divergence_step))
        if old or new:  # the job repairs (and forgets what it rolled back) at the first verdict
            break
    assert verdicts_new == verdicts_old
    fired = [v for v in verdicts_new if v]
    assert (fired[0][2] if fired else None) == (spikes[0] if len(spikes) >= 2 else None)
    assert len(recovery.losses) <= HISTORY and WINDOW < HISTORY


def _series_with_faults(seed: int, n: int = 700):
    """A noisy healthy loss with spikes of several heights and lengths, and a plateau jump."""
    import numpy as np

    rng = np.random.default_rng(seed)
    series = dict(_noisy_healthy_loss(seed, n))
    for _ in range(8):
        start, length, height = int(rng.integers(15, n - 5)), int(rng.integers(1, 4)), float(rng.uniform(1.2, 40))
        for s in range(start, start + length):
            series[s] *= height
    return sorted(series.items())


@pytest.mark.parametrize("seed", range(6))
def test_the_per_step_precheck_finds_what_the_full_detector_finds(tmp_path, seed):
    """observe() runs the detector only when the newest loss may be a spike point (newest_loss_may_alarm). At
    every step its verdict must be the detector's on the same history. Each alarm is followed by what the job
    does after it: a rollback to before the spike (restarted_at), so no alarm is found twice."""
    from launch.recovery import JUDGED_EACH_STEP, WINDOW

    recovery = _recovery(tmp_path)
    history, cut, alarms = [], False, 0
    for step, value in _series_with_faults(seed):
        history.append((step, value))
        if len(history) > 200:
            history, cut = history[-200:], True
        view, view_cut = (history[-(WINDOW + JUDGED_EACH_STEP):], True) if len(history) > WINDOW + JUDGED_EACH_STEP \
            else (history, cut)
        full = divergence_fault(view, [], step, 1.0, True, cut=view_cut)
        assert recovery.observe(step, value, None, 1.0) == full, step
        if full is not None:
            alarms += 1
            recovery.restarted_at(full.divergence_step - 1, None)
            history = [p for p in history if p[0] < full.divergence_step]
    assert alarms >= 3  # the series did raise alarms


def test_the_precheck_margin_and_edges():
    from hpc_agent.metrics.divergence import newest_loss_may_alarm

    flat = [1.0 + 0.01 * (i % 3) for i in range(60)]
    assert not newest_loss_may_alarm([], window=50)
    assert not newest_loss_may_alarm(flat, window=50, rel_floor=0.05)
    assert newest_loss_may_alarm(flat + [float("nan")], window=50)
    assert newest_loss_may_alarm(flat + [float("inf")], window=50)
    assert newest_loss_may_alarm([float("nan")] + flat[:20] + [1.0], window=50)  # a non-finite point in view
    assert not newest_loss_may_alarm(flat[:5] + [100.0], window=50)  # fewer than min_history: not judged yet
    # the threshold: med 1.01, scale max(1.4826 * MAD, 0.05 * med); 0.9 of 6 sigmas is the margin
    med, scale = 1.01, 0.05 * 1.01
    assert newest_loss_may_alarm(flat + [med + 5.5 * scale], window=50, rel_floor=0.05)
    assert not newest_loss_may_alarm(flat + [med + 5.3 * scale], window=50, rel_floor=0.05)


def _submitted(tmp_path, **train):
    from hpc_agent.config.load import write_run_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_run_config(run_dir, _cfg(**train))
    return run_dir


def test_a_repair_is_carried_into_the_runs_config_for_later_jobs(tmp_path):
    """What the job writes after a repair: config.yaml with the patch applied and nothing else changed, validated,
    written atomically with the folder's mode; a second repair builds on the first."""
    run_dir = _submitted(tmp_path)
    before = load_run_config(run_dir)
    said = carry_into_config(run_dir, {"train.micro_batch_size": 2, "train.grad_accum_steps": 2})
    assert said == "carried into config.yaml for later attempts"
    carry_into_config(run_dir, {"train.lr": 5e-4})
    after = load_run_config(run_dir)
    assert (after.train.micro_batch_size, after.train.grad_accum_steps, after.train.lr) == (2, 2, 5e-4)
    assert after.slurm == before.slurm and after.model == before.model
    assert oct(os.stat(rundir.config_path(run_dir)).st_mode & 0o777) == "0o600"
    assert [p.name for p in run_dir.iterdir()] == ["config.yaml"]  # no temp file left
    assert carry_into_config(run_dir, {}) == "nothing to carry"


def test_carrying_refuses_a_link_and_an_invalid_patch_and_leaves_the_file_alone(tmp_path):
    from hpc_agent.config.problems import ConfigError

    run_dir = _submitted(tmp_path)
    text = rundir.config_path(run_dir).read_text()
    with pytest.raises(ConfigError):
        carry_into_config(run_dir, {"train.micro_batch_size": 0})
    assert rundir.config_path(run_dir).read_text() == text
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(text)
    rundir.config_path(run_dir).unlink()
    rundir.config_path(run_dir).symlink_to(elsewhere)
    with pytest.raises(OSError):
        carry_into_config(run_dir, {"train.lr": 5e-4})
    assert elsewhere.read_text() == text and rundir.config_path(run_dir).is_symlink()


def test_every_job_of_a_submitted_run_loads_the_runs_config_yaml(tmp_path):
    """Why carrying into config.yaml reaches later attempts: submit points the job at it, and a hand-over successor
    (the same job script and pickle) and a watcher resubmission (effects._resubmit writes it) do too."""
    from hpc_agent.jobs.submission import job_for

    run_dir = _submitted(tmp_path)
    job = job_for(run_dir, load_run_config(run_dir), rundir.config_path(run_dir))
    assert Path(job.config_path) == rundir.config_path(run_dir)
