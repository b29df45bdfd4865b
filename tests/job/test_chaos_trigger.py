"""The chaos trigger inside the job, where it needs torch: an injected GPU OOM is torch's own error (the trigger's
file handling without torch: tests/unit/test_chaos.py)."""
from __future__ import annotations

import pytest

from tests.unit.test_chaos import _trigger, _write


def test_trigger_gpu_oom_raises_a_cuda_style_error_from_the_next_forward_only(tmp_path):
    import torch

    _write(tmp_path, kind="gpu_oom", nonce="g")
    trig = _trigger(tmp_path)
    trig.before_step(9)  # armed here; raised where a real OOM happens, inside the step's forward
    with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory.*nonce g"):
        trig.loss(torch.tensor(1.0))
    assert float(trig.loss(torch.tensor(2.0))) == 2.0  # once
