"""Host copies of a DeepSpeed engine's checkpoint state, for snapshots (launch/snapshot.py).

:func:`capture` runs DeepSpeed's own ``save_checkpoint`` with its checkpoint engine swapped for
:class:`HostCapture`, which keeps a host copy of each state dict (:func:`to_host`) instead of writing it, so
the files, their names and the ZeRO sharding are exactly what a full checkpoint holds. :class:`HostBuffers`
lets one capture copy into the previous capture's host tensors instead of fresh ones.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from hpc_agent.core.filemodes import make_dir


class HostBuffers:
    """The host tensors of the previous capture, copied into again by the next one.

    A fresh host copy of every tensor at each capture made the kernel hand out (and zero) new pages each
    time, since the writer freed them after writing: on a 408 MB state the loop was held 0.195 s a snapshot
    with fresh copies and 0.05 s with reused ones (``scripts/bench/snapshot.py --capture-baseline``). So
    the copy of a snapshot is kept after its write and reused, tensor by tensor in capture order, wherever
    the shape, strides and dtype still match (after an in-job repair rebuilt the engine, a tensor that
    changed gets a fresh copy). The peak is unchanged (the capture already held a second copy of the state
    while it was written); between snapshots that copy stays allocated instead of being freed.

    Only safe while no writer reads the previous copy: :meth:`Snapshots.after_step` captures only once the
    write in flight has ended (it skips a snapshot, or waits for a checkpoint's write)."""

    def __init__(self) -> None:
        self._previous: List[Any] = []
        self._current: List[Any] = []

    def start(self) -> None:
        self._current = []

    def finish(self) -> None:
        self._previous, self._current = self._current, []

    def copy(self, value: Any) -> Any:
        """A host copy of tensor ``value``, in the previous capture's tensor at this position if it fits."""
        import torch

        index = len(self._current)
        held = self._previous[index] if index < len(self._previous) else None
        source = value.detach()  # copy_ into a buffer must not record autograd history
        if (held is not None and type(value) in (torch.Tensor, torch.nn.Parameter)
                and source.layout == torch.strided and held.dtype == source.dtype
                and held.shape == source.shape and held.stride() == source.stride()):
            held.copy_(source)
            copied = held
        else:
            copied = source.to("cpu", copy=True)
        self._current.append(copied)
        return copied


def to_host(obj: Any, buffers: Optional[HostBuffers] = None) -> Any:
    """A copy of a state dict whose tensors are host (CPU) tensors, fresh or ``buffers``' own, and whose
    other values are copies too: the optimizer keeps changing the originals while the copy is written.
    Immutable leaves (numbers, strings, ``torch.Size``, dtypes, enums) are shared, not deep-copied: they were
    ~40 % of a snapshot's time in the loop (the ZeRO state's parameter shapes and DeepSpeed's config,
    measured on P2's model: ~2.4 ms of ~9 ms a snapshot)."""
    import torch

    immutable = (int, float, complex, str, bytes, type(None), torch.Size, torch.dtype, torch.device)

    held = HostBuffers() if buffers is None else buffers  # an empty one: every tensor gets a fresh copy

    def copy_of(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return held.copy(value)
        kind = type(value)
        if kind in (dict, OrderedDict):
            return kind((key, copy_of(item)) for key, item in value.items())
        if kind in (list, tuple):
            return kind(copy_of(item) for item in value)
        if isinstance(value, immutable):
            return value
        state = getattr(value, "__dict__", None)
        if type(state) is dict and _plain(kind) and all(isinstance(v, immutable) for v in state.values()):
            fresh = object.__new__(kind)  # what deepcopy makes of it, without its per-object machinery
            fresh.__dict__.update(state)
            return fresh
        return copy.deepcopy(value)

    return copy_of(obj)


def _plain(kind: type) -> bool:
    """Instances of ``kind`` are copied by copying their ``__dict__`` (no custom copy or pickle protocol, no
    slots): DeepSpeed's ZeRO state holds one such small record (``fragment_address``) per parameter."""
    return (kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__
            and getattr(kind, "__getstate__", None) is getattr(object, "__getstate__", None)  # 3.11 added it
            and not hasattr(kind, "__deepcopy__")
            and not hasattr(kind, "__slots__") and kind.__new__ is object.__new__)


class HostCapture:
    """Stands in for DeepSpeed's checkpoint engine during one ``save_checkpoint``: keeps ``(path, host
    copy)`` per file instead of writing. Directories are made for real (cheap, and DeepSpeed expects
    them)."""

    def __init__(self, buffers: Optional[HostBuffers] = None) -> None:
        self.files: List[Tuple[str, Any]] = []
        self.buffers = buffers

    def create(self, info: Any) -> None:
        pass

    def save(self, state_dict: Any, path: str) -> None:
        self.files.append((str(path), to_host(state_dict, self.buffers)))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        make_dir(path, exist_ok=exist_ok)

    def load(self, path: str, map_location: Any = None) -> Any:
        raise RuntimeError("HostCapture only captures saves")

    def commit(self, info: Any) -> bool:
        return True

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return False

    def set_commit_info(self, info: Any) -> None:
        pass

    def get_commit_info(self) -> None:
        return None

    def cleanup(self) -> None:
        pass

    def preserves_storage_sharing(self) -> bool:
        return False  # to_host already copies each tensor alone: no second clone


def capture(engine: Any, root: Path, tag: str, client_state: Dict[str, Any],
            buffers: Optional[HostBuffers] = None) -> List[Tuple[str, Any]]:
    """Run DeepSpeed's save on every rank with :class:`HostCapture` in place; returns this rank's files,
    copied into ``buffers`` when given (none of them may still be read by a writer).

    Two parts of DeepSpeed's save are left out here, as they cost the loop and add nothing to a capture: its
    check that every rank passed the same tag (two all-reduces; the tag is made from the step every rank
    agreed on) and its copy of the ``zero_to_fp32.py`` recovery scripts into ``root`` at every save (file
    I/O on the main thread; :meth:`Snapshots._write` copies them once per attempt on the writer thread)."""
    buffers = HostBuffers() if buffers is None else buffers
    held = HostCapture(buffers)
    buffers.start()
    real = engine.checkpoint_engine
    engine.checkpoint_engine = held
    engine._checkpoint_tag_validation = _skip
    engine._copy_recovery_script = _skip
    try:
        engine.save_checkpoint(str(root), tag=tag, client_state=client_state, save_latest=False)
    finally:
        engine.checkpoint_engine = real
        del engine._checkpoint_tag_validation, engine._copy_recovery_script  # the class's methods again
    buffers.finish()
    return held.files


def _skip(*_: Any) -> None:
    return None


def copy_recovery_scripts(engine: Any, root: Path) -> None:
    """DeepSpeed's own copy of its ZeRO recovery scripts into the checkpoint root (skipped by :func:`capture`)."""
    if getattr(engine, "save_zero_checkpoint", False):
        type(engine)._copy_recovery_script(engine, str(root))
