"""Keep the job's start-up light: a resumed attempt's time to its first step is recovery latency (P1).

Measured with ``python -X importtime`` and cProfile on a resume of the 2-layer test GPT (2 CPUs, no GPU):
``import torch`` 1.5 s, ``import deepspeed`` +0.45 s, and ``deepspeed.initialize`` 4 s, nearly all of it
imports: ``torch.optim.Optimizer`` imports ``torch._dynamo`` (1.4 s; its ``step`` needs it anyway), and
DeepSpeed imports its Muon optimizer (ZeRO's sanity check, and ZeRO-1/2/3's gradient reduction on every
step, for an ``isinstance`` test), whose module-level ``@torch.compile`` decorators import ``torch._inductor``
(1.2 s) -- for an optimizer this package never configures (``launch/dsconfig.py`` always asks for AdamW).
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

MUON_MODULE = "deepspeed.runtime.zero.muon.muon_optimizer"


def _lazy(real_compile: Callable[[], Any]) -> Callable[[], Any]:
    """``deepspeed.runtime.compiler.compile`` whose decorator compiles a function on its first call only."""
    def compile_() -> Any:
        decorator = real_compile()

        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            compiled: list = []

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                if not compiled:
                    compiled.append(decorator(fn))
                return compiled[0](*args, **kwargs)
            return call
        return decorate
    return compile_


def import_muon_lazily() -> bool:
    """Import DeepSpeed's Muon module with its ``@compiler.compile()`` decorators made lazy, so that importing
    it no longer imports ``torch._inductor``; Muon's functions still compile on their first call. Returns
    whether it did (False: already imported, or a DeepSpeed without that module or hook)."""
    if MUON_MODULE in sys.modules:
        return False
    try:
        from deepspeed.runtime import compiler
    except ImportError:
        return False
    real = getattr(compiler, "compile", None)
    if real is None:
        return False
    compiler.compile = _lazy(real)
    try:
        __import__(MUON_MODULE)
    except ImportError:
        return False
    finally:
        compiler.compile = real
    return True
