"""Job-written files are untrusted (issue 16, item 5): a symbolic link the job plants in its run directory
is never followed out of it. Each reader of job-written files is given such a link to a file or folder
outside the run directory holding data the reader would otherwise accept; the outside data must not show
up, and the reader says why (refused with UnsafeFile, or skipped with a note)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpc_agent.core import checkpoint_format, rundir
from hpc_agent.metrics.tb_reader import RunScalars
from tests.unit.test_review import _write_attempt

OUTSIDE_STEPS = list(range(1000, 1010))


@pytest.fixture
def outside(tmp_path):
    """A folder outside every run dir: an event file with steps 1000..1009, a complete checkpoint, a log."""
    out = tmp_path / "outside"
    (out / "tb").mkdir(parents=True)
    _write_attempt(out / "tb", 7, OUTSIDE_STEPS, time.time() - 900, 1.0)
    ck = out / "ckpt" / checkpoint_format.tag_for(40)
    ck.mkdir(parents=True)
    (ck / "mp_rank_00_model_states.pt").write_bytes(b"w" * 10)
    (ck / checkpoint_format.MARKER).write_text(json.dumps({"step": 40, "files": {"mp_rank_00_model_states.pt": 10}}))
    (out / "secret.log").write_text("[hpc_agent] step 3 loss 2.5\nsecret\n")
    return out


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "runs" / "r-1"
    (run / "tb").mkdir(parents=True)
    _write_attempt(run / "tb", 0, list(range(1, 11)), time.time() - 600, 1.0)
    (run / "config.yaml").write_text("run: {name: r}\n")
    return run


def _steps(scalars: RunScalars):
    return {p.step for p in scalars.series("train/loss")}


# --- TensorBoard events (review, diagnose --tb, the watcher's alarms, the sweep) ---------------------------
def test_tb_reader_skips_linked_event_files_and_folders(run_dir, outside):
    [event] = list((outside / "tb").iterdir())
    (run_dir / "tb" / event.name).symlink_to(event)
    (run_dir / "tb" / "sub").symlink_to(outside / "tb", target_is_directory=True)
    scalars = RunScalars(run_dir / "tb")
    scalars.update()
    assert _steps(scalars) == set(range(1, 11))
    notes = scalars.problems()
    assert len(notes) == 2 and all("symbolic link" in n for n in notes), notes


def test_tb_reader_refuses_a_linked_tb_folder(run_dir, outside):
    import shutil

    shutil.rmtree(run_dir / "tb")
    (run_dir / "tb").symlink_to(outside / "tb", target_is_directory=True)
    scalars = RunScalars(run_dir / "tb")
    assert scalars.update() == 0 and _steps(scalars) == set()
    assert any("symbolic link" in n for n in scalars.problems())


def test_diagnose_tb_reader_does_not_follow_links(run_dir, outside):
    from hpc_agent.diagnose import read_tb_scalars

    [event] = list((outside / "tb").iterdir())
    (run_dir / "tb" / event.name).symlink_to(event)
    read = read_tb_scalars(run_dir / "tb")
    assert {step for step, _ in read["train/loss"]} == set(range(1, 11))


def test_review_notes_links_and_skips_linked_run_dirs(run_dir, outside):
    from hpc_agent.runs.history import find_runs, review_run

    [event] = list((outside / "tb").iterdir())
    (run_dir / "tb" / event.name).symlink_to(event)
    elsewhere = outside / "run-x"
    (elsewhere / "tb").mkdir(parents=True)
    (elsewhere / "config.yaml").write_text("")
    (run_dir.parent / "planted").symlink_to(elsewhere, target_is_directory=True)
    root, dirs = find_runs(run_dir.parent)
    assert dirs == [run_dir.resolve()]
    review = review_run(run_dir, root)
    assert review["step"] == 10 and review["steps"]["count"] == 10
    assert any("symbolic link" in n for n in review["notes"])


# --- checkpoints (the job's resume, the watcher's rollback, retention) ---------------------------------------
def _complete(root: Path, step: int) -> None:
    ck = root / checkpoint_format.tag_for(step)
    ck.mkdir(parents=True)
    (ck / "mp_rank_00_model_states.pt").write_bytes(b"m" * 5)
    (ck / checkpoint_format.MARKER).write_text(json.dumps({"step": step, "files": {"mp_rank_00_model_states.pt": 5}}))


def test_a_linked_checkpoint_folder_is_skipped_with_the_reason(run_dir, outside):
    root = run_dir / "checkpoints"
    _complete(root, 20)
    (root / checkpoint_format.tag_for(40)).symlink_to(outside / "ckpt" / checkpoint_format.tag_for(40))
    selection = checkpoint_format.select(checkpoint_format.scan(root))
    assert selection.chosen.step == 20
    assert "symbolic link" in selection.skipped[0][1]
    assert checkpoint_format.complete_steps(run_dir) == [20]
    assert any("skipping checkpoint step_00000040" in line for line in selection.lines())


def test_a_linked_shard_or_marker_makes_a_checkpoint_unusable(run_dir, outside):
    root = run_dir / "checkpoints"
    _complete(root, 10)
    _complete(root, 30)
    shard = root / checkpoint_format.tag_for(30) / "mp_rank_00_model_states.pt"
    shard.unlink()
    shard.symlink_to(outside / "ckpt" / checkpoint_format.tag_for(40) / "mp_rank_00_model_states.pt")
    _complete(root, 50)
    marker = root / checkpoint_format.tag_for(50) / checkpoint_format.MARKER
    marker.unlink()
    marker.symlink_to(outside / "ckpt" / checkpoint_format.tag_for(40) / checkpoint_format.MARKER)
    selection = checkpoint_format.select(checkpoint_format.scan(root))
    assert selection.chosen.step == 10
    reasons = dict(selection.skipped)
    assert "symbolic link" in reasons[checkpoint_format.tag_for(30)]
    assert "symbolic link" in reasons[checkpoint_format.tag_for(50)]


def test_a_linked_checkpoints_root_is_refused(run_dir, outside):
    (run_dir / "checkpoints").symlink_to(outside / "ckpt", target_is_directory=True)
    with pytest.raises(rundir.UnsafeFile, match="symbolic link"):
        checkpoint_format.scan(run_dir / "checkpoints")
    with pytest.raises(rundir.UnsafeFile):
        checkpoint_format.complete_steps(run_dir)
    with pytest.raises(rundir.UnsafeFile):
        checkpoint_format.set_aside_after(run_dir, 0, None)
    assert (outside / "ckpt" / checkpoint_format.tag_for(40) / checkpoint_format.MARKER).exists()


def test_retention_never_deletes_through_a_link(run_dir, outside):
    from launch.checkpoint import apply_retention

    root = run_dir / "checkpoints"
    _complete(root, 10)
    _complete(root, 50)
    (root / checkpoint_format.tag_for(40)).symlink_to(outside / "ckpt" / checkpoint_format.tag_for(40))
    apply_retention(root, keep=1)
    target = outside / "ckpt" / checkpoint_format.tag_for(40)
    assert (target / checkpoint_format.MARKER).exists() and (target / "mp_rank_00_model_states.pt").exists()


# --- logs (diagnose, the watcher's evidence) --------------------------------------------------------------
def test_a_linked_log_is_refused_by_the_reader(run_dir, outside):
    (run_dir / "slurm").mkdir()
    (run_dir / "slurm" / "7_0_log.out").symlink_to(outside / "secret.log")
    [path] = rundir.find_logs(run_dir, "7").paths
    with pytest.raises(rundir.UnsafeFile, match="symbolic link"):
        rundir.tail_log(path, 4096)


def test_a_linked_slurm_folder_is_not_searched(run_dir, outside):
    (outside / "slurm").mkdir()
    (outside / "slurm" / "7_0_log.out").write_text("secret\n")
    (run_dir / "slurm").symlink_to(outside / "slurm", target_is_directory=True)
    paths = list(rundir.find_logs(run_dir, "7").paths)
    assert paths == [run_dir / "slurm"]
    with pytest.raises(rundir.UnsafeFile, match="symbolic link"):
        rundir.tail_log(paths[0], 4096)


def test_diagnose_refuses_a_linked_log_and_still_diagnoses_with_exit_1(run_dir, outside, capsys):
    """The run dir's log is the job's file: refused and said (exit 1, issue 42 finding 4), the diagnosis goes on."""
    from hpc_agent import diagnose
    from hpc_agent.slurm.job_match import job_name_for

    (run_dir / "slurm").mkdir()
    (run_dir / "slurm" / "7_0_log.out").symlink_to(outside / "secret.log")
    sacct = run_dir.parent.parent / "sacct.txt"
    sacct.write_text(f"JobID|JobName|State|ExitCode\n7|{job_name_for(run_dir.name)}|FAILED|1:0\n")
    code = diagnose.main(["7", "--sacct-file", str(sacct), "--runs-root", str(run_dir.parent)])
    captured = capsys.readouterr()
    err = captured.err
    assert code == 1 and "symbolic link" in err and "secret" not in err and "Traceback" not in err
    assert captured.out.startswith("job 7: ")  # diagnosed from sacct all the same
