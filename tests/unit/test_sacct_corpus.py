"""Must-show 2 of issue 16: sacct texts as clusters and people produce them, through ``diagnose --json``.

tests/data/sacct_corpus/manifest.json names, for each file, the job to diagnose and the cause a person
reading the text would name (or ``error``: the file is no sacct output and diagnose must refuse it, exit 2,
never a silent ``unknown``). Most files are real ``sacct`` output captured on the localhost cluster (Slurm
22.05.8) in every format it prints; the rest are hand-made for what it cannot print (Slurm 24.x JSON,
heterogeneous jobs, pastes). README.md there says where each kind came from.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from hpc_agent import diagnose
from tests.conftest import run_cli

CORPUS = Path(__file__).resolve().parents[1] / "data" / "sacct_corpus"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text())["files"]
READABLE = [e for e in MANIFEST if e["cause"] != "error"]
REFUSED = [e for e in MANIFEST if e["cause"] == "error"]


@pytest.fixture(autouse=True)
def _no_runs_root(monkeypatch, tmp_path):
    monkeypatch.delenv("HPC_AGENT_RUNS", raising=False)
    monkeypatch.chdir(tmp_path)  # no ./runs: nothing but the sacct text decides


def argv_for(entry) -> list:
    argv = ["--sacct-file", str(CORPUS / entry["file"]), "--json"]
    return ([entry["job_id"]] if entry["job_id"] else []) + argv


def test_corpus_size_and_formats():
    """>= 60 readable texts, >= 10 of them in a format or column order the watcher never produces."""
    files = {p.name for p in CORPUS.iterdir() if p.name not in ("manifest.json", "README.md")}
    assert files == {e["file"] for e in MANIFEST}, "every corpus file has a manifest entry and vice versa"
    other = [e for e in READABLE if not e["watcher_format"]]
    formats = Counter(e["format"].split(",")[0].split(" (")[0] for e in READABLE)
    print(f"\nsacct corpus: {len(READABLE)} readable texts ({len(other)} in formats the watcher never produces), "
          f"{len(REFUSED)} refused; by format: {dict(formats)}; causes: {dict(Counter(e['cause'] for e in READABLE))}")
    assert len(READABLE) >= 60 and len(other) >= 10
    assert {"fixed-width", "parsable", "parsable2", "json"} <= set(formats)


@pytest.mark.parametrize("entry", READABLE, ids=[e["file"] for e in READABLE])
def test_corpus_cause(entry, capsys):
    code = diagnose.main(argv_for(entry))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["cause"] == entry["cause"], (entry, report["evidence"])
    if entry["job_id"]:
        assert report["job_id"] == entry["job_id"]
    assert not any("not understood" in e for e in report["evidence"]), report["evidence"]
    skipped = [e for e in report["evidence"] if "were skipped" in e]
    expected = entry.get("skipped_lines", 0)
    assert (skipped[0].startswith(f"{expected} line(s)") if expected else not skipped), report["evidence"]


@pytest.mark.parametrize("entry", REFUSED, ids=[e["file"] for e in REFUSED])
def test_corpus_refused_with_a_clear_error(entry, capsys):
    assert diagnose.main(argv_for(entry)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and entry["error"] in captured.err, captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("name", ["real_590_fixed_truncated.txt", "hand_hetjob_117_json24.json",
                                  "error_noheader_P.txt"])
def test_corpus_through_a_real_subprocess(name, tmp_path):
    entry = next(e for e in MANIFEST if e["file"] == name)
    proc = run_cli("-m", "hpc_agent.diagnose", *argv_for(entry), cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    if entry["cause"] == "error":
        assert proc.returncode == 2 and entry["error"] in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["cause"] == entry["cause"]
