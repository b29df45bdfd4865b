"""doctor --data: infer a config's data section from a dataset file (pure functions, tiny files)."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from hpc_agent.checks import data_config as dc
from hpc_agent.config.load import build_config
from tests.conftest import run_cli


def _csv(path, counts, header=True):
    lines = ["f0,f1,label"] if header else []
    for label, n in enumerate(counts):
        lines += [f"{i * 0.1:.1f},{label}.5,{label}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("counts, ratio, method", [
    ((20, 20, 20), 1.0, "none"),
    ((10, 100), 10.0, "class_weight"),
    ((4, 200, 50), 50.0, "weighted_sampler"),
    ((2, 400), 200.0, "weighted_sampler"),
])
def test_infer_csv_table(tmp_path, counts, ratio, method):
    info = dc.infer_file(_csv(tmp_path / "d.csv", counts))
    assert info["format"] == "csv" and info["workload"] == "classifier"
    assert info["num_classes"] == len(counts)
    assert info["class_counts"] == {i: n for i, n in enumerate(counts)}
    assert info["imbalance_ratio"] == ratio
    assert info["imbalance_method"] == method


def test_rule_boundaries():
    assert dc.suggest_method(2.99) == "none"
    assert dc.suggest_method(3) == "class_weight"
    assert dc.suggest_method(20) == "class_weight"
    assert dc.suggest_method(20.1) == "weighted_sampler"


def test_text_file_suggests_gpt(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("to be or not to be\nthat is the question\n")
    info = dc.infer_file(path)
    assert info["format"] == "text" and info["workload"] == "gpt" and "num_classes" not in info
    layer = OmegaConf.to_container(OmegaConf.create(dc.render_yaml(info)))
    assert layer == {"train": {"workload": "gpt"}, "data": {"path": str(path.resolve())}}
    cfg = build_config([layer])
    assert cfg.train.workload == "gpt" and cfg.data.path == str(path.resolve())


def test_tsv_jsonl_and_headerless(tmp_path):
    tsv = tmp_path / "d.tsv"
    tsv.write_text("a\tlabel\n" + "1\t0\n" * 3 + "2\t1\n" * 9)
    assert dc.infer_file(tsv)["class_counts"] == {0: 3, 1: 9}
    jl = tmp_path / "d.jsonl"
    jl.write_text("".join(json.dumps({"x": [1, 2], "label": lab}) + "\n" for lab in ["cat"] * 5 + ["dog"] * 5))
    info = dc.infer_file(jl)
    assert info["format"] == "jsonl" and info["class_counts"] == {"cat": 5, "dog": 5}
    assert dc.infer_file(_csv(tmp_path / "h.csv", (3, 6), header=False))["class_counts"] == {0: 3, 1: 6}
    assert dc.detect_format("noext", '{"label": 1}') == "jsonl"
    assert dc.detect_format("noext", "1,2,3") == "csv"
    assert dc.detect_format("noext", "hello world") == "text"


def test_yaml_loads_and_merges_into_config(tmp_path):
    info = dc.infer_file(_csv(tmp_path / "d.csv", (5, 250)))
    text = dc.render_yaml(info)
    assert "# class counts: 0: 5, 1: 250" in text and "imbalance_method rule:" in text
    layer = OmegaConf.to_container(OmegaConf.create(text))
    assert layer["data"] == {"path": info["path"], "num_classes": 2, "imbalance_ratio": 50.0,
                             "imbalance_method": "weighted_sampler"}
    cfg = build_config([{"run": {"name": "x"}}, layer])
    assert cfg.train.workload == "classifier"
    assert (cfg.data.num_classes, cfg.data.imbalance_ratio, cfg.data.imbalance_method) == (2, 50.0, "weighted_sampler")


def test_cli_writes_out_file(tmp_path):
    out = tmp_path / "data.yaml"
    res = run_cli("-m", "hpc_agent.doctor", "--data", str(_csv(tmp_path / "d.csv", (10, 100))), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "2 classes, ratio 10.0, method class_weight" in res.stdout
    assert OmegaConf.load(out).data.imbalance_method == "class_weight"
    res = run_cli("-m", "hpc_agent.doctor", "--data", str(tmp_path / "missing.csv"))
    assert res.returncode == 1 and "FAIL" in res.stderr
