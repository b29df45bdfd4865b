"""``sinfo`` output and gres strings -> data. Pure: the one place that parses them (the commands run
through :mod:`hpc_agent.slurm.cli`; the argv lists are here so the format and its parser stay together).

- partitions: ``sinfo --noheader --format "%P|%D|%c|%m|%G|%a"`` (or any ``|``-joined subset of those
  fields, such as submit's ``%P|%G``), one row per partition and node configuration; a default partition
  is printed with a trailing ``*``;
- gres: ``gpu:h100:8(S:0-1),gpu:2,mps:100`` -> GPUs per node and the memory of one GPU by type name;
- node memory: ``sinfo --noheader --format %m`` -> the largest RealMemory in MB (``257000+`` counts as
  257000: sinfo's ``+`` means "at least").
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

PARTITION_FORMAT = "%P|%D|%c|%m|%G|%a"
GRES_FORMAT = "%P|%G"
_FIELDS = {"%P": "name", "%D": "nodes", "%c": "cpus", "%m": "mem_mb", "%G": "gres", "%a": "avail"}

# Memory per GPU of common GRES type names, where the name settles it. Names that exist in two sizes
# (a100: 40/80 GB, v100: 16/32 GB) are left out on purpose: a guess could refuse a job that fits or
# let one through that does not. Sites name such types with the size (a100_80g), which is parsed.
KNOWN_GPU_GIB: Dict[str, float] = {
    "h200": 141, "gh200": 96, "h100": 80, "h800": 80, "l40s": 48, "l40": 48, "a40": 48, "a6000": 48,
    "a30": 24, "a10": 24, "l4": 24, "t4": 15,
}


def partitions_argv(fmt: str = PARTITION_FORMAT) -> List[str]:
    return ["sinfo", "--noheader", "--format", fmt]


def node_memory_argv() -> List[str]:
    return ["sinfo", "--noheader", "--format", "%m"]


@dataclass
class Partition:
    name: str
    default: bool
    nodes: int = 0
    cpus: str = ""
    mem_mb: str = ""
    gres: str = ""
    avail: str = ""

    @property
    def gpus(self) -> int:
        return gpus_in_gres(self.gres)


def parse_partitions(text: str, fmt: str = PARTITION_FORMAT) -> List[Partition]:
    """Rows of ``sinfo --noheader --format FMT`` (``FMT`` made of ``%P %D %c %m %G %a`` joined by ``|``,
    ``%P`` included); lines with too few fields or no name are skipped."""
    keys = [_FIELDS[f.strip()] for f in fmt.split("|")]
    parts: List[Partition] = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < len(keys):
            continue
        row = dict(zip(keys, fields))
        name = row.pop("name", "")
        if not name:
            continue
        nodes = row.pop("nodes", "")
        parts.append(Partition(name.rstrip("*"), name.endswith("*"), int(nodes) if nodes.isdigit() else 0, **row))
    return parts


def select(parts: Sequence[Partition], partition: Optional[str]) -> List[Partition]:
    """The rows of ``partition``, or of the default partition when it is None or empty."""
    return [p for p in parts if (p.name == partition if partition else p.default)]


def gres_of(parts: Sequence[Partition], partition: Optional[str]) -> str:
    """The gres of a partition (the default one when None), every node configuration's joined by ``,``;
    ``""`` when it has none (``(null)``) or is not listed."""
    return ",".join(p.gres for p in select(parts, partition) if p.gres and p.gres != "(null)")


def partition_gres(sinfo_text: str, partition: Optional[str], fmt: str = GRES_FORMAT) -> str:
    """:func:`gres_of` straight from ``sinfo`` text (``%P|%G`` by default)."""
    return gres_of(parse_partitions(sinfo_text, fmt), partition)


def _gres_items(gres: str) -> List[List[str]]:
    """``gpu:a100:4(S:0-1),mps:100`` -> ``[["gpu", "a100", "4"], ["mps", "100"]]`` (socket bindings dropped)."""
    return [item.strip().split(":") for item in re.sub(r"\([^)]*\)", "", gres or "").split(",") if item.strip()]


def gpus_in_gres(gres: str) -> int:
    """GPUs per node in a sinfo ``%G`` value: ``gpu:a100:4(S:0-1),gpu:2`` -> 6; ``(null)`` -> 0."""
    total = 0
    for parts in _gres_items(gres):
        if parts[0] != "gpu":
            continue
        count = parts[-1] if len(parts) > 1 else "1"
        total += int(count) if count.isdigit() else 1
    return total


def gpu_types_in_gres(gres: str) -> List[str]:
    """Typed GPU names, first seen first, each once: ``gpu:h100:8(S:0-1),gpu:a10:2`` -> ``["h100", "a10"]``;
    ``gpu:2`` names no type -> ``[]``."""
    types: List[str] = []
    for parts in _gres_items(gres):
        if parts[0] == "gpu" and len(parts) > 1 and not parts[1].isdigit() and parts[1] not in types:
            types.append(parts[1])
    return types


def gpu_gib_from_gres(gres: str) -> Optional[float]:
    """GiB of one GPU from a gres string (``gpu:h100:8``, ``gpu:a100_80g:4(S:0-1)``), the smallest GPU's
    when there are several types; None when any type's size is unknown (or no type is named)."""
    sizes = []
    for parts in _gres_items(gres):
        if len(parts) < 3 or parts[0] != "gpu":  # gpu:<count> names no type
            continue
        kind = parts[1].lower()
        size = re.search(r"(\d+)\s*g", kind.split("_", 1)[-1] if "_" in kind else kind.split("-", 1)[-1])
        if size and ("_" in kind or "-" in kind):
            sizes.append(float(size.group(1)))
        elif kind in KNOWN_GPU_GIB:
            sizes.append(KNOWN_GPU_GIB[kind])
        else:
            return None  # one unknown type: the smallest GPU of the partition is unknown
    return min(sizes) if sizes else None


def max_node_memory_mb(sinfo_text: str) -> Optional[int]:
    """The largest node memory (MB) in ``sinfo --noheader --format %m`` output; None if it lists none."""
    sizes = [int(tok.rstrip("+")) for tok in sinfo_text.split() if tok.rstrip("+").isdigit()]
    return max(sizes) if sizes else None


def version_argv() -> List[str]:
    """``sinfo --version`` prints ``slurm 22.05.8`` (every Slurm command has the flag; sinfo needs no job)."""
    return ["sinfo", "--version"]


def parse_version(text: str) -> Optional[tuple]:
    """``slurm 22.05.8`` (or ``slurm-wlm 19.05.5``) -> ``(22, 5)``; None when no version is in the text."""
    match = re.search(r"\bslurm[\w-]*\s+(\d+)\.(\d+)", text or "", re.IGNORECASE)
    return (int(match.group(1)), int(match.group(2))) if match else None
