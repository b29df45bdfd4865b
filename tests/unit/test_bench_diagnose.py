"""scripts/bench/diagnose.py on a tiny synthetic corpus: the loader, the scores, the cost table, the JSON file."""
from __future__ import annotations

import json

import pytest
from scripts.bench import diagnose as bench

OOM_LOG = ("[rank0]: Traceback (most recent call last):\n"
           "[rank0]:   File \"train.py\", line 12, in <module>\n"
           "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
           "capacity of 79.15 GiB of which 1.02 GiB is free.\n")
TIMEOUT_LOG = ("Epoch 3:  41%|####      | 410/1000 [5:59:01<8:36,  1.14it/s, loss=2.31]\n"
               "slurmstepd: error: *** JOB 4242 ON gpu-07 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***\n")
TIMEOUT_SACCT = ("JobID|JobName|State|ExitCode|Start|End|NodeList\n"
                 "4242|train|TIMEOUT|0:0|2025-01-10T09:27:20|2025-01-10T15:27:25|gpu-07\n"
                 "4242.batch|batch|CANCELLED|0:15|2025-01-10T09:27:20|2025-01-10T15:27:27|gpu-07\n")


def _case(root, name, log=None, meta=None, sacct=None, raw_meta=None):
    folder = root / name
    folder.mkdir(parents=True)
    if log is not None:
        (folder / "log.txt").write_text(log)
    if meta is not None:
        (folder / "meta.json").write_text(json.dumps(meta))
    if raw_meta is not None:
        (folder / "meta.json").write_text(raw_meta)
    if sacct is not None:
        (folder / "sacct.txt").write_text(sacct)


def _meta(cause, acceptable=None, framework="torchrun", sacct="none", **more):
    return {"cause": cause, "acceptable": acceptable or [cause], "framework": framework, "sacct": sacct,
            "ambiguous_why": None, "note": "synthetic", **more}


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "wild"
    _case(root, "mem-001-cuda-oom", OOM_LOG, _meta("gpu_oom"))
    _case(root, "net-002-time-limit", TIMEOUT_LOG, _meta("timeout", framework="lightning", sacct="made_up",
                                                         sacct_format="-P"), sacct=TIMEOUT_SACCT)
    _case(root, "env-003-broken-meta", "ImportError: libcudart.so.12\n", raw_meta='{"cause": "env_error", ')
    _case(root, "env-004-no-log", None, _meta("env_error"))
    _case(root, "code-005-bad-cause", "Traceback\nKeyError: 'x'\n", _meta("bug", ["bug"]))
    _case(root, "code-006-sacct-missing", "Traceback\nKeyError: 'x'\n", _meta("code_error", sacct="made_up"))
    (root / "README.md").write_text("not a case")
    return root


def test_loader_is_total_and_reports_malformed_folders(corpus, tmp_path):
    cases = bench.load_cases(corpus)
    assert [c.name for c in cases] == ["code-005-bad-cause", "code-006-sacct-missing", "env-003-broken-meta",
                                       "env-004-no-log", "mem-001-cuda-oom", "net-002-time-limit"]
    by = {c.name: c for c in cases}
    assert by["mem-001-cuda-oom"].problem is None and by["mem-001-cuda-oom"].sacct is None
    assert by["mem-001-cuda-oom"].log == OOM_LOG and by["mem-001-cuda-oom"].meta["cause"] == "gpu_oom"
    assert by["net-002-time-limit"].problem is None and by["net-002-time-limit"].sacct == TIMEOUT_SACCT
    assert "not JSON" in by["env-003-broken-meta"].problem
    assert by["env-004-no-log"].problem == "no log.txt"
    assert "not a cause name" in by["code-005-bad-cause"].problem
    assert "sacct.txt is missing" in by["code-006-sacct-missing"].problem
    assert [bench.sacct_format(by[n]) for n in ("mem-001-cuda-oom", "net-002-time-limit")] == ["none", "-P"]
    assert bench.load_cases(tmp_path / "nowhere") == []


def test_an_exception_in_the_diagnoser_is_the_answer_exception(monkeypatch):
    def boom(logs, alarms=()):
        raise ValueError("regex blew up")

    monkeypatch.setattr(bench, "classify_logs", boom)
    cause, shown = bench.answer(bench.Case("x", "some log\n", None, _meta("gpu_oom")))
    assert cause == bench.EXCEPTION and shown["error"] == "ValueError: regex blew up"
    rec = {"name": "x", "expected": "gpu_oom", "acceptable": ["gpu_oom"], "answer": cause,
           "framework": "f", "sacct_format": "none"}
    scores = bench.score([rec])
    assert scores["accepted"]["accepted"] == 0 and scores["exceptions"] == ["x"]
    assert scores["cost_weighted_error"]["total"] == 2


@pytest.mark.parametrize("acceptable, answer, cost", [
    (["gpu_oom"], "gpu_oom", 0),
    (["nccl_error", "code_error"], "code_error", 0),  # any acceptable answer costs nothing
    (["gpu_oom"], "code_error", 10),                  # a repairable run stopped
    (["preempted"], "cancelled", 10),
    (["hung"], "run_dir_busy", 10),
    (["host_oom"], "env_error", 10),
    (["gpu_oom"], "host_oom", 3),                     # the wrong repair
    (["hung"], "timeout", 3),
    (["code_error"], "gpu_oom", 1),                   # a code bug retried once
    (["env_error"], "unknown", 1),
    (["diverged"], "unknown", 1),                     # requeued once unchanged
    (["gpu_oom"], "completed", 5),                    # a failure called a success
    (["code_error"], "running", 5),
    (["cancelled"], "pending", 5),
    (["code_error"], "env_error", 2),                 # anything else
    (["cancelled"], "gpu_oom", 2),
    (["cancelled"], "unknown", 2),
    (["gpu_oom"], bench.EXCEPTION, 2),
    (["nccl_error", "code_error"], "env_error", 2),   # the least over the acceptable causes: min(10, 2)
    (["nccl_error", "gpu_hw_error"], "code_error", 10),
    (["nccl_error", "code_error"], "unknown", 1),
])
def test_cost_table(acceptable, answer, cost):
    assert bench.cost(acceptable, answer) == cost


def _rec(name, expected, answer, acceptable=None, framework="f", fmt="none"):
    return {"name": name, "expected": expected, "acceptable": acceptable or [expected], "answer": answer,
            "framework": framework, "sacct_format": fmt}


def test_scores_on_a_hand_computed_example():
    records = [
        _rec("a", "gpu_oom", "gpu_oom", framework="ds"),                          # right
        _rec("b", "gpu_oom", "code_error", framework="ds"),                       # gpu_oom FN, code_error FP: 10
        _rec("c", "nccl_error", "code_error", ["nccl_error", "code_error"]),      # code_error TP (ambiguous)
        _rec("d", "code_error", "code_error", fmt="-P"),                          # code_error TP
        _rec("e", "code_error", "unknown", fmt="-P"),                             # code_error FN, unknown FP: 1
        _rec("f", "nccl_error", "gpu_oom"),                                       # nccl FN, gpu_oom FP: 3
    ]
    s = bench.score(records, worst=2)
    assert s["n"] == 6 and s["accepted"] == {"accepted": 3, "n": 6, "rate": 0.5}
    assert s["n_per_cause"] == {"code_error": 2, "gpu_oom": 2, "nccl_error": 2}
    pc = s["per_cause"]
    assert pc["gpu_oom"] == {"n": 2, "answered": 2, "tp": 1, "fp": 1, "fn": 1, "precision": 0.5, "recall": 0.5}
    assert pc["code_error"] == {"n": 2, "answered": 3, "tp": 2, "fp": 1, "fn": 1,
                                "precision": round(2 / 3, 4), "recall": round(2 / 3, 4)}
    # c is accepted (answered code_error), so it is not an FN of nccl_error: only f is
    assert pc["nccl_error"] == {"n": 2, "answered": 0, "tp": 0, "fp": 0, "fn": 1, "precision": None, "recall": 0.0}
    assert pc["unknown"] == {"n": 0, "answered": 1, "tp": 0, "fp": 1, "fn": 0, "precision": 0.0, "recall": None}
    assert s["confusion"] == {"code_error": {"code_error": 1, "unknown": 1}, "gpu_oom": {"code_error": 1, "gpu_oom": 1},
                              "nccl_error": {"code_error": 1, "gpu_oom": 1}}
    assert s["cost_weighted_error"]["total"] == 14 and s["cost_weighted_error"]["mean"] == round(14 / 6, 4)
    assert s["worst_cases"] == [
        {"name": "b", "expected": "gpu_oom", "acceptable": ["gpu_oom"], "answer": "code_error", "cost": 10},
        {"name": "f", "expected": "nccl_error", "acceptable": ["nccl_error"], "answer": "gpu_oom", "cost": 3}]
    assert s["per_framework"] == {"ds": {"n": 2, "accepted": 1, "rate": 0.5}, "f": {"n": 4, "accepted": 2, "rate": 0.5}}
    assert s["per_sacct_format"]["-P"] == {"n": 2, "accepted": 1, "rate": 0.5}
    assert s["repairable_stopped_as_code_error"] == ["b"]  # c has code_error among its acceptable causes


def test_main_writes_the_documented_json(corpus, tmp_path, capsys):
    out_path = tmp_path / "results" / "bench_diagnose.json"
    assert bench.main(["--root", str(corpus), "--repeats", "2", "--out", str(out_path)]) == 0
    out = json.loads(out_path.read_text())
    for key in ("commit", "date", "corpus", "n_per_cause", "accepted", "per_cause", "confusion",
                "cost_weighted_error", "worst_cases", "per_framework", "per_sacct_format",
                "repairable_stopped_as_code_error", "timing", "cases", "cost_table"):
        assert key in out, key
    assert out["corpus"]["size"] == 2 and out["corpus"]["folders"] == 6
    assert {m["name"] for m in out["corpus"]["malformed"]} == {"env-003-broken-meta", "env-004-no-log",
                                                               "code-005-bad-cause", "code-006-sacct-missing"}
    timing = out["timing"]
    assert timing["repeats"] == 2 and len(timing["seconds"]) == 2
    assert timing["min_s"] <= timing["median_s"] <= timing["max_s"] and timing["answers_stable"] is True
    answers = {c["name"]: c for c in out["cases"]}
    assert answers["mem-001-cuda-oom"]["route"] == "classify_logs"
    assert answers["net-002-time-limit"]["route"] == "diagnose"
    assert answers["mem-001-cuda-oom"]["answer"] == "gpu_oom"
    assert answers["net-002-time-limit"]["answer"] == "timeout"
    assert out["accepted"]["n"] == 2 and set(out["per_sacct_format"]) == {"none", "-P"}
    printed = capsys.readouterr().out
    assert "accepted" in printed and "cost-weighted error" in printed and "min/median/max" in printed


def test_a_baseline_revision_is_scored_on_the_same_corpus_in_the_same_run(corpus):
    """``--baseline REV`` runs REV's diagnoser from a temporary worktree; HEAD as its own baseline answers alike
    (the checkout's committed diagnoser), and the worktree is gone afterwards."""
    import subprocess

    good = [c for c in bench.load_cases(corpus) if c.problem is None]
    before = subprocess.run(["git", "-C", str(bench.REPO), "worktree", "list"], capture_output=True, text=True).stdout
    answers = bench.baseline_answers("HEAD", good)
    assert set(answers) == {c.name for c in good}
    assert all(a != bench.EXCEPTION for a in answers.values()), answers
    assert subprocess.run(["git", "-C", str(bench.REPO), "worktree", "list"], capture_output=True,
                          text=True).stdout == before
    out = bench.with_baseline(bench.run(corpus, repeats=1), "HEAD", corpus)
    assert out["baseline"]["accepted"]["n"] == out["accepted"]["n"] and "asked" in out["baseline"]
