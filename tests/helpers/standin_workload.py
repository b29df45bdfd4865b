"""A tiny stand-in for ``launch.workloads.registry`` (used only when the real workloads cannot be imported).

Same interface: ``build_workload(cfg, device)`` -> object with ``model``, ``tokens_per_sample``,
``batch(start, count)``, ``loss(model, batch)``, ``evaluate(model)``. Byte-level next-token
prediction on a fixed text, sample ``i`` starting at a seeded pseudo-random offset.
"""
from __future__ import annotations

from typing import Dict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

_TEXT = ("It is a truth universally acknowledged, that a single run in possession of a good checkpoint "
         "must be in want of a resume. ") * 40


class _Block(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.out(F.gelu(self.fc(self.ln(x))))


class _TinyLM(nn.Module):
    def __init__(self, n_layers: int, d: int, seq_len: int, ckpt: bool):
        super().__init__()
        self.emb = nn.Embedding(256, d)
        self.pos = nn.Embedding(seq_len, d)
        self.blocks = nn.ModuleList(_Block(d) for _ in range(n_layers))
        self.head = nn.Linear(d, 256)
        self.ckpt = ckpt

    def forward(self, ids):
        x = self.emb(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.ckpt and torch.is_grad_enabled() else block(x)
        return self.head(x)


class StandInWorkload:
    def __init__(self, cfg, device):
        self.seq_len = cfg.model.seq_len
        self.tokens_per_sample = self.seq_len
        self.seed = cfg.train.seed
        self.data = torch.tensor(list(_TEXT.encode()), dtype=torch.long)
        self.device = torch.device(device)
        torch.manual_seed(self.seed)
        self.model = _TinyLM(cfg.model.n_layers, cfg.model.d_model, self.seq_len, cfg.train.activation_checkpointing)

    def batch(self, start: int, count: int) -> Dict[str, torch.Tensor]:
        span = len(self.data) - self.seq_len - 1
        offsets = [(i * 7919 + self.seed) % span for i in range(start, start + count)]
        windows = torch.stack([self.data[o:o + self.seq_len + 1] for o in offsets])
        return {"input_ids": windows[:, :-1], "labels": windows[:, 1:]}

    def loss(self, model, batch):
        logits = model(batch["input_ids"])
        return F.cross_entropy(logits.float().reshape(-1, 256), batch["labels"].reshape(-1))

    def evaluate(self, model) -> Dict[str, float]:
        was_training = model.training
        model.eval()
        with torch.no_grad():
            batch = {k: v.to(self.device) for k, v in self.batch(10**6, 8).items()}
            value = float(self.loss(model, batch))
        model.train(was_training)
        return {"eval/loss": value}


def build_workload(cfg, device="cpu"):
    return StandInWorkload(cfg, device)
