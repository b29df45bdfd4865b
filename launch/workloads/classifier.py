"""Classifier workload (the "skill/agent model"): an MLP on imbalanced tabular data.

Data: a CSV at ``cfg.data.path`` (numeric features, integer label in the last column, optional
header) or, by default, a dataset generated with ``sklearn.datasets.make_classification`` whose class
sizes fall geometrically from the largest to the smallest class by ``cfg.data.imbalance_ratio``
(default 1:50). The generated data is fixed (``DATA_SEED``); ``cfg.train.seed`` changes the model
init, the data order and the resampling, never the dataset. A stratified 20% is held out.

Imbalance handling (``cfg.data.imbalance_method``):

* ``none``: plain cross-entropy on the data in shuffled epochs.
* ``class_weight``: cross-entropy where each sample counts ``N / (K * n_class)``: every class
  contributes equally to the expected loss.
* ``weighted_sampler``: the stream draws training samples with probability proportional to
  1/frequency of their class (with replacement), so batches are balanced on average.
* ``mixup``: MixUp of inputs and one-hot targets. Plain MixUp on an imbalanced stream mostly blends
  majority samples with each other and does nothing for minority recall, so both partners come from
  the class-balanced stream: MixUp then acts as a regulariser against over-fitting the few,
  repeatedly drawn minority samples.
* ``smote``: ``imblearn.over_sampling.SMOTE`` oversamples the training set once at build time
  (deterministic by seed); the result is read in shuffled epochs.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hpc_agent.core.extras import require
from launch.workloads import sampling
from launch.workloads.common import eval_mode, param_dtype, seeded_module

DATA_SEED = 0
EVAL_FRACTION = 0.2
MIXUP_ALPHA = 0.4
EVAL_BATCH = 8192
# make_classification knobs for the generated data: overlapping classes (modest separation, few
# informative features, two clusters per class) so that minority classes are genuinely hard and a
# model trained with plain cross-entropy sacrifices them for the majority.
CLASS_SEP = 1.0
CLUSTERS_PER_CLASS = 2
# scikit-learn and imbalanced-learn come with the ``tabular`` extra. They are imported inside the
# functions that use them (through ``require``), so importing this module never needs them and a job
# without them fails with one line naming the extra.
FEATURE = "the classifier workload"
SMOTE_FEATURE = "the classifier workload's data.imbalance_method=smote"


def _sklearn(submodule: str):
    return require(f"sklearn.{submodule}", "tabular", FEATURE)


def class_sizes(num_samples: int, num_classes: int, ratio: float) -> np.ndarray:
    """Training-set size of each class: geometric from the largest (class 0) to the smallest, with
    largest / smallest >= ratio exactly (rounding is corrected on the largest class)."""
    if num_classes == 1:
        return np.array([num_samples])
    shares = ratio ** (-np.arange(num_classes) / (num_classes - 1))
    sizes = np.maximum(1, np.round(num_samples * shares / shares.sum())).astype(np.int64)
    sizes[0] = max(sizes[0], math.ceil(ratio * sizes[-1]))
    return sizes


def generate(num_samples: int, num_classes: int, num_features: int, ratio: float,
             seed: int = DATA_SEED) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_eval, y_eval)`` with ``class_sizes`` training samples per class and a
    stratified held-out set of EVAL_FRACTION of the total."""
    make_classification = _sklearn("datasets").make_classification
    train_sizes = class_sizes(num_samples, num_classes, ratio)
    eval_sizes = np.maximum(1, np.round(train_sizes * EVAL_FRACTION / (1 - EVAL_FRACTION))).astype(np.int64)
    needed = train_sizes + eval_sizes
    shares = needed / needed.sum()
    # make_classification rounds each cluster's size down: ask for a little more, then take exactly.
    n_generate = int(math.ceil(max((needed + CLUSTERS_PER_CLASS) / shares)))
    n_informative = min(num_features, max(int(math.ceil(math.log2(num_classes * CLUSTERS_PER_CLASS))) + 1,
                                          num_features // 4))
    x, y = make_classification(
        n_samples=n_generate, n_features=num_features, n_informative=n_informative,
        n_redundant=min(num_features - n_informative, n_informative), n_classes=num_classes,
        n_clusters_per_class=CLUSTERS_PER_CLASS, weights=list(shares), flip_y=0.0, class_sep=CLASS_SEP,
        random_state=seed)
    parts = {"train": [], "eval": []}
    for label in range(num_classes):
        members = np.flatnonzero(y == label)  # already in random order (make_classification shuffles)
        if len(members) < needed[label]:
            raise RuntimeError(f"class {label}: generated {len(members)} samples, need {needed[label]}")
        parts["train"].append(members[:train_sizes[label]])
        parts["eval"].append(members[train_sizes[label]:needed[label]])
    train, held = np.concatenate(parts["train"]), np.concatenate(parts["eval"])
    return x[train], y[train], x[held], y[held]


def load_csv(path: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A CSV of numeric features with the integer label last, split stratified (when every class has
    at least two samples) into training and held-out parts."""
    train_test_split = _sklearn("model_selection").train_test_split
    with open(path, encoding="utf-8") as handle:
        first = handle.readline().split(",")[0].strip()
    try:
        float(first)
        header = 0
    except ValueError:
        header = 1
    table = np.loadtxt(path, delimiter=",", skiprows=header, ndmin=2, dtype=np.float64)
    # Labels may be any integers: map them to 0..K-1.
    _, y = np.unique(table[:, -1].astype(np.int64), return_inverse=True)
    stratify = y if np.bincount(y).min() >= 2 else None
    x_train, x_eval, y_train, y_eval = train_test_split(
        table[:, :-1], y, test_size=EVAL_FRACTION, stratify=stratify, random_state=DATA_SEED)
    return x_train, y_train, x_eval, y_eval


class MLP(nn.Module):
    """``n_layers`` hidden layers of width ``d_model`` (Linear, ReLU, Dropout), then a linear head."""

    def __init__(self, num_features: int, num_classes: int, d_model: int, n_layers: int, dropout: float = 0.0):
        super().__init__()
        layers, width = [], num_features
        for _ in range(n_layers):
            layers += [nn.Linear(width, d_model), nn.ReLU(), nn.Dropout(dropout)]
            width = d_model
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class ClassifierWorkload:
    """Implements the ``Workload`` protocol of ``launch.workloads`` for :class:`MLP`."""

    tokens_per_sample = 1

    def __init__(self, cfg, device: torch.device | str = "cpu"):
        d = cfg.data
        # Fail at build time, not at the first evaluation, when the tabular extra is missing.
        _sklearn("metrics")
        if d.imbalance_method == "smote":
            require("imblearn.over_sampling", "tabular", SMOTE_FEATURE)
        self.device = torch.device(device)
        self.method = d.imbalance_method
        seed = cfg.train.seed
        if d.path:
            x_train, y_train, x_eval, y_eval = load_csv(d.path)
        else:
            x_train, y_train, x_eval, y_eval = generate(d.num_samples, d.num_classes, d.num_features, d.imbalance_ratio)
        self.num_classes = int(max(y_train.max(), y_eval.max()) + 1)
        # Standardise with training statistics: the MLP and SMOTE's nearest neighbours both want
        # features on one scale.
        mean, std = x_train.mean(axis=0), np.maximum(x_train.std(axis=0), 1e-6)
        x_train, x_eval = (x_train - mean) / std, (x_eval - mean) / std
        self.train_class_counts = np.bincount(y_train, minlength=self.num_classes)  # before resampling
        if self.method == "smote":
            x_train, y_train = self._smote(x_train, y_train, seed)
        self.x_train = torch.as_tensor(x_train, dtype=torch.float32)
        self.y_train = torch.as_tensor(y_train, dtype=torch.int64)
        self.x_eval = torch.as_tensor(x_eval, dtype=torch.float32)
        self.y_eval = torch.as_tensor(y_eval, dtype=torch.int64)

        self.class_weights: Optional[torch.Tensor] = None
        if self.method == "class_weight":
            counts = np.maximum(self.train_class_counts, 1)
            self.class_weights = torch.as_tensor(len(y_train) / (self.num_classes * counts), dtype=torch.float32)
        if self.method in ("weighted_sampler", "mixup"):
            probs = sampling.balanced_class_probs(y_train)
            self.stream = self._mixup_stream(probs, seed) if self.method == "mixup" else sampling.weighted_draws(probs, seed)
        else:
            self.stream = sampling.shuffled_epochs(len(y_train), seed)
        m = cfg.model
        self.model = seeded_module(seed, lambda: MLP(self.x_train.shape[1], self.num_classes, m.d_model,
                                                     m.n_layers, m.dropout))

    @staticmethod
    def _smote(x: np.ndarray, y: np.ndarray, seed: int) -> Tuple[np.ndarray, np.ndarray]:
        SMOTE = require("imblearn.over_sampling", "tabular", SMOTE_FEATURE).SMOTE
        smallest = int(np.bincount(y).min())
        if smallest < 2:
            raise ValueError("data.imbalance_method=smote needs at least 2 training samples in every class "
                             f"(the smallest class has {smallest}); use weighted_sampler or class_weight")
        sampler = SMOTE(k_neighbors=min(5, smallest - 1), random_state=seed % 2**32)
        return sampler.fit_resample(x, y)

    @staticmethod
    def _mixup_stream(probs: np.ndarray, seed: int, chunk_size: int = 1 << 14) -> sampling.ChunkedStream:
        """Balanced base samples, balanced partners and a Beta(alpha, alpha) mixing weight per entry."""
        cdf = np.cumsum(probs / probs.sum())
        cdf[-1] = 1.0

        def make(k: int) -> sampling.Chunk:
            rng = sampling.rng_for(seed, sampling.TAG_MIXUP, k)
            base = np.searchsorted(cdf, rng.random(chunk_size), side="right")
            partner = np.searchsorted(cdf, rng.random(chunk_size), side="right")
            lam = rng.beta(MIXUP_ALPHA, MIXUP_ALPHA, chunk_size).astype(np.float32)
            return {"index": base, "partner": partner, "lam": lam}

        return sampling.ChunkedStream(chunk_size, make)

    def batch(self, start: int, count: int) -> Dict[str, torch.Tensor]:
        entry = self.stream.take(start, count)
        index = torch.from_numpy(entry["index"].astype(np.int64))
        x, y = self.x_train[index], self.y_train[index]
        if self.method != "mixup":
            return {"x": x, "y": y}
        partner = torch.from_numpy(entry["partner"].astype(np.int64))
        lam = torch.from_numpy(entry["lam"])[:, None]
        y_soft = lam * F.one_hot(y, self.num_classes).float() + (1 - lam) * F.one_hot(self.y_train[partner], self.num_classes).float()
        return {"x": lam * x + (1 - lam) * self.x_train[partner], "y": y, "y_soft": y_soft}

    def loss(self, model: nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        # Inputs follow the model's dtype (BF16 under the engine); the loss is computed in FP32.
        logits = model(batch["x"].to(param_dtype(model))).float()
        if "y_soft" in batch:
            return -(batch["y_soft"].float() * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()
        per_sample = F.cross_entropy(logits, batch["y"], reduction="none")
        if self.class_weights is not None:
            per_sample = per_sample * self.class_weights.to(per_sample.device)[batch["y"]]
        return per_sample.mean()

    def evaluate(self, model: nn.Module) -> Dict[str, float]:
        """Held-out macro-F1, balanced accuracy, accuracy and (unweighted) cross-entropy."""
        metrics = _sklearn("metrics")
        dtype = param_dtype(model)
        logits = []
        with eval_mode(model):
            for i in range(0, len(self.x_eval), EVAL_BATCH):
                logits.append(model(self.x_eval[i:i + EVAL_BATCH].to(self.device, dtype)).float().cpu())
        logits_all = torch.cat(logits)
        predicted = logits_all.argmax(dim=1).numpy()
        truth = self.y_eval.numpy()
        return {
            "eval/loss": F.cross_entropy(logits_all, self.y_eval).item(),
            "eval/macro_f1": float(metrics.f1_score(truth, predicted, average="macro", zero_division=0)),
            "eval/balanced_accuracy": float(metrics.balanced_accuracy_score(truth, predicted)),
            "eval/accuracy": float((predicted == truth).mean()),
        }
