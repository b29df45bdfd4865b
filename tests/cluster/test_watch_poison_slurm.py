"""Must-show: one poisoned run never stops the watcher from following the others (real localhost Slurm).

Two runs under one ``python -m hpc_agent.watch``. While both train, run A gets four poisons at once:
a corrupt TensorBoard tail, an invalid ``config.yaml``, its stdout log replaced by a FIFO and its
stderr log by a symbolic link to ``/dev/zero``. Then A's training process is killed: the cgroup OOM
killer's SIGKILL (the job's chaos runtime trigger allocates past ``--mem``), an end the watcher would
otherwise answer with a resubmission (host_oom), unlike a kill -9 or ``scancel --signal=KILL`` (code
error / cancelled: both are stopped anyway). Run B is then preempted by a high-partition job on its node.

Expected: B is expedited and resumes from its signal checkpoint, A is parked in ``needs_attention``
with a readable reason naming every problem of the files it reads (and a note about the skipped TensorBoard
record; the invalid ``config.yaml`` is the job's copy, which the watcher never acts on: it keeps its own in the
ledger, hpc_agent/state/run_config.py), A is not resubmitted, and the watcher process stays up with no traceback
in its output.
"""
from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest

from hpc_agent.metrics.tb_reader import EVENT_GLOB, file_order_key
from hpc_agent.state.journal import Journal
from hpc_agent.state.ledger import Ledger
from tests.slurm_helpers import (LONG_RUN, SLURM, WatcherProcess, attempts, cleanup_jobs, end_jobs, events, job_nodes,
                                 last_step, ledger_job_ids, log_text, states, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ENDED = {"FAILED", "OUT_OF_MEMORY", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"}
# Long enough to still be training when poisoned / preempted (~0.03 s a step), with room in the time limit.
COMMON = [*LONG_RUN, "slurm.time=00:15:00"]


def _phase(root: Path, run_id: str) -> str:
    ledger = Ledger.in_runs_root(root)
    try:
        run = ledger.run(run_id)
        return run.phase if run is not None else "?"
    finally:
        ledger.close()


def _audit(root: Path, run_id: str):
    ledger = Ledger.in_runs_root(root)
    try:
        return [rec for _, _, rec in Journal(ledger).audit_records(run_id)]
    finally:
        ledger.close()


def _poison_tensorboard(tb: Path) -> Path:
    """Append a well-framed record whose payload is no Event, then a header with a bad CRC and junk."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    newest = sorted(tb.glob(EVENT_GLOB), key=lambda p: file_order_key(p.name))[-1]
    junk = b"not a protobuf: poisoned by the test\x00\xff"
    length = struct.pack("<Q", len(junk))
    framed = length + struct.pack("<I", masked_crc32c(length)) + junk + struct.pack("<I", masked_crc32c(junk))
    bad_crc = struct.pack("<Q", 4096) + b"\xde\xad\xbe\xef" + os.urandom(64)
    with open(newest, "ab") as fh:
        fh.write(framed + bad_crc)
    return newest


def _poison(run_dir: Path, job: str) -> None:
    _poison_tensorboard(run_dir / "tb")
    (run_dir / "config.yaml").write_text("train: [unclosed\n")
    out, err = run_dir / "slurm" / f"{job}_0_log.out", run_dir / "slurm" / f"{job}_0_log.err"
    out.unlink()
    os.mkfifo(out)
    err.unlink(missing_ok=True)
    err.symlink_to("/dev/zero")


def _oom_kill(run_dir: Path) -> None:
    """The job's runtime trigger: rank 0 touches 4 GB under a 2G cgroup, and the kernel SIGKILLs it."""
    chaos = run_dir / "chaos"
    chaos.mkdir(exist_ok=True)
    tmp = chaos / "inject.json.tmp"
    tmp.write_text(json.dumps({"kind": "host_oom", "nonce": f"poison-{time.time_ns()}", "mb": 4000}))
    tmp.rename(chaos / "inject.json")


def _preempt_node(node: str, seconds: int = 2) -> str:
    """A high-partition job wanting all of one node (both CPUs, all its memory): Slurm preempts `low` there."""
    out = SLURM.run(["sbatch", "--parsable", "--partition", "high", "--nodelist", node, "--nodes", "1",
                     "--ntasks", "2", "--output", "/dev/null", "--wrap", f"sleep {seconds}"]).stdout
    return out.strip().split(";")[0]


def _would_be_resubmitted(job: str, config_text: str) -> str:
    """What the policy decides for A's end with its unpoisoned config (the logs are unreadable: none)."""
    from hpc_agent.config.load import load_snapshot_text
    from hpc_agent.diagnosis.classify import classify_job
    from hpc_agent.watcher.follow import situation_from
    from hpc_agent.policy.decide import PolicyLimits, decide

    diagnoses = classify_job(attempts(job), (), (), job_id=job)
    decision = decide(diagnoses[-1].cause, (), load_snapshot_text(config_text), situation_from(diagnoses),
                      PolicyLimits(max_mem_mb=6000))
    return f"{diagnoses[-1].cause.value} -> {decision.action}"


def test_poisoned_run_is_parked_and_the_other_run_still_resumes(tmp_path):
    root = tmp_path / "runs"
    extra: list = []
    watcher = None
    try:
        dir_a, job_a = submit(root, *COMMON, "run.name=poisoned", "train.max_steps=20000", "train.ckpt_every=5000",
                              "faults.runtime_trigger=true")
        dir_b, job_b = submit(root, *COMMON, "run.name=healthy", "resilience.successor_on_preempt=false", "train.max_steps=5000", "train.ckpt_every=1000")
        watcher = WatcherProcess(root, interval=1.0)
        wait_for(lambda: last_step(log_text(dir_a, job_a)) >= 20 and last_step(log_text(dir_b, job_b)) >= 20, 180,
                 what="both runs to train")
        clean_config = (dir_a / "config.yaml").read_text()

        # Run A: four poisons at once, then its training process is killed.
        _poison(dir_a, job_a)
        _oom_kill(dir_a)
        wait_for(lambda: (s := states(job_a)) and s[-1] in ENDED, 90, what="run A's job to end (OOM kill)")
        assert watcher.proc.poll() is None, "the watcher died on run A's end"

        wait_for(lambda: _phase(root, dir_a.name) == "needs_attention", 60, what="run A to be parked")

        # Run B: preempted on its node after A was parked; the watcher must still follow it.
        (node,) = job_nodes(job_b)
        extra.append(_preempt_node(node))
        wait_for(lambda: "resumed at step" in log_text(dir_b, job_b) and states(job_b)[-1] == "RUNNING", 180,
                 what="run B to resume after its preemption")
        time.sleep(3)  # a few more ticks over the parked run and the resumed one

        # The watcher stayed up and never raised.
        assert watcher.proc.poll() is None, "the watcher process exited"
        out = watcher.output()
        assert "Traceback" not in out

        # A: parked with a readable reason naming every problem, nothing resubmitted, its end classified.
        assert _phase(root, dir_a.name) == "needs_attention"
        parked = [r for r in _audit(root, dir_a.name) if r.get("action") == "needs_attention"]
        assert parked, _audit(root, dir_a.name)
        reason = parked[0]["reason"]
        assert isinstance(reason, str) and "\x00" not in reason and "\ufffd" not in reason, repr(reason)
        # The job's copy of the config is poisoned too, but the watcher acts on the ledger's (state/run_config.py).
        assert "config.yaml" not in reason, reason
        assert f"{job_a}_0_log.out" in reason and "FIFO" in reason, reason
        assert f"{job_a}_0_log.err" in reason and "symbolic link" in reason, reason
        assert any("TensorBoard" in n and "corrupt" in n for n in parked[0].get("notes", [])), parked[0]
        assert [e for e in events(dir_a) if e.get("action") == "needs_attention"][0]["reason"] == reason
        assert "needs attention" in out and dir_a.name in out
        assert ledger_job_ids(root, dir_a.name) == [job_a], "a poisoned run must not be resubmitted"
        assert (dir_a / "config.yaml").read_text() == "train: [unclosed\n"
        verdict = _would_be_resubmitted(job_a, clean_config)
        assert verdict.startswith("host_oom -> "), (verdict, states(job_a))
        assert verdict.endswith(("resubmit", "requeue")), verdict

        # B: expedited after the preemption, resumed in place, still followed.
        assert states(job_b)[:1] == ["REQUEUED"], states(job_b)
        assert _phase(root, dir_b.name) in ("running", "pending"), _phase(root, dir_b.name)
        # One decision to expedite, and one action record of it being carried out (who: the watcher).
        expedites = [e for e in events(dir_b) if e.get("action") == "expedite"]
        assert [bool(e.get("by")) for e in expedites] == [False, True], expedites
        assert expedites[1]["by"]["process"] == "watcher" and expedites[1]["decided_in"] == expedites[0]["seq"]
        assert not [r for r in _audit(root, dir_b.name) if r.get("action") == "needs_attention"]
        assert ledger_job_ids(root, dir_b.name) == [job_b]
        # The preemption was followed after A was parked: one run's trouble did not stop the other.
        assert out.index("needs attention") < out.index("expedite")
    except BaseException:
        if watcher is not None:
            print("---- watcher output ----\n" + watcher.output()[-8000:])
        if (root / "ledger.sqlite").exists():
            for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
                print(f"---- {run_dir.name}: phase {_phase(root, run_dir.name)} ----")
                for rec in _audit(root, run_dir.name):
                    print(json.dumps(rec)[:1500])
        raise
    finally:
        if watcher is not None:
            watcher.stop()
        cleanup_jobs(root)
        if extra:
            end_jobs(extra)
