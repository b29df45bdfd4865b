"""hpc_agent.slurm.partition_facts: the pure parsers (sinfo rows, --test-only answers, refusals) and the adapter
against a tiny fake Slurm client that records every argv (no cluster)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from hpc_agent.config.load import load_config
from hpc_agent.slurm import partition_facts as pf
from hpc_agent.slurm.cli import SlurmError
from hpc_agent.slurm.sinfo import gpu_types_in_gres

NOW = time.mktime(time.strptime("2026-12-02T03:00:00", pf.SLURM_TIME))  # local time, as sbatch prints it
STARTS = "sbatch: Job 3 to start at {} using 2 processors on nodes node3 in partition gpu_small"


@pytest.mark.parametrize("gres, types", [
    ("gpu:h100:8(S:0-1),gpu:a10:2", ["h100", "a10"]), ("gpu:2", []), ("(null)", []), ("", []),
    ("mps:100,gpu:a100_80g:4", ["a100_80g"]), ("gpu:h100:8,gpu:h100:4", ["h100"]),
])
def test_gpu_types_in_gres(gres, types):
    assert gpu_types_in_gres(gres) == types


SINFO = ("cpu*|4|64|256000|(null)|up\n"
         "gpu|2|64|512000|gpu:h100:8(S:0-1)|up\n"
         "mixed|3|32|128000|(null)|up\n"
         "gpu|1|32|256000|gpu:a10:2|up\n"
         "mixed|1|32|128000|gpu:l4:4|up\n"
         "old|2|16|64000|gpu:t4:4|down\n"
         "\nnot a row\n")


def test_partitions_from_sinfo_merges_rows_in_first_seen_order():
    facts = {f.name: f for f in pf.partitions_from_sinfo(SINFO)}
    assert list(facts) == ["cpu", "gpu", "mixed", "old"]
    cpu, gpu, mixed, old = facts.values()
    assert cpu.default and not gpu.default
    assert (cpu.gres, cpu.gpu_type, cpu.gpu_gib, cpu.gpus_per_node, cpu.nodes) == ("", None, None, 0, 4)
    assert gpu.gres == "gpu:h100:8(S:0-1),gpu:a10:2" and gpu.gpu_type == "h100"
    assert gpu.gpu_gib == 24 and gpu.gpus_per_node == 8 and gpu.nodes == 3  # smallest GPU, most per node
    assert mixed.gres == "gpu:l4:4" and mixed.gpus_per_node == 4  # CPU rows do not hide the GPU nodes
    assert all(f.blocked == "" and f.state == "up" for f in (cpu, gpu, mixed))
    assert old.state == "down" and old.blocked == "partition state is down"


def test_partitions_from_sinfo_empty():
    assert pf.partitions_from_sinfo("") == []


@pytest.mark.parametrize("text, start_s, note", [
    (STARTS.format("2026-12-02T03:00:00"), 0.0, "starts at 2026-12-02T03:00:00 on node3"),
    (STARTS.format("2026-12-02T03:30:00"), 1800.0, "starts at 2026-12-02T03:30:00 on node3"),
    (STARTS.format("2026-12-01T23:00:00"), 0.0, "starts at 2026-12-01T23:00:00 on node3"),  # past: clamped
    ("sbatch: Job 7 to start at 2026-12-02T04:00:00 using 4 processors on node[1-2]\n", 3600.0,
     "starts at 2026-12-02T04:00:00 on node[1-2]"),  # heterogeneous-job wording
    ("salloc: allocation to start at 2026-12-02T03:10:00", 600.0, "starts at 2026-12-02T03:10:00"),
    ("sbatch: Job 3 to start at Unknown using 2 processors on nodes n1", None,
     "accepted; start time 'Unknown' not understood on n1"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available", None,
     "Batch job submission failed: Requested node configuration is not available"),
    ("sbatch: error: allocation failure: Invalid account or account/partition combination specified", None,
     "allocation failure: Invalid account or account/partition combination specified"),
    ("sbatch: warning: something\nsbatch: error: allocation failure: User's group not permitted to use this partition",
     None, "allocation failure: User's group not permitted to use this partition"),
    ("sbatch: error: Invalid generic resource (gres) specification\n", None,
     "Invalid generic resource (gres) specification"),
    ("", None, ""),
    ("\n  \n", None, ""),
    ("\x00garbage 12:34 \n more", None, "\x00garbage 12:34"),
    ("x" * 1000, None, "x" * 297 + "..."),
])
def test_parse_test_only(text, start_s, note):
    assert pf.parse_test_only(text, NOW) == (start_s, note)


@pytest.mark.parametrize("note, expected", [
    ("allocation failure: Invalid account or account/partition combination specified",
     "you may not use this partition (sbatch: allocation failure: Invalid account"),
    ("User's group not permitted to use this partition", "you may not use this partition (sbatch: User's group"),
    ("Requested node configuration is not available", "no node of it can run the job (sbatch: Requested node "
     "configuration is not available; too few GPUs/CPUs/memory per node, or every node excluded)"),
    ("Invalid generic resource (gres) specification", "its nodes lack the GPUs the job asks for"),
    ("Requested time limit is invalid (missing or exceeds some limit)", "the job's time limit exceeds"),
    ("Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
     "an account or QOS limit forbids it"),
    ("Invalid qos specification", "the QOS does not allow it here"),
    ("Something new", "sbatch --test-only refused: Something new"),
    ("", "sbatch --test-only refused the job without a word"),
])
def test_refusal_reason(note, expected):
    assert pf.refusal_reason(note).startswith(expected)


# --- the adapter -----------------------------------------------------------------------------------------
class FakeSlurm:
    """Records every argv; sinfo answers SINFO, ``sbatch --test-only`` answers ``answers[partition]``: a
    ``(returncode, stderr)`` pair, or an exception to raise (SlurmCLI raises SlurmError on a timeout)."""

    def __init__(self, sinfo: str = SINFO, answers=None):
        self.sinfo, self.answers, self.calls = sinfo, answers or {}, []

    def run(self, argv, check=True, timeout_s=None):
        self.calls.append((list(argv), check, timeout_s))
        if argv[0] == "sinfo":
            return SimpleNamespace(returncode=0, stdout=self.sinfo, stderr="")
        partition = argv[argv.index("--partition") + 1]
        answer = self.answers.get(partition, (0, STARTS.format("2026-12-02T03:30:00")))
        if isinstance(answer, Exception):
            raise answer
        return SimpleNamespace(returncode=answer[0], stdout="", stderr=answer[1])

    def tested(self):
        return [argv[argv.index("--partition") + 1] for argv, _, _ in self.calls if argv[0] == "sbatch"]


@pytest.fixture(scope="module")
def cfg():
    return load_config("quickstart", ["slurm.gpus_per_node=1", "slurm.tasks_per_node=1"])


def test_collect_one_sinfo_and_test_only_per_usable_partition(cfg):
    slurm = FakeSlurm(answers={"mixed": (1, "sbatch: error: allocation failure: User's group not permitted "
                                            "to use this partition")})
    facts = pf.collect(slurm, cfg, timeout_s=7, clock=lambda: NOW)
    assert [c[0][0] for c in slurm.calls].count("sinfo") == 1
    assert slurm.tested() == ["gpu", "mixed"]  # cpu: no GPUs, old: down; neither asked
    for argv, check, timeout_s in slurm.calls[1:]:
        assert "--test-only" in argv and argv[argv.index("--gpus-per-node") + 1] == "1"
        assert check is False and timeout_s == 7
    by = {f.name: f for f in facts}
    assert [f.name for f in facts] == ["cpu", "gpu", "mixed", "old"]
    assert by["cpu"].blocked == "0 GPU(s) per node; the job asks for 1"
    assert by["gpu"].blocked == "" and by["gpu"].start_s == 1800.0 and "node3" in by["gpu"].start_note
    assert by["mixed"].blocked.startswith("you may not use this partition") and by["mixed"].start_s is None
    assert by["old"].blocked == "partition state is down"


def test_collect_only_filters_and_flags_unlisted(cfg):
    slurm = FakeSlurm()
    facts = pf.collect(slurm, cfg, only=["nope", "mixed", "cpu", "mixed"], clock=lambda: NOW)
    assert [f.name for f in facts] == ["cpu", "mixed", "nope"]  # sinfo order, unlisted last, each once
    assert facts[2] == pf.PartitionFacts("nope", blocked=pf.UNLISTED)
    assert slurm.tested() == ["mixed"]


def test_collect_too_few_gpus_not_tested(cfg):
    from dataclasses import replace
    big = replace(cfg, slurm=replace(cfg.slurm, gpus_per_node=8, tasks_per_node=8))
    slurm = FakeSlurm()
    facts = {f.name: f for f in pf.collect(slurm, big, clock=lambda: NOW)}
    assert slurm.tested() == ["gpu"]
    assert facts["mixed"].blocked == "4 GPU(s) per node; the job asks for 8"


def test_collect_bounds_the_test_only_calls(cfg):
    sinfo = "".join(f"p{i}|1|8|1000|gpu:a10:2|up\n" for i in range(5))
    slurm = FakeSlurm(sinfo=sinfo)
    facts = pf.collect(slurm, cfg, max_tests=3, clock=lambda: NOW)
    assert slurm.tested() == ["p0", "p1", "p2"]
    assert [f.blocked for f in facts[3:]] == ["not tried: more than 3 candidates (placement.max_candidates)"] * 2


def test_collect_timeout_leaves_start_unknown_but_usable(cfg):
    slurm = FakeSlurm(answers={"gpu": SlurmError("sbatch --test-only ... timed out after 10 s")})
    facts = {f.name: f for f in pf.collect(slurm, cfg, timeout_s=10, clock=lambda: NOW)}
    assert facts["gpu"].blocked == "" and facts["gpu"].start_s is None
    assert facts["gpu"].start_note == "sbatch --test-only timed out after 10s"
    assert facts["mixed"].start_s == 1800.0  # the next partition is still asked


def test_collect_start_line_wins_over_exit_code_and_exit_0_is_no_refusal(cfg):
    slurm = FakeSlurm(answers={"gpu": (1, STARTS.format("2026-12-02T03:05:00")), "mixed": (0, "")})
    facts = {f.name: f for f in pf.collect(slurm, cfg, clock=lambda: NOW)}
    assert facts["gpu"].blocked == "" and facts["gpu"].start_s == 300.0
    assert facts["mixed"].blocked == "" and facts["mixed"].start_s is None


def test_collect_sinfo_failure_propagates(cfg):
    class Down(FakeSlurm):
        def run(self, argv, check=True, timeout_s=None):
            raise SlurmError("sinfo failed (1): slurm_load_partitions: Unable to contact slurm controller")
    with pytest.raises(SlurmError):
        pf.collect(Down(), cfg)


def test_cpu_job_tests_cpu_partitions(cfg):
    from dataclasses import replace
    cpu_job = replace(cfg, slurm=replace(cfg.slurm, gpus_per_node=0))
    slurm = FakeSlurm()
    pf.collect(slurm, cpu_job, clock=lambda: NOW)
    assert slurm.tested() == ["cpu", "gpu", "mixed"]
    assert all("--gpus-per-node" not in argv for argv, _, _ in slurm.calls)
