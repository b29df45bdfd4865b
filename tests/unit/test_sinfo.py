"""hpc_agent.slurm.sinfo: the one sinfo / gres parser (tables of real-looking output)."""
from __future__ import annotations

import pytest

from hpc_agent.slurm import sinfo

DOCTOR_TEXT = "low*|2|2|6000|(null)|up\nhigh|2|2|6000|(null)|up\ngpu|4|64|512000|gpu:a100:4(S:0-1)|up\n\nbad line\n"
MIXED_TEXT = "gpu*|gpu:h100:8\ngpu*|gpu:h100:4\ncpu|(null)\n"


def test_parse_partitions_full_format():
    parts = sinfo.parse_partitions(DOCTOR_TEXT)
    assert [(p.name, p.default, p.nodes, p.cpus, p.mem_mb, p.gres, p.avail) for p in parts] == [
        ("low", True, 2, "2", "6000", "(null)", "up"),
        ("high", False, 2, "2", "6000", "(null)", "up"),
        ("gpu", False, 4, "64", "512000", "gpu:a100:4(S:0-1)", "up"),
    ]
    assert [p.gpus for p in parts] == [0, 0, 4]


def test_parse_partitions_gres_format():
    parts = sinfo.parse_partitions(MIXED_TEXT, sinfo.GRES_FORMAT)
    assert [(p.name, p.default, p.gres, p.nodes) for p in parts] == [
        ("gpu", True, "gpu:h100:8", 0), ("gpu", True, "gpu:h100:4", 0), ("cpu", False, "(null)", 0)]


@pytest.mark.parametrize("text, fmt, partition, gres", [
    (DOCTOR_TEXT, sinfo.PARTITION_FORMAT, None, ""),                 # the default partition has no gres
    (DOCTOR_TEXT, sinfo.PARTITION_FORMAT, "gpu", "gpu:a100:4(S:0-1)"),
    (DOCTOR_TEXT, sinfo.PARTITION_FORMAT, "nosuch", ""),
    (MIXED_TEXT, sinfo.GRES_FORMAT, None, "gpu:h100:8,gpu:h100:4"),  # every node configuration of it
    (MIXED_TEXT, sinfo.GRES_FORMAT, "cpu", ""),
    ("low*|(null)\nhigh|gpu:h100:8\n", sinfo.GRES_FORMAT, "high", "gpu:h100:8"),
    ("", sinfo.GRES_FORMAT, None, ""),
])
def test_partition_gres(text, fmt, partition, gres):
    assert sinfo.partition_gres(text, partition, fmt) == gres
    assert sinfo.gres_of(sinfo.parse_partitions(text, fmt), partition) == gres


@pytest.mark.parametrize("gres, n", [("(null)", 0), ("", 0), ("gpu:2", 2), ("gpu:a100:4(S:0-1),gpu:v100:2", 6),
                                     ("mps:100,gpu:1", 1), ("gpu", 1), ("gpu:h100:8(S:0-1)", 8)])
def test_gpus_in_gres(gres, n):
    assert sinfo.gpus_in_gres(gres) == n


@pytest.mark.parametrize("gres, gib", [
    ("gpu:h100:8", 80), ("gpu:h100:8(S:0-1)", 80), ("gpu:a100_80g:4", 80), ("gpu:a100-40gb:4", 40),
    ("gpu:H200:8", 141), ("gpu:a100:4", None), ("gpu:4", None), ("gpu:h100:4,gpu:l40s:2", 48),
    ("gpu:h100:4,gpu:mystery:2", None), ("mps:100,gpu:t4:1", 15), ("", None), ("(null)", None),
])
def test_gpu_gib_from_gres(gres, gib):
    assert sinfo.gpu_gib_from_gres(gres) == gib


@pytest.mark.parametrize("text, mb", [
    ("257000\n515000+\n", 515000),   # "+": at least that much
    ("  64000\n64000\n", 64000),
    ("", None), ("n/a\n", None),
])
def test_max_node_memory_mb(text, mb):
    assert sinfo.max_node_memory_mb(text) == mb


def test_argv_pairs_with_the_parser():
    assert sinfo.partitions_argv() == ["sinfo", "--noheader", "--format", "%P|%D|%c|%m|%G|%a"]
    assert sinfo.node_memory_argv() == ["sinfo", "--noheader", "--format", "%m"]


def test_doctor_and_preflight_parse_sinfo_with_this_module_only():
    """One home for sinfo's formats: doctor and preflight call this module's parsers (no copy, no alias)."""
    from hpc_agent import doctor
    from hpc_agent.policy import preflight

    assert doctor.parse_partitions is sinfo.parse_partitions
    assert preflight.gpu_gib_from_gres is sinfo.gpu_gib_from_gres
    assert not hasattr(doctor, "parse_sinfo") and not hasattr(preflight, "partition_gres")
    assert preflight.sinfo_argv() == ["sinfo", "--noheader", "--format", sinfo.GRES_FORMAT]
