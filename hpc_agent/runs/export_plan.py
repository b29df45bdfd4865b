"""What ``hpc-agent export`` decides, without I/O: which checkpoint (the newest complete one, ``--step N``, or the
best by a TensorBoard scalar), whether lower or higher is better for a metric, and the README's text with the
code that loads the weights. The command (``hpc_agent/export.py``) reads the disk and writes the files.

Which checkpoints count is the resume's rule (``hpc_agent.core.checkpoint_format.problem``): a checkpoint or an
asynchronous snapshot whose ``COMPLETE.json`` lists every file with its size. Where both exist for one step the
full checkpoint is taken (the same tie-break as the resume).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

MIN, MAX = "min", "max"
MODES = (MIN, MAX)
_LOWER_SUBSTRINGS = ("loss", "perplexity", "error", "bits_per_byte")
_LOWER_WORDS = {"ppl", "err", "mse", "mae", "rmse", "nll", "bpb", "cer", "wer"}
_HIGHER_WORDS = {"accuracy", "acc", "f1", "auc", "auroc", "precision", "recall", "bleu", "rouge", "score", "iou",
                 "map", "reward", "r2"}


class ExportError(Exception):
    """A usage problem (exit 2): the message says what is wrong and what to do instead."""


@dataclass(frozen=True)
class Ckpt:
    """One complete checkpoint (or snapshot) directory under ``<run dir>/checkpoints``."""

    step: int
    name: str


@dataclass(frozen=True)
class Pick:
    ckpt: Ckpt
    why: str
    """One line: how it was chosen (newest, --step, best METRIC=VALUE of N checkpoints)."""


def default_mode(metric: str) -> Optional[str]:
    """``min`` for a name that reads like a loss (loss, perplexity, error, ...), ``max`` for one that reads like a
    score (accuracy, f1, auc, ...), None when the name does not say: then ``--mode`` must."""
    low = metric.lower()
    words = set(re.split(r"[^a-z0-9]+", low))
    if any(s in low for s in _LOWER_SUBSTRINGS) or words & _LOWER_WORDS:
        return MIN
    if words & _HIGHER_WORDS:
        return MAX
    return None


def complete_checkpoints(found: Sequence[Tuple[int, str, Optional[str]]]) -> Tuple[List[Ckpt], Dict[int, str]]:
    """``found``: ``(step, name, problem)`` per checkpoint directory (problem None: complete). Returns the complete
    ones oldest first, one per step (a full checkpoint over a snapshot), and why each step that has no complete
    one was passed over."""
    by_step: Dict[int, Ckpt] = {}
    broken: Dict[int, str] = {}
    for step, name, why in sorted(found, key=lambda f: (f[0], not f[1].startswith("snap_"))):
        if why is None:
            by_step[step] = Ckpt(step, name)  # sorted: the full checkpoint comes last and wins
        else:
            broken.setdefault(step, f"{name}: {why}")
    return [by_step[s] for s in sorted(by_step)], {s: w for s, w in broken.items() if s not in by_step}


def _steps(ckpts: Sequence[Ckpt]) -> str:
    return ", ".join(str(c.step) for c in ckpts)


def pick(ckpts: Sequence[Ckpt], broken: Mapping[int, str], run_id: str, step: Optional[int] = None,
         metric: Optional[str] = None, mode: Optional[str] = None,
         series: Optional[Mapping[int, float]] = None, tags: Sequence[str] = ()) -> Pick:
    """The checkpoint to export; ExportError naming the fix when there is none to take.

    ``series``: the metric's value per step (TensorBoard, restarts purged), for ``metric``; ``tags``: the scalar
    tags the run logged (named when ``metric`` is not one of them)."""
    if not ckpts:
        extra = (" (incomplete: " + "; ".join(broken[s] for s in sorted(broken)) + ")") if broken else ""
        raise ExportError(f"run {run_id} has no complete checkpoint{extra}. A checkpoint is written every "
                          "train.ckpt_every steps and at the end: let the run reach one, or export another run")
    if step is not None:
        for c in ckpts:
            if c.step == step:
                return Pick(c, f"step {step} (--step)")
        why = f": {broken[step]}" if step in broken else ""
        raise ExportError(f"run {run_id} has no complete checkpoint of step {step}{why}; complete checkpoints: "
                          f"steps {_steps(ckpts)}. Pass one of them to --step, or leave --step out for the newest")
    if metric is None:
        return Pick(ckpts[-1], f"the newest complete checkpoint (step {ckpts[-1].step})")
    mode = mode or default_mode(metric)
    if mode not in MODES:
        raise ExportError(f"--best {metric}: cannot tell from the name whether lower or higher is better; add "
                          "--mode min (lower is better, as for a loss) or --mode max (higher is better, as for "
                          "an accuracy)")
    if metric not in tags:
        shown = ", ".join(tags) if tags else "none (no TensorBoard event files under tb/)"
        raise ExportError(f"--best {metric}: run {run_id} logged no such TensorBoard scalar; its scalars: {shown}")
    values = {c.step: series[c.step] for c in ckpts if series and c.step in series and math.isfinite(series[c.step])}
    if not values:
        logged = sorted(series or {})
        shown = ", ".join(map(str, logged[:20])) + (", ..." if len(logged) > 20 else "")
        raise ExportError(f"--best {metric}: no complete checkpoint's step has a (finite) {metric} value; "
                          f"checkpoints: steps {_steps(ckpts)}; {metric} logged at steps {shown or 'none'}. "
                          f"Log it at checkpoint steps (train.eval_every dividing train.ckpt_every), or use --step")
    sign = 1.0 if mode == MIN else -1.0
    best = min(values, key=lambda s: (sign * values[s], -s))  # a tie: the later step
    chosen = next(c for c in ckpts if c.step == best)
    return Pick(chosen, f"the best {metric} ({mode}) of {len(values)} complete checkpoint(s): "
                        f"{values[best]:.6g} at step {best}")


# --- the README ------------------------------------------------------------------------------------------------
def _ident(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def load_code(workload: str, shapes: Mapping[str, Sequence[int]], config_path_hint: str) -> str:
    """Python that builds the model and loads ``model.safetensors`` into it, for the run's ``train.workload``.
    ``shapes``: the exported tensors' shapes (the classifier's input and class counts come from them)."""
    head = ["import json", "", "from safetensors.torch import load_file", ""]
    tail = ['model.load_state_dict(load_file("model.safetensors"))', "model.eval()"]
    if workload == "gpt":
        body = ["from launch.workloads.gpt import ByteGPT  # hpc_agent's launch package", "",
                'config = json.load(open("config.json"))',
                'model = ByteGPT(config["n_layers"], config["d_model"], config["n_heads"], config["seq_len"])']
        return "\n".join(head + body + tail)
    if workload == "classifier":
        layers = sorted(int(m.group(1)) for m in (re.match(r"^net\.(\d+)\.weight$", k) for k in shapes) if m)
        features = shapes[f"net.{layers[0]}.weight"][1] if layers else "NUM_FEATURES"
        classes = shapes[f"net.{layers[-1]}.weight"][0] if layers else "NUM_CLASSES"
        body = ["from launch.workloads.classifier import MLP  # hpc_agent's launch package", "",
                'config = json.load(open("config.json"))',
                f'model = MLP({features}, {classes}, config["d_model"], config["n_layers"])'
                "  # features, classes: the data's"]
        return "\n".join(head + body + tail)
    module, _, attr = workload.partition(":")
    if not (module and attr and _ident(module) and _ident(attr)):
        return "\n".join(head + ["model = ...  # your model, as train.workload builds it"] + tail)
    first, _, rest = attr.partition(".")
    call = f"{first}.{rest}" if rest else first
    body = ["from hpc_agent.config.load import load_snapshot", f"from {module} import {first}", "",
            f'cfg = load_snapshot("{config_path_hint}")  # the run\'s config',
            f'model = {call}(cfg, "cpu").model  # your train.workload builds it']
    return "\n".join(["from safetensors.torch import load_file", ""] + body + tail)


def _cell(value: object) -> str:
    """A job-written string, made safe for one Markdown table cell on one line."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    return text.replace("|", "\\|")[:200]


def readme(run_id: str, step: int, tag: str, why: str, workload: str, layout: Mapping[str, object],
           metrics: Mapping[str, float], code: str, tied: Mapping[str, str], source: str,
           n_tensors: int, n_values: int) -> str:
    """The exported folder's README.md."""
    trained = ", ".join(f"{k} {_cell(layout[k])}" for k in ("zero_stage", "world_size", "precision", "offload")
                        if k in layout) or "unknown"
    lines = [f"# {_cell(run_id)}, step {step}", "",
             f"Exported by `hpc-agent export` from checkpoint `{_cell(tag)}` of run `{_cell(run_id)}`: {why}.", "",
             f"- workload: `{_cell(workload)}`",
             f"- trained with: {trained}",
             f"- weights: {source}; {n_tensors} tensors, {n_values:,} values",
             "- `model.safetensors`: the model's state dict (safetensors); `config.json`: the run config's "
             "`model` section", ""]
    lines += ["## Metrics at this step (TensorBoard)", ""]
    if metrics:
        lines += ["| scalar | value |", "| --- | --- |"]
        lines += [f"| `{_cell(k)}` | {v:.6g} |" for k, v in sorted(metrics.items())]
    else:
        lines += ["None logged at this step."]
    lines += ["", "## Load it", "", "```python", code, "```", ""]
    if tied:
        pairs = ", ".join(f"`{_cell(a)}` = `{_cell(b)}`" for a, b in sorted(tied.items()))
        lines += ["Tied weights: safetensors stores no shared tensors, so each of these is a copy of the other "
                  f"(same values): {pairs}. `load_state_dict` loads both names; a model that ties them shares "
                  "one parameter again.", ""]
    return "\n".join(lines)


def metadata(run_id: str, step: int, workload: str, tied: Mapping[str, str]) -> Dict[str, str]:
    """The safetensors header's ``__metadata__`` (strings only)."""
    return {"format": "pt", "hpc_agent.run_id": run_id, "hpc_agent.step": str(step),
            "hpc_agent.workload": workload, "hpc_agent.tied": json.dumps(dict(sorted(tied.items())))}
