"""Byte-level GPT workload: a decoder-only transformer over raw bytes (vocabulary 256).

Sizes (``cfg.model``; parameter count = ``gpt_param_count``):

=====================  ========  =======  =======  =======  ===========================
setting                n_layers  d_model  n_heads  seq_len  parameters
=====================  ========  =======  =======  =======  ===========================
tests / CPU demo       4         128      4        64       0.84 M
``configs/gpt350m.yaml`` 28      1024     16       1024     354.3 M (one H100/H200)
=====================  ========  =======  =======  =======  ===========================

Data: the bytes of ``cfg.data.path`` if given (memory-mapped, so large files are fine), otherwise the
generated corpus shipped in ``launch/data/corpus.txt``. The last 5% of the bytes are held out for
``evaluate``. Sample ``i`` of the stream is the window of ``seq_len + 1`` bytes starting at position
``perm_e[i mod n]`` where ``n`` is the number of start positions in the training part and ``perm_e`` a
seeded permutation for epoch ``e = i div n`` (see ``sampling.py``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Dict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from launch.workloads import sampling
from launch.workloads.common import eval_mode, seeded_module

VOCAB = 256
EVAL_FRACTION = 0.05
MAX_EVAL_TOKENS = 8192  # keeps evaluate() well under a second at test sizes on a CPU
EVAL_BATCH = 16
# Above this many start positions a per-epoch permutation (8 bytes each) gets too big: draw uniformly.
MAX_PERMUTED_POSITIONS = 1 << 22
DEFAULT_CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"


def gpt_param_count(n_layers: int, d_model: int, seq_len: int) -> int:
    """Exact parameter count of :class:`ByteGPT` (no weight tying)."""
    d = d_model
    per_block = 12 * d * d + 13 * d  # qkv 3d^2+3d, proj d^2+d, mlp 8d^2+5d, two LayerNorms 4d
    return VOCAB * d + seq_len * d + n_layers * per_block + 2 * d + VOCAB * d


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention then a 4x MLP, both residual."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
        shape = (batch, length, self.n_heads, width // self.n_heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(batch, length, width)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class ByteGPT(nn.Module):
    """``forward(input_ids [B, T] int64) -> logits [B, T, vocab]`` (``vocab`` 256, raw bytes, unless a
    benchmark asks for a GPT-2-sized 50257; the training workload always uses the default)."""

    def __init__(self, n_layers: int, d_model: int, n_heads: int, seq_len: int, dropout: float = 0.0,
                 activation_checkpointing: bool = False, vocab: int = VOCAB):
        super().__init__()
        self.seq_len = seq_len
        self.activation_checkpointing = activation_checkpointing
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self._init_weights(n_layers)

    def _init_weights(self, n_layers: int) -> None:
        # GPT-2 style: small normal init; the projections that write into the residual stream are
        # scaled down by sqrt(2 * n_layers) so the residual's variance does not grow with depth.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for residual_out in (block.proj, block.out):
                nn.init.normal_(residual_out.weight, mean=0.0, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(positions))
        # Checkpointing only pays off when a backward pass will follow; under no_grad it would just
        # be overhead. Non-reentrant checkpointing restores the RNG state, so dropout masks in the
        # recomputation match the first pass and gradients are the same as without checkpointing.
        recompute = self.activation_checkpointing and torch.is_grad_enabled()
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return self.head(self.ln_f(x))


def load_bytes(path: str | None) -> np.ndarray:
    """The training text as a read-only uint8 array (memory-mapped, not read into RAM)."""
    file = Path(path) if path else DEFAULT_CORPUS
    if not file.is_file():
        raise FileNotFoundError(f"data.path={path!r}: no such file (the gpt workload needs a text file)")
    return np.memmap(file, dtype=np.uint8, mode="r")


class GPTWorkload:
    """Implements the ``Workload`` protocol of ``launch.workloads`` for :class:`ByteGPT`."""

    def __init__(self, cfg, device: torch.device | str = "cpu"):
        m = cfg.model
        self.device = torch.device(device)
        self.seq_len = m.seq_len
        self.tokens_per_sample = m.seq_len
        self.data = load_bytes(cfg.data.path)
        window = self.seq_len + 1
        n_eval = max(int(len(self.data) * EVAL_FRACTION), window)
        self.n_train = len(self.data) - n_eval
        n_positions = self.n_train - window + 1
        if n_positions < 1:
            raise ValueError(f"the gpt text has {len(self.data)} bytes: too short for model.seq_len={self.seq_len} "
                             f"(needs at least {2 * window} bytes: one window to train on and one held out)")
        seed = cfg.train.seed
        if n_positions <= MAX_PERMUTED_POSITIONS:
            self.stream = sampling.shuffled_epochs(n_positions, seed)
        else:
            self.stream = sampling.random_draws(n_positions, seed, sampling.TAG_RANDOM_POSITIONS)
        # Fixed, non-overlapping windows from the held-out tail (the +1 target byte may overlap).
        n_eval_windows = min((n_eval - 1) // self.seq_len, max(1, MAX_EVAL_TOKENS // self.seq_len))
        self.eval_starts = self.n_train + self.seq_len * np.arange(n_eval_windows)
        self.model = seeded_module(seed, lambda: ByteGPT(
            m.n_layers, m.d_model, m.n_heads, m.seq_len, m.dropout, cfg.train.activation_checkpointing))

    def _windows(self, starts: np.ndarray) -> Dict[str, torch.Tensor]:
        offsets = starts[:, None] + np.arange(self.seq_len + 1)[None, :]
        windows = torch.from_numpy(np.asarray(self.data[offsets], dtype=np.int64))
        return {"input_ids": windows[:, :-1].contiguous(), "labels": windows[:, 1:].contiguous()}

    def batch(self, start: int, count: int) -> Dict[str, torch.Tensor]:
        return self._windows(self.stream.take(start, count)["index"])

    def loss(self, model: nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["input_ids"])
        # Cross-entropy in FP32 even when the engine runs the model in BF16/FP16.
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), batch["labels"].reshape(-1))

    def evaluate(self, model: nn.Module) -> Dict[str, float]:
        """Mean next-byte loss on the held-out tail (nats; bits per byte = loss / ln 2).

        Under ZeRO-3 every rank must call this (the forward pass gathers parameters collectively)."""
        total, tokens = 0.0, 0
        with eval_mode(model):
            for i in range(0, len(self.eval_starts), EVAL_BATCH):
                batch = {k: v.to(self.device) for k, v in self._windows(self.eval_starts[i:i + EVAL_BATCH]).items()}
                n = batch["labels"].numel()
                total += self.loss(model, batch).item() * n
                tokens += n
        loss = total / tokens
        return {"eval/loss": loss, "eval/bits_per_byte": loss / math.log(2)}
