"""Keep the job's start-up light: a resumed attempt's time to its first step is recovery latency (P1).

Measured with ``python -X importtime`` and cProfile on a resume of the 2-layer test GPT (2 CPUs, no GPU):
``import torch`` 1.5 s, ``import deepspeed`` +0.45 s, and ``deepspeed.initialize`` 4 s, nearly all of it
imports: ``torch.optim.Optimizer`` imports ``torch._dynamo`` (1.4 s; its ``step`` needs it anyway), and
DeepSpeed imports its Muon optimizer (ZeRO's sanity check, and ZeRO-1/2/3's gradient reduction on every
step, for an ``isinstance`` test), whose module-level ``@torch.compile`` decorators import ``torch._inductor``
(1.2 s) -- for an optimizer this package never configures (``launch/dsconfig.py`` always asks for AdamW).

Those imports create about half a million objects that live as long as the process, and Python's cyclic
garbage collector traversed them again and again while they were being created: with it paused for the
imports (:func:`import_heavy_modules`) a fresh run's first step came 2.22 s after its process started instead
of 3.11 s (scripts/bench/step_overhead.py, one CPU, P2's settings). Importing ``torch._dynamo`` itself imports
``torch._inductor`` in the torch this was measured with (2.13), so the lazy Muon import no longer keeps
``torch._inductor`` out; it still keeps Muon's ``torch.compile`` decorators from running at import.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import sys
from typing import Any, Callable, Iterator

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


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, then every object alive at the end moved out of all
    later collections (``gc.freeze``), and the collector back as it was.

    Only for imports: what they leave as garbage (typing aliases, closures, a few thousand small objects, no
    tensors, since no model code runs) stays in memory for good. Frozen, the imported modules' objects are
    also never traversed again by the collections that training triggers."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def import_heavy_modules() -> None:
    """torch, ``torch._dynamo`` and DeepSpeed (with Muon imported lazily), the collector paused. Nothing
    here is extra: building any ``torch.optim`` optimizer imports ``torch._dynamo`` (``add_param_group``
    is wrapped in ``torch._disable_dynamo``, which imports it at its first call)."""
    with collector_paused():
        import_muon_lazily()  # DeepSpeed imports it anyway; this way its torch.compile decorators wait for a call
        import torch  # noqa: F401
        import torch._dynamo  # noqa: F401
        import deepspeed  # noqa: F401
