"""Issue 18, must-show 1 and 5, on the real localhost Slurm: your own model from a package outside the repo.

1. The example of docs/your_model.md, written to a temporary folder and selected only by
   ``train.workload: my_model.model:build``, trains, is preempted, resumes and completes under the watcher.
5. A requeued attempt runs the code snapshotted at submit, not the package as edited afterwards.

Submit runs as a subprocess from the package's parent folder (not the repo), so the package is found the
way a user's is: through the submit's working directory, without importing it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpc_agent.core.code_manifest import hash_tree
from tests.conftest import run_cli
from tests.helpers.doc_example import write_package
from tests.slurm_helpers import (SLURM, WatcherProcess, last_step, log_text, preempt_all_nodes, run_phase, states,
                                 wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
WORKLOAD = "train.workload=my_model.model:build"


def _submit(tmp_path: Path, root: Path, *overrides: str) -> tuple[Path, str]:
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", f"run.runs_root={root}",
                   WORKLOAD, "train.log_every=1", *overrides, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "code:         " in proc.stdout, proc.stdout
    (run_dir,) = [p for p in root.iterdir() if p.is_dir()]
    return run_dir, json.loads((run_dir / "run.json").read_text())["job_ids"][-1]


def test_own_model_outside_the_repo_is_preempted_resumes_and_completes(tmp_path, root):
    write_package(tmp_path)
    run_dir, job = _submit(tmp_path, root, "run.name=ownmodel", "resilience.successor_on_preempt=false", "train.max_steps=6000", "train.ckpt_every=2000")
    watcher = WatcherProcess(root)
    try:
        wait_for(lambda: last_step(log_text(run_dir, job)) >= 100, 180, what="the own model to train")
        preempt_all_nodes(seconds=2)
        wait_for(lambda: run_phase(root, run_dir.name) == "completed", 240, what="the run to complete")
        text = log_text(run_dir, job)
        assert re.search(r"\[hpc_agent\] resumed at step \d+", text), text[-3000:]
        assert "done: 6000 steps" in text
        assert "REQUEUED" in states(job) or "PREEMPTED" in states(job), states(job)
        assert text.count("[my_model] version 1") >= 2  # built in both attempts, from the snapshot
    finally:
        watcher.stop()


def test_requeued_attempt_runs_the_snapshot_not_the_edited_checkout(tmp_path, root):
    pkg = write_package(tmp_path)
    run_dir, job = _submit(tmp_path, root, "run.name=snapcode", "resilience.successor_on_preempt=false", "train.max_steps=20000", "train.ckpt_every=5000")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["code_snapshot"]["sha256"] == hash_tree(run_dir / "code")[0]
    assert info["code_snapshot"]["source"] == str(pkg.resolve())

    wait_for(lambda: last_step(log_text(run_dir, job)) >= 50, 180, what="the first attempt to train")
    model = pkg / "model.py"
    model.write_text(model.read_text().replace("[my_model] version 1", "[my_model] version 2"))
    high = preempt_all_nodes(seconds=2)
    wait_for(lambda: states(job)[:1] == ["REQUEUED"] and len(states(job)) == 2, 120, what="the requeued attempt")
    wait_for(lambda: "COMPLETED" in states(high), 60, what="the preempting job")
    SLURM.run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
    text = wait_for(lambda: (t := log_text(run_dir, job)) and re.search(r"resumed at step \d+", t) and t, 180,
                    what="the second attempt to resume")
    second = text[text.index("this attempt ends now"):]  # the requeued attempt's part of the log
    assert "[my_model] version 1" in second, second[-3000:]
    assert "version 2" not in text
    assert text.count("first on the import path") >= 2
    # The snapshot is what run.json says it is, and differs from the edited checkout.
    assert json.loads((run_dir / "run.json").read_text())["code_snapshot"]["sha256"] == hash_tree(run_dir / "code")[0]
    assert "version 1" in (run_dir / "code" / "my_model" / "model.py").read_text()
