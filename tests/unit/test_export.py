"""hpc-agent export: the pure choice of checkpoint and metric direction (tables), the README, and the command's
exit-2 cases on run directories made here (no torch: the consolidation is a stand-in; tests/job/test_export_weights.py
runs the real one on trained runs)."""
from __future__ import annotations

import json
import os

import pytest

from hpc_agent import export
from hpc_agent.__main__ import main as front_door
from hpc_agent.runs.export_plan import (MAX, MIN, Ckpt, ExportError, complete_checkpoints, default_mode, load_code,
                                        metadata, pick, readme)
from tests.helpers.export_run import make_run, stand_in_weights

C = [Ckpt(2, "step_00000002"), Ckpt(4, "step_00000004"), Ckpt(6, "step_00000006")]


@pytest.mark.parametrize("metric,mode", [
    ("eval/loss", MIN), ("train/loss", MIN), ("val_perplexity", MIN), ("eval/error_rate", MIN), ("eval/ppl", MIN),
    ("eval/bits_per_byte", MIN), ("test/mse", MIN), ("eval/accuracy", MAX), ("eval/macro_f1", MAX),
    ("eval/balanced_accuracy", MAX), ("val/auc", MAX), ("eval/bleu", MAX),
    ("train/lr", None), ("perf/samples_per_s", None), ("eval/temperature", None),
])
def test_default_mode(metric, mode):
    assert default_mode(metric) == mode


def test_complete_checkpoints_prefers_the_full_checkpoint_and_reports_broken_steps():
    found = [(2, "step_00000002", None), (4, "snap_00000004", None), (4, "step_00000004", None),
             (6, "step_00000006", "no COMPLETE.json"), (8, "snap_00000008", None), (8, "step_00000008", "x is missing")]
    ckpts, broken = complete_checkpoints(found)
    assert ckpts == [Ckpt(2, "step_00000002"), Ckpt(4, "step_00000004"), Ckpt(8, "snap_00000008")]
    assert broken == {6: "step_00000006: no COMPLETE.json"}  # 8 has a complete snapshot


def test_pick_newest_and_step():
    assert pick(C, {}, "r").ckpt.step == 6
    assert pick(C, {}, "r", step=4).ckpt == C[1]


@pytest.mark.parametrize("series,mode,metric,step", [
    ({2: 3.0, 4: 1.0, 6: 2.0}, None, "eval/loss", 4),          # lowest loss
    ({2: 0.5, 4: 0.7, 6: 0.6}, None, "eval/accuracy", 4),      # highest accuracy
    ({2: 0.5, 4: 0.7, 6: 0.6}, MIN, "eval/accuracy", 2),       # --mode overrides the name
    ({1: 0.1, 2: 3.0, 3: 0.0, 4: 2.0}, None, "eval/loss", 4),  # only checkpoint steps count
    ({2: 1.0, 4: 1.0}, None, "eval/loss", 4),                  # a tie: the later step
    ({2: 1.0, 4: float("nan"), 6: 2.0}, None, "eval/loss", 2),  # NaN never wins
])
def test_pick_best(series, mode, metric, step):
    chosen = pick(C, {}, "r", metric=metric, mode=mode, series=series, tags=[metric])
    assert chosen.ckpt.step == step and metric in chosen.why and f"at step {step}" in chosen.why


@pytest.mark.parametrize("kwargs,ckpts,broken,words", [
    ({}, [], {}, ["has no complete checkpoint", "train.ckpt_every"]),
    ({}, [], {4: "step_00000004: no COMPLETE.json"}, ["incomplete: step_00000004: no COMPLETE.json"]),
    ({"step": 5}, C, {}, ["no complete checkpoint of step 5", "steps 2, 4, 6"]),
    ({"step": 8}, C, {8: "step_00000008: x is missing"}, ["step 8: step_00000008: x is missing"]),
    ({"metric": "train/lr", "tags": ["train/lr"]}, C, {}, ["--mode min", "--mode max"]),
    ({"metric": "eval/loss", "tags": ["train/loss"]}, C, {}, ["no such TensorBoard scalar", "train/loss"]),
    ({"metric": "eval/loss", "tags": []}, C, {}, ["no TensorBoard event files"]),
    ({"metric": "eval/loss", "tags": ["eval/loss"], "series": {3: 1.0, 5: 2.0}}, C, {},
     ["no complete checkpoint's step", "logged at steps 3, 5", "train.eval_every"]),
])
def test_pick_errors_name_the_fix(kwargs, ckpts, broken, words):
    with pytest.raises(ExportError) as err:
        pick(ckpts, broken, "r", **kwargs)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_load_code_per_workload():
    gpt = load_code("gpt", {}, "/runs/r/config.yaml")
    assert "ByteGPT(config[\"n_layers\"]" in gpt and "load_state_dict(load_file(\"model.safetensors\"))" in gpt
    mlp = load_code("classifier", {"net.0.weight": (64, 12), "net.3.weight": (64, 64), "net.6.weight": (5, 64)}, "c")
    assert "MLP(12, 5, config[\"d_model\"], config[\"n_layers\"])" in mlp
    user = load_code("my_model.model:Factory.make", {}, "/runs/r/config.yaml")
    assert "from my_model.model import Factory" in user and 'Factory.make(cfg, "cpu").model' in user
    assert 'load_snapshot("/runs/r/config.yaml")' in user
    odd = load_code("not a ref; rm -rf", {}, "c")  # never turned into an import line
    assert "import not" not in odd and "model = ..." in odd
    for code in (gpt, mlp, user, odd):
        compile(code, "<readme>", "exec")


def test_readme_and_metadata():
    text = readme("run-1", 40, "step_00000040", "the newest complete checkpoint (step 40)", "gpt",
                  {"zero_stage": 3, "world_size": 2, "precision": "bf16", "offload": "none"},
                  {"eval/loss": 1.234567, "bad|\x1b[31m": 2.0}, "model = 1", {"head.weight": "emb.weight"},
                  "the FP32 master weights", 3, 1000)
    assert text.startswith("# run-1, step 40\n")
    for piece in ("checkpoint `step_00000040`", "zero_stage 3, world_size 2, precision bf16, offload none",
                  "| `eval/loss` | 1.23457 |", "```python\nmodel = 1\n```", "`head.weight` = `emb.weight`",
                  "3 tensors, 1,000 values"):
        assert piece in text, piece
    assert "\x1b" not in text and "bad\\|?[31m" in text  # a job-written tag cannot break the table or the screen
    assert "None logged at this step." in readme("r", 1, "t", "w", "gpt", {}, {}, "m", {}, "s", 1, 1)
    meta = metadata("r", 40, "gpt", {"b": "a"})
    assert meta["hpc_agent.step"] == "40" and json.loads(meta["hpc_agent.tied"]) == {"b": "a"}
    assert all(isinstance(v, str) for v in meta.values())


# --- the command -----------------------------------------------------------------------------------------------
def test_help(capsys):
    assert front_door(["export", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage:" in out and "--best METRIC" in out and "--force" in out and "Exit codes: 0 ok, 2 usage" in out
    assert front_door(["--help"]) == 0 and "  export " in capsys.readouterr().out


@pytest.fixture
def stand_in(monkeypatch):
    monkeypatch.setattr(export, "export_weights", stand_in_weights)


def test_exports_the_newest_with_readme_and_config(tmp_path, stand_in, capsys):
    run_dir = make_run(tmp_path / "runs", scalars={"eval/loss": {2: 3.0, 4: 2.5}, "train/loss": {4: 2.4}},
                       workload="classifier")
    out = tmp_path / "out"
    assert export.main([str(run_dir), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("exported run run1 step 4 (step_00000004) to ") and captured.out.count("\n") == 1
    assert "the newest complete checkpoint (step 4)" in captured.err  # progress: stderr
    assert json.loads((out / "model.safetensors").read_text())["tag"] == "step_00000004"
    assert json.loads((out / "config.json").read_text())["d_model"] == 64
    text = (out / "README.md").read_text()
    assert "| `eval/loss` | 2.5 |" in text and "| `train/loss` | 2.4 |" in text and "MLP(5, 3," in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "runs"]  # no staging folder left
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        n: 0o666 & ~umask for n in ("README.md", "config.json", "model.safetensors")}


def test_run_id_under_the_runs_root_and_best(tmp_path, stand_in, capsys):
    root = tmp_path / "runs"
    make_run(root, "r7", complete=(2, 4, 6), scalars={"eval/macro_f1": {2: 0.5, 4: 0.9, 6: 0.7}})
    assert export.main(["r7", "--runs-root", str(root), "--best", "eval/macro_f1", "--out", str(tmp_path / "o")]) == 0
    assert "step 4 " in capsys.readouterr().out


def test_force_replaces_our_files_and_keeps_others(tmp_path, stand_in, capsys):
    run_dir = make_run(tmp_path / "runs")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "README.md").write_text("old")
    assert export.main([str(run_dir), "--out", str(out), "--step", "2"]) == 2
    assert "is not empty" in capsys.readouterr().err and (out / "README.md").read_text() == "old"
    assert export.main([str(run_dir), "--out", str(out), "--step", "2", "--force"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and "step 2" in (out / "README.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_empty_out_dir_is_used(tmp_path, stand_in):
    out = tmp_path / "out"
    out.mkdir()
    assert export.main([str(make_run(tmp_path / "runs")), "--out", str(out)]) == 0
    assert (out / "README.md").is_file()


@pytest.mark.parametrize("setup,argv,words", [
    (lambda t: make_run(t / "runs", complete=(), torn=(3,)), [], ["has no complete checkpoint", "no COMPLETE.json"]),
    (lambda t: make_run(t / "runs"), ["--step", "3"], ["no complete checkpoint of step 3", "steps 2, 4"]),
    (lambda t: make_run(t / "runs", scalars={"train/loss": {2: 1.0}}), ["--best", "eval/loss"],
     ["no such TensorBoard scalar", "train/loss"]),
    (lambda t: make_run(t / "runs", scalars={"train/lr": {2: 1.0}}), ["--best", "train/lr"], ["--mode min"]),
    (lambda t: make_run(t / "runs"), ["--mode", "min"], ["--mode goes with --best"]),
    (lambda t: make_run(t / "runs") and None, ["--runs-root", "{tmp}/runs"], ["'nosuchrun' is not a run; tried a run id in the ledger", "give a run id"]),
    (lambda t: (make_run(t / "runs") / "config.yaml").unlink(), [], ["cannot read its config"]),
    (lambda t: (t / "out").write_text("x"), [], ["exists and is not a folder"]),
])
def test_usage_errors_exit_2_without_traceback(tmp_path, stand_in, capsys, setup, argv, words):
    setup(tmp_path)
    run = str(tmp_path / "runs" / "run1") if "--runs-root" not in argv else "nosuchrun"
    code = export.main([run, "--out", str(tmp_path / "out"), *[a.format(tmp=tmp_path) for a in argv]])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("export: ")
    for word in words:
        assert word in err, err


def test_a_consolidation_failure_is_exit_2(tmp_path, monkeypatch, capsys):
    def broken(tag_dir, dest, meta):
        raise RuntimeError("unpickling stack underflow")

    monkeypatch.setattr(export, "export_weights", broken)
    out = tmp_path / "out"
    assert export.main([str(make_run(tmp_path / "runs")), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "consolidating checkpoint step_00000004 failed (RuntimeError: unpickling stack underflow)" in err
    assert "other complete steps: 2" in err and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_argparse_usage_errors(capsys):
    assert front_door(["export", "r"]) == 2  # --out is required
    assert front_door(["export", "r", "--out", "o", "--step", "2", "--best", "eval/loss"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
