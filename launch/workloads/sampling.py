"""Deterministic, random-access sample streams.

A workload's data order is an *infinite stream of global sample numbers* 0, 1, 2, ... Any slice of it
can be asked for directly (``take(start, count)``) and is a pure function of the seed, so a run that is
resumed with another micro-batch size, accumulation or world size reads exactly the same samples for
each optimizer step. There is no iterator state to checkpoint.

The stream is cut into chunks of ``chunk_size`` entries; chunk ``k`` is built from its own RNG seeded
with ``(seed, tag, k)`` (NumPy's SeedSequence/PCG64 are stable across platforms and versions), so
building chunk 1000 never requires building chunks 0..999. A few recent chunks are cached because
consecutive batches almost always fall into the same chunk.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict

import numpy as np

# Distinct tags keep streams that share a seed independent (data order vs. MixUp partners ...).
TAG_ORDER = 1
TAG_WEIGHTED = 2
TAG_MIXUP = 3
TAG_RANDOM_POSITIONS = 4

Chunk = Dict[str, np.ndarray]


def rng_for(seed: int, *keys: int) -> np.random.Generator:
    """A generator determined only by ``seed`` and ``keys`` (negative seeds are folded into range)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**63, *keys])))


class ChunkedStream:
    """An infinite stream of records; chunk ``k`` (entries ``k*chunk_size ...``) is ``make_chunk(k)``.

    ``make_chunk`` returns a dict of equally long arrays (e.g. ``{"index": ..., "lam": ...}``).
    """

    def __init__(self, chunk_size: int, make_chunk: Callable[[int], Chunk], cache_chunks: int = 4):
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self.chunk_size = chunk_size
        self._make_chunk = make_chunk
        self._cache: "OrderedDict[int, Chunk]" = OrderedDict()
        self._cache_chunks = cache_chunks

    def chunk(self, k: int) -> Chunk:
        if k in self._cache:
            self._cache.move_to_end(k)
            return self._cache[k]
        made = self._make_chunk(k)
        self._cache[k] = made
        while len(self._cache) > self._cache_chunks:
            self._cache.popitem(last=False)
        return made

    def take(self, start: int, count: int) -> Chunk:
        """Entries ``start .. start+count-1`` as a dict of arrays of length ``count``."""
        if start < 0 or count < 0:
            raise ValueError(f"start and count must be >= 0, got start={start} count={count}")
        pieces: Dict[str, list] = {}
        position, end = start, start + count
        while position < end:
            k, offset = divmod(position, self.chunk_size)
            n = min(end - position, self.chunk_size - offset)
            for key, values in self.chunk(k).items():
                pieces.setdefault(key, []).append(values[offset:offset + n])
            position += n
        if not pieces:  # count == 0: keep the keys and dtypes of a real chunk
            return {key: values[:0] for key, values in self.chunk(start // self.chunk_size).items()}
        return {key: np.concatenate(parts) for key, parts in pieces.items()}


def shuffled_epochs(n: int, seed: int, tag: int = TAG_ORDER) -> ChunkedStream:
    """Every item 0..n-1 once per epoch, in a fresh seeded permutation each epoch."""
    return ChunkedStream(n, lambda epoch: {"index": rng_for(seed, tag, epoch).permutation(n)})


def random_draws(n: int, seed: int, tag: int, chunk_size: int = 1 << 16) -> ChunkedStream:
    """Items drawn uniformly with replacement: for item counts too large to permute per epoch."""
    return ChunkedStream(chunk_size, lambda k: {"index": rng_for(seed, tag, k).integers(0, n, chunk_size)})


def weighted_draws(probs: np.ndarray, seed: int, tag: int = TAG_WEIGHTED, chunk_size: int = 1 << 14) -> ChunkedStream:
    """Items drawn with replacement with probability ``probs[i]``."""
    probs = np.asarray(probs, dtype=np.float64)
    cdf = np.cumsum(probs / probs.sum())
    cdf[-1] = 1.0  # guard against rounding: every uniform draw must land on an item

    def make(k: int) -> Chunk:
        u = rng_for(seed, tag, k).random(chunk_size)
        return {"index": np.searchsorted(cdf, u, side="right").astype(np.int64)}

    return ChunkedStream(chunk_size, make)


def balanced_class_probs(labels: np.ndarray) -> np.ndarray:
    """Per-item probabilities proportional to 1/frequency of the item's class: every class is drawn
    equally often, whatever its size."""
    counts = np.bincount(labels)
    return 1.0 / counts[labels]
