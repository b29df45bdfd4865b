"""Resume: which checkpoint, how to load it, and the load itself (``launch/engine.py`` builds the engine).

Rank 0 alone reads the markers and picks the newest complete checkpoint or snapshot, so every rank agrees even
on a lagging file system. The saved layout against this attempt's (``launch/universal.py``) says whether a
plain load works, whether DeepSpeed needs a universal checkpoint (another data-parallel size or ZeRO stage),
or whether the change cannot be honoured. A universal copy is made by rank 0 before the engine is built
(DeepSpeed reads ``load_universal`` from its config) and removed after the load.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from hpc_agent.core.checkpoint_format import scan, select
from hpc_agent.core.exit_codes import EXIT_CONFIG
from launch import universal
from launch.recovery import adopt_configured_lr
from launch.rng import seed as seed_rng, set_rng_state


@dataclass(frozen=True)
class Source:
    """Where the engine loads from: ``tag`` under ``load_dir`` (None: nothing to resume), and whether it is a
    universal copy made for this attempt."""
    load_dir: Path
    tag: Optional[str] = None
    converted: bool = False


def choose(ckpt_root: Path, rank: int, broadcast_object: Callable[[Any], Any],
           say: Callable[[str], None]) -> Optional[Dict[str, Any]]:
    """The newest usable checkpoint's name and saved layout, as rank 0 chose it (None: start fresh)."""
    found = None
    if rank == 0:
        selection = select(scan(ckpt_root))
        for line in selection.lines():
            say(line)
        if selection.chosen is not None:
            found = {"name": selection.chosen.name, "layout": selection.chosen.marker.get("layout")}
    return broadcast_object(found)


def prepare(ckpt_root: Path, choice: Optional[Dict[str, Any]], layout: Any, names: List[str], rank: int,
            barrier: Callable[[], None], say: Callable[[str], None]) -> Optional[Source]:
    """Plan the load of ``choice`` into an engine of ``layout``; converts to a universal checkpoint where needed.
    None: the layout change cannot be honoured (said; the caller exits with ``EXIT_CONFIG``)."""
    if choice is None:
        return Source(ckpt_root)
    saved = choice["layout"] or layout  # a marker without a layout: assume it is ours
    plan = universal.plan(saved, layout)
    if rank == 0:
        say(f"resume plan for {choice['name']}: {plan.mode}: {plan.reason}")
    if plan.mode == universal.REFUSE:
        say(f"cannot resume: {plan.reason}; exiting {EXIT_CONFIG}")
        return None
    tag = choice["name"]
    if plan.mode not in (universal.UNIVERSAL, universal.FROM_STAGE0):
        return Source(ckpt_root, tag)
    load_dir = ckpt_root / universal.UNIVERSAL_DIR
    if rank == 0:
        t0 = time.perf_counter()
        universal.convert(ckpt_root / tag, load_dir / tag, plan.mode, names)
        say(f"converted {tag} to a universal checkpoint in {time.perf_counter() - t0:.1f}s")
    barrier()
    return Source(load_dir, tag, converted=True)


def load(engine: Any, source: Source, lr: float, seed: int, rank: int, world: int, on_cuda: bool,
         barrier: Callable[[], None], say: Callable[[str], None],
         restore: Optional[Callable[[Dict[str, Any]], None]] = None) -> int:
    """Load ``source`` into the built engine; returns the checkpoint's step. RNG state per rank when the
    world size is the same, else a deterministic reseed. ``restore`` gets the checkpoint's client state
    before the LR is adopted (the adaptive schedule's state, which the LR lambda reads)."""
    path, client = engine.load_checkpoint(str(source.load_dir), tag=source.tag)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {source.tag} from {source.load_dir}")
    step = int(client["step"])
    if restore is not None:
        restore(client)
    if adopt_configured_lr(engine, lr) and rank == 0:
        say(f"learning rate from the config: train.lr {lr:g} (the checkpoint had another)")
    rng = client.get("rng") or []
    if len(rng) == world:
        set_rng_state(rng[rank], on_cuda)
    else:  # other world size: no per-rank state to take over; reseed deterministically
        seed_rng(seed + 1000 * rank + 7919 * step)
    if source.converted:
        barrier()
        if rank == 0:
            import shutil

            shutil.rmtree(source.load_dir / source.tag, ignore_errors=True)
    if rank == 0:
        say(f"resumed at step {step} (data position {client.get('data_position')} samples) from {source.tag}")
    return step
