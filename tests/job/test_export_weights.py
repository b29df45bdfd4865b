"""hpc-agent export (docs/export.md) against real training runs on the CPU (gloo, FP32).

For each ZeRO stage (0-3, 1 and 2 ranks, and two offloaded layouts) one tiny gpt run trains 4 steps with a
checkpoint and an evaluation every 2 steps. Each checkpoint is exported, the README's own load code builds a fresh
model from the files, and its eval loss on the job's eval set must match the ``eval/loss`` the job logged at that
step to a relative 1e-5. A user workload with tied weights (train.workload=pkg.mod:build) goes the same way.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from helpers.common import run, run_ranks, snapshot, tb_scalars
from hpc_agent import export
from hpc_agent.config.load import load_snapshot
from launch.workloads.registry import build_workload
from tests.conftest import run_cli

TOL = 1e-5
LAYOUTS = [(0, 1, "none"), (0, 2, "none"), (1, 1, "none"), (1, 2, "none"), (2, 1, "none"), (2, 2, "none"),
           (3, 1, "none"), (3, 2, "none"), (2, 2, "optimizer"), (3, 2, "optimizer+params")]


def train(base: Path, name: str, ranks: int, **sections) -> Path:
    """Train 4 steps (checkpoint and eval at 2 and 4) into ``base/name``; the run dir gets its config.yaml, as
    submit writes it."""
    cfg = snapshot(base / f"{name}.yaml", **sections)
    run_dir = base / name
    results = [run(cfg, run_dir)] if ranks == 1 else run_ranks(cfg, run_dir, ranks)
    for r in results:
        assert r.returncode == 0, r.stdout[-4000:]
    shutil.copyfile(cfg, run_dir / "config.yaml")
    return run_dir


STEPS = {"max_steps": 4, "ckpt_every": 2, "eval_every": 2, "precision": "fp32"}


@pytest.fixture(scope="module", params=LAYOUTS, ids=[f"zero{s}-{w}rank{'s' * (w > 1)}-offload_{o}" for s, w, o in LAYOUTS])
def trained(request, tmp_path_factory):
    stage, ranks, offload = request.param
    base = tmp_path_factory.mktemp(f"z{stage}w{ranks}")
    return request.param, train(base, "run", ranks, train={**STEPS, "zero_stage": stage, "offload": offload})


def readme_code(out: Path) -> str:
    match = re.search(r"```python\n(.*?)```", (out / "README.md").read_text(), re.S)
    assert match, (out / "README.md").read_text()
    return match.group(1)


def load_as_readme_says(out: Path, monkeypatch) -> torch.nn.Module:
    """Run the README's load code in ``out`` (as a user would) and return its ``model``."""
    monkeypatch.chdir(out)
    scope: dict = {}
    exec(compile(readme_code(out), str(out / "README.md"), "exec"), scope)  # noqa: S102 - our own README
    return scope["model"]


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.mark.slow
@pytest.mark.parametrize("step", [2, 4])
def test_export_reproduces_the_logged_eval_loss(trained, step, tmp_path, monkeypatch, capsys):
    layout, run_dir = trained
    out = tmp_path / "out"
    args = ([] if step == 4 else ["--step", str(step)])  # 4: the default, the newest
    assert export.main([str(run_dir), "--out", str(out), *args]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"step {step}" in printed and "tied" not in printed  # ZeRO-1/2's views of one flat buffer are no ties
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    cfg = load_snapshot(str(run_dir / "config.yaml"))
    assert json.loads((out / "config.json").read_text()) == {k: getattr(cfg.model, k) for k in
                                                              ("n_layers", "d_model", "n_heads", "seq_len", "dropout")}
    model = load_as_readme_says(out, monkeypatch)
    workload = build_workload(cfg, "cpu")  # the job's eval set
    got = workload.evaluate(model)["eval/loss"]
    logged = tb_scalars(run_dir, "eval/loss")[step]
    untrained = workload.evaluate(workload.model)["eval/loss"]
    assert rel(untrained, logged) > 1e-3  # the weights are the trained ones, not the initial ones
    diff = rel(got, logged)
    print(f"export-diff ZeRO-{layout[0]} ranks {layout[1]} offload {layout[2]} step {step}: {diff:.2e}")
    assert diff <= TOL, (layout, step, got, logged)
    readme = (out / "README.md").read_text()
    assert f"step {step}" in readme and f"| `eval/loss` | {logged:.6g} |" in readme
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.metadata()["hpc_agent.step"] == str(step)
        assert all(f.get_slice(k).get_dtype() == "F32" for k in f.keys())
    if layout == (3, 2, "none") and step == 4:  # once: the command as a process (the weights are checked above)
        check_best_and_cli(run_dir, tmp_path)


def check_best_and_cli(run_dir: Path, tmp_path: Path) -> None:
    """As users run it (a process; DeepSpeed's chatter on stderr, the result alone on stdout): --best eval/loss
    picks the step with the lowest logged eval loss; a second export into the same folder is refused."""
    logged = tb_scalars(run_dir, "eval/loss")
    best = min(logged, key=lambda s: (logged[s], -s))
    proc = run_cli("-m", "hpc_agent.export", str(run_dir), "--best", "eval/loss", "--out", str(tmp_path / "b"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"exported run run step {best} ") and len(proc.stdout.splitlines()) == 1
    assert "Traceback" not in proc.stderr
    again = run_cli("-m", "hpc_agent.export", str(run_dir), "--out", str(tmp_path / "b"))
    assert again.returncode == 2 and "is not empty" in again.stderr and "--force" in again.stderr


TIED = '''
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH = 32, 16


class Tied(nn.Module):
    """An embedding and an output layer that share one weight (as language models often do)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        return self.head(torch.tanh(self.mid(self.emb(x))))


class Work:
    tokens_per_sample = 1

    def __init__(self, cfg, device):
        torch.manual_seed(cfg.train.seed)
        self.model, self.device = Tied(), device

    def batch(self, start, count, stream=0):
        x = torch.tensor([(i * 7 + 3 * stream) % VOCAB for i in range(start, start + count)])
        return {"x": x, "y": (x * 5 + 1) % VOCAB}

    def loss(self, model, batch):
        return F.cross_entropy(model(batch["x"]).float(), batch["y"])

    def evaluate(self, model):
        held_out = {k: v.to(self.device) for k, v in self.batch(0, 64, stream=1).items()}
        was_training = model.training
        model.eval()
        with torch.no_grad():
            loss = self.loss(model, held_out)
        model.train(was_training)
        return {"eval/loss": float(loss)}


def build(cfg, device):
    return Work(cfg, device)
'''


@pytest.mark.slow
@pytest.mark.parametrize("stage,ranks", [(2, 2), (3, 1)])
def test_user_workload_with_tied_weights(tmp_path, monkeypatch, capsys, stage, ranks):
    """train.workload=pkg.mod:build: its state dict as it is, the tied weight stored twice (safetensors keeps no
    shared tensors), and the README's load code (the user's build) reproduces the logged eval loss."""
    pkg = tmp_path / "src" / "tiedpkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.py").write_text(TIED)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "src"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    for name in [m for m in sys.modules if m.startswith("tiedpkg")]:
        del sys.modules[name]
    run_dir = train(tmp_path, "tied", ranks, train={**STEPS, "zero_stage": stage, "workload": "tiedpkg.model:build"})
    out = tmp_path / "out"
    assert export.main([str(run_dir), "--out", str(out)]) == 0, capsys.readouterr().err
    assert "tied weights stored as copies: head.weight = emb.weight" in capsys.readouterr().out
    readme = (out / "README.md").read_text()
    assert "Tied weights" in readme and "from tiedpkg.model import build" in readme
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert sorted(f.keys()) == ["emb.weight", "head.weight", "mid.bias", "mid.weight"]
        assert json.loads(f.metadata()["hpc_agent.tied"]) == {"head.weight": "emb.weight"}
        assert torch.equal(f.get_tensor("emb.weight"), f.get_tensor("head.weight"))
    model = load_as_readme_says(out, monkeypatch)
    assert model.head.weight is model.emb.weight  # still tied after loading
    from tiedpkg.model import build

    got = build(load_snapshot(str(run_dir / "config.yaml")), "cpu").evaluate(model)["eval/loss"]
    logged = tb_scalars(run_dir, "eval/loss")[4]
    print(f"export-diff user workload (tied) ZeRO-{stage} ranks {ranks} step 4: {rel(got, logged):.2e}")
    assert rel(got, logged) <= TOL, (got, logged)


@pytest.mark.slow
def test_zero0_bf16_exports_the_fp32_masters(tmp_path, capsys):
    """ZeRO-0 in BF16 keeps a BF16 model and FP32 masters in the optimizer: the export holds the masters (FP32,
    not all BF16 values), and each rounds to the BF16 weight the model computed with."""
    run_dir = train(tmp_path, "bf16", 1, train={**STEPS, "zero_stage": 0, "precision": "bf16"})
    out = tmp_path / "out"
    assert export.main([str(run_dir), "--out", str(out)]) == 0, capsys.readouterr().err
    assert "FP32 master weights of the ZeRO-0 checkpoint" in (out / "README.md").read_text()
    saved = torch.load(run_dir / "checkpoints" / "step_00000004" / "mp_rank_00_model_states.pt", weights_only=False)
    from safetensors.torch import load_file

    exported = load_file(str(out / "model.safetensors"))
    assert sorted(exported) == sorted(saved["module"])
    for name, weight in saved["module"].items():
        assert weight.dtype == torch.bfloat16 and exported[name].dtype == torch.float32
        assert torch.equal(exported[name].to(torch.bfloat16), weight), name
    assert any(not torch.equal(exported[n], w.float()) for n, w in saved["module"].items())  # more than BF16
