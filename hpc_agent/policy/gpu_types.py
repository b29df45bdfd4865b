"""Dense FP16/BF16 tensor-core peak of common GPU types, in TFLOPS (vendor data sheets, no sparsity).

The one home of GPU *speed* (their memory by type lives with the gres parser, ``hpc_agent.slurm.sinfo``).
Placement (:func:`hpc_agent.policy.partitions.candidates`) turns it into a time estimate; a GPU benchmark can quote MFU
against it. SXM figures where a type ships in two form factors (the H100 PCIe is ~25 % slower): the estimate
is rough anyway, and a site names its PCIe cards in the gres type when it has both.
"""
from __future__ import annotations

import re
from typing import Dict, Optional

DENSE_FP16_TFLOPS: Dict[str, float] = {
    "b200": 2250, "h200": 989, "gh200": 989, "h100": 989, "h800": 989, "a100": 312, "a800": 312,
    "l40s": 362, "l40": 181, "a40": 150, "a6000": 155, "a30": 165, "a10": 125, "a10g": 70, "l4": 121,
    "t4": 65, "v100": 125, "mi300x": 1307, "mi250x": 383,
}


def peak_tflops(gpu_type: Optional[str]) -> Optional[float]:
    """``h100`` -> 989; a sized or suffixed name (``a100_80g``, ``h100-sxm``, ``A100``) by its base; None when unknown."""
    if not gpu_type:
        return None
    name = gpu_type.lower()
    if name in DENSE_FP16_TFLOPS:
        return DENSE_FP16_TFLOPS[name]
    base = re.split(r"[_\-.]", name, maxsplit=1)[0]
    return DENSE_FP16_TFLOPS.get(base)
