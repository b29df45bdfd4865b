"""launch.checkpoint: marker checks, selection and retention (tables), disk scan, and an end-to-end
fall-back past a checkpoint with a missing marker or a truncated shard (must-show 4)."""
import json
import os

import pytest

from hpc_agent.core.checkpoint_format import MARKER, Candidate, problem, retention, scan, select, step_of, tag_for
from launch.checkpoint import apply_retention, owned_by

FILES = {"mp_rank_00_model_states.pt": 100, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 50}


def ok(step, files=FILES):
    return Candidate(tag_for(step), step, {"step": step, "files": dict(files)}, None, dict(files))


def no_marker(step):
    return Candidate(tag_for(step), step, None, None, dict(FILES))


def truncated(step):
    return Candidate(tag_for(step), step, {"step": step, "files": dict(FILES)}, None,
                     {**FILES, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 10})


def missing_shard(step):
    return Candidate(tag_for(step), step, {"step": step, "files": dict(FILES)}, None,
                     {"mp_rank_00_model_states.pt": 100})


def bad_json(step):
    return Candidate(tag_for(step), step, None, "JSONDecodeError: Expecting value", dict(FILES))


def wrong_step(step):
    return Candidate(tag_for(step), step, {"step": step - 1, "files": dict(FILES)}, None, dict(FILES))


def empty_list(step):
    return Candidate(tag_for(step), step, {"step": step, "files": {}}, None, dict(FILES))


@pytest.mark.parametrize("candidate,reason", [
    (ok(10), None),
    (no_marker(10), "no COMPLETE.json"),
    (truncated(10), "has 10 bytes, COMPLETE.json recorded 50"),
    (missing_shard(10), "zero_pp_rank_0_mp_rank_00_optim_states.pt is missing"),
    (bad_json(10), "unreadable"),
    (wrong_step(10), "names step 9"),
    (empty_list(10), "lists no files"),
])
def test_problem(candidate, reason):
    found = problem(candidate)
    if reason is None:
        assert found is None
    else:
        assert reason in found


# (candidates, expected chosen step or None, expected skipped names)
SELECT_CASES = [
    ([], None, []),
    ([ok(10), ok(20), ok(30)], 30, []),
    ([ok(10), ok(20), no_marker(30)], 20, [tag_for(30)]),
    ([ok(10), ok(20), truncated(30)], 20, [tag_for(30)]),
    ([ok(10), truncated(20), no_marker(30)], 10, [tag_for(30), tag_for(20)]),
    ([no_marker(10), bad_json(20)], None, [tag_for(20), tag_for(10)]),
    ([ok(30), ok(10), ok(20)], 30, []),                     # order on disk does not matter
    ([truncated(5), ok(10)], 10, []),                       # older broken ones are not mentioned
]


@pytest.mark.parametrize("candidates,chosen,skipped", SELECT_CASES)
def test_select(candidates, chosen, skipped):
    selection = select(candidates)
    assert (selection.chosen.step if selection.chosen else None) == chosen
    assert [name for name, _ in selection.skipped] == skipped
    assert all(why for _, why in selection.skipped)


# (candidates, keep, deleted steps)
RETENTION_CASES = [
    ([], 3, []),
    ([ok(10), ok(20), ok(30)], 3, []),
    ([ok(10), ok(20), ok(30), ok(40)], 3, [10]),
    ([ok(10), ok(20), ok(30), ok(40)], 1, [10, 20, 30]),
    ([ok(10), ok(20), ok(30)], 0, [10, 20]),                 # the newest complete one always stays
    ([ok(10), no_marker(15), ok(20)], 3, [15]),              # incomplete and older than newest complete
    ([ok(10), ok(20), no_marker(30)], 3, []),                # incomplete but newer: left for a post-mortem
    ([no_marker(10), truncated(20)], 1, []),                 # nothing complete: delete nothing
    ([ok(10), truncated(20), ok(30), ok(40)], 2, [10, 20]),
]


@pytest.mark.parametrize("candidates,keep,deleted", RETENTION_CASES)
def test_retention(candidates, keep, deleted):
    assert retention(candidates, keep) == [tag_for(s) for s in deleted]


@pytest.mark.parametrize("name,rank,owned", [
    ("mp_rank_00_model_states.pt", 0, True),
    ("mp_rank_00_model_states.pt", 1, False),
    ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", 1, True),
    ("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", 0, False),
    ("zero_pp_rank_10_mp_rank_00_model_states.pt", 1, False),
    ("zero_pp_rank_10_mp_rank_00_model_states.pt", 10, True),
])
def test_owned_by(name, rank, owned):
    assert owned_by(name, rank) is owned


def test_tags():
    assert tag_for(40) == "step_00000040"
    assert step_of("step_00000040") == 40
    assert step_of("step_00000040_universal") is None and step_of("latest") is None


def _write(root, step, marker=True, sizes=FILES):
    d = root / tag_for(step)
    d.mkdir(parents=True)
    for name, size in sizes.items():
        (d / name).write_bytes(b"x" * size)
    if marker:
        (d / MARKER).write_text(json.dumps({"step": step, "files": FILES}))
    return d


def test_scan_and_apply_retention(tmp_path):
    _write(tmp_path, 10)
    _write(tmp_path, 20, marker=False)
    _write(tmp_path, 30)
    _write(tmp_path, 40)
    (tmp_path / "latest").write_text("step_00000040")   # DeepSpeed's file: ignored
    (tmp_path / ".universal").mkdir()
    broken = _write(tmp_path, 50)
    with open(broken / "zero_pp_rank_0_mp_rank_00_optim_states.pt", "r+b") as handle:
        handle.truncate(7)
    found = scan(tmp_path)
    assert [c.step for c in found] == [10, 20, 30, 40, 50]
    assert select(found).chosen.step == 40
    assert apply_retention(tmp_path, keep=2) == [tag_for(10), tag_for(20)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == [
        tag_for(30), tag_for(40), tag_for(50)]


def test_unreadable_marker(tmp_path):
    d = _write(tmp_path, 10)
    (d / MARKER).write_text("{not json")
    (c,) = scan(tmp_path)
    assert "unreadable" in problem(c)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["marker", "truncate"])
def test_resume_skips_damaged_checkpoint(tmp_path, damage):
    """Must-show 4: the newest checkpoint lost its marker / has a truncated shard -> the previous one
    is used, the skip is explained, and the re-run steps match the original ones."""
    from helpers.common import expect, losses, run, snapshot

    cfg = snapshot(tmp_path / "cfg.yaml", train={"max_steps": 6, "ckpt_every": 2, "keep_checkpoints": 5})
    run_dir = tmp_path / "run"
    first = run(cfg, run_dir)
    expect(first, 0, "checkpoint step_00000006 complete")
    newest = run_dir / "checkpoints" / tag_for(6)
    if damage == "marker":
        (newest / MARKER).unlink()
        why = "no COMPLETE.json"
    else:
        shard = next(p for p in newest.iterdir() if "optim_states" in p.name)
        os.truncate(shard, shard.stat().st_size // 2)
        why = "truncated or rewritten"
    second = run(cfg, run_dir)
    expect(second, 0, f"skipping checkpoint {tag_for(6)}: ", why,
           f"resuming from checkpoint {tag_for(4)} (step 4)")
    assert sorted(losses(second.stdout)) == [5, 6]
    for step in (5, 6):
        assert losses(second.stdout)[step] == pytest.approx(losses(first.stdout)[step], abs=1e-5)


class FakeEngine:
    """Writes what DeepSpeed's save_checkpoint would for one rank of a 2-rank ZeRO-1 job."""

    def __init__(self, rank):
        self.rank = rank
        self.calls = []

    def save_checkpoint(self, root, tag, client_state, save_latest):
        self.calls.append((tag, save_latest))
        d = os.path.join(root, tag)
        os.makedirs(d, exist_ok=True)
        if self.rank == 0:
            with open(os.path.join(d, "mp_rank_00_model_states.pt"), "wb") as f:
                f.write(b"m" * 30)
        with open(os.path.join(d, f"zero_pp_rank_{self.rank}_mp_rank_00_optim_states.pt"), "wb") as f:
            f.write(b"o" * (10 + self.rank))


def test_save_writes_marker_listing_every_ranks_files(tmp_path):
    from launch.checkpoint import save

    rank1 = FakeEngine(1)
    stale = tmp_path / tag_for(7)
    stale.mkdir()
    (stale / "leftover.pt").write_bytes(b"old")   # a torn earlier save of the same step is replaced

    def gather(mine):  # rank 1 writes its shard "concurrently" and reports it
        rank1.save_checkpoint(str(tmp_path), tag_for(7), {}, False)
        return [mine, {"zero_pp_rank_1_mp_rank_00_optim_states.pt": 11}]

    engine = FakeEngine(0)
    tag, seconds = save(engine, tmp_path, 7, {"step": 7}, {"world_size": 2}, 0, lambda: None, gather)
    assert tag == tag_for(7) and engine.calls == [(tag_for(7), False)]  # DeepSpeed's `latest`: never
    marker = json.loads((tmp_path / tag / MARKER).read_text())
    assert marker["files"] == {"mp_rank_00_model_states.pt": 30, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 10,
                               "zero_pp_rank_1_mp_rank_00_optim_states.pt": 11}
    assert marker["step"] == 7 and marker["layout"] == {"world_size": 2}
    assert not (tmp_path / tag / "leftover.pt").exists()
    assert select(scan(tmp_path)).chosen.step == 7


def test_save_refuses_marker_when_a_reported_file_is_not_on_disk(tmp_path, monkeypatch):
    import launch.checkpoint as ck

    monkeypatch.setattr(ck, "CONFIRM_WAIT_S", 0.0)
    gather = lambda mine: [mine, {"zero_pp_rank_1_mp_rank_00_optim_states.pt": 11}]  # noqa: E731
    with pytest.raises(RuntimeError, match="rank_1.*missing"):
        ck.save(FakeEngine(0), tmp_path, 3, {}, {}, 0, lambda: None, gather)
    assert not (tmp_path / tag_for(3) / MARKER).exists()


def test_a_second_rollback_past_a_retrained_step_keeps_both_set_aside_copies(tmp_path):
    """Two divergence rollbacks in one run: the first sets aside step 500, the run trains past 500 again and
    saves it under the same tag, and the second rollback sets that one aside too (it crashed on the name)."""
    from hpc_agent.core import checkpoint_format

    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    for step in (250, 500):
        _write(root, step)
    (root / tag_for(500) / "first").write_text("1")
    assert checkpoint_format.set_aside_after(run_dir, 250, None) == [tag_for(500)]
    _write(root, 500)
    (root / tag_for(500) / "second").write_text("2")
    assert checkpoint_format.set_aside_after(run_dir, 250, None) == [tag_for(500)]
    aside = root / checkpoint_format.ASIDE
    assert sorted(p.name for p in aside.iterdir()) == [tag_for(500), tag_for(500) + ".2"]
    assert (aside / tag_for(500) / "first").read_text() == "1"
    assert (aside / (tag_for(500) + ".2") / "second").read_text() == "2"
    assert [c.step for c in scan(root)] == [250]  # what a resume sees: only the checkpoint kept
