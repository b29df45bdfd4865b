"""Slurm hostlists: ``node[1-3,7],gpu-a01`` -> the node names. Pure; the one home of this expansion
(sacct's NodeList, the policy's excluded nodes, the fake Slurm)."""
from __future__ import annotations

import re
from typing import List


def expand_hostlist(text: str) -> List[str]:
    """``"node[1-3,7],gpu-a01"`` -> ``["node1", "node2", "node3", "node7", "gpu-a01"]`` (zero padding kept)."""
    text = (text or "").strip()
    if not text or text in ("None assigned", "(null)", "Unknown"):
        return []
    hosts: List[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        hosts.extend(_expand_one(item.strip()))
    return [h for h in hosts if h]


def _expand_one(name: str) -> List[str]:
    match = re.search(r"\[([^\]]*)\]", name)
    if not match:
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    out = []
    for part in match.group(1).split(","):
        lo, _, hi = part.partition("-")
        if hi and lo.isdigit() and hi.isdigit():
            width = len(lo)
            numbers = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
        else:
            numbers = [part]
        for number in numbers:
            out.extend(_expand_one(f"{head}{number}{tail}"))
    return out
