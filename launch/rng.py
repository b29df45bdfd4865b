"""Random state of one rank: seeding, and the state a checkpoint saves and a resume restores."""
from __future__ import annotations

import random
from typing import Any, Dict


def rng_state(on_cuda: bool) -> Dict[str, Any]:
    import numpy as np
    import torch

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if on_cuda else None}


def set_rng_state(state: Dict[str, Any], on_cuda: bool) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if on_cuda and state.get("cuda") is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


def seed(value: int) -> None:
    import numpy as np
    import torch

    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)
