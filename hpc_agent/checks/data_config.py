"""Infer the ``data`` section of a config from a dataset file (used by ``doctor --data``).

Pure functions plus one small reader; standard library only. The classifier workload reads a CSV whose
last column is the integer label (launch/workloads/classifier.py); TSV and JSONL are read the same way
(last column / the ``label`` key). A plain text file is a corpus for the ``gpt`` workload: no classes.

Rule for ``imbalance_method`` (ratio = samples of the largest class / samples of the smallest):
  ratio < 3        -> none              (plain cross-entropy copes)
  3 <= ratio <= 20 -> class_weight      (a weighted loss is enough)
  ratio > 20       -> weighted_sampler  (the rare classes must be seen more often; smote also fits)
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

FORMATS = ("csv", "tsv", "jsonl", "text")
_EXT = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "text", ".text": "text"}
NONE_BELOW = 3.0
CLASS_WEIGHT_UP_TO = 20.0
RULE = (f"ratio < {NONE_BELOW:g}: none; up to {CLASS_WEIGHT_UP_TO:g}: class_weight; "
        f"beyond: weighted_sampler (or smote)")
LABEL_KEYS = ("label", "labels", "class", "target", "y")


def detect_format(path: str | Path, first_line: str = "") -> str:
    """The format from the extension, else sniffed from the first line."""
    ext = Path(path).suffix.lower()
    if ext in _EXT:
        return _EXT[ext]
    line = first_line.strip()
    if line.startswith("{"):
        return "jsonl"
    if "\t" in line:
        return "tsv"
    if "," in line and all(_is_number(f) for f in line.split(",")[-1:]):
        return "csv"
    return "text"


def _is_number(field: str) -> bool:
    try:
        float(field.strip())
        return True
    except ValueError:
        return False


def _label(value: Any) -> Any:
    """Labels as the classifier sees them: integers (``2.0`` -> 2); anything else stays a string."""
    text = str(value).strip()
    try:
        number = float(text)
        return int(number) if number.is_integer() else text
    except ValueError:
        return text


def labels_from_lines(lines: Iterable[str], fmt: str) -> List[Any]:
    """Labels of a delimited (last column, optional header) or JSONL (``label`` key, else last key) file."""
    out: List[Any] = []
    if fmt == "jsonl":
        for line in lines:
            if not line.strip():
                continue
            row = json.loads(line)
            key = next((k for k in LABEL_KEYS if k in row), list(row)[-1])
            out.append(_label(row[key]))
        return out
    sep = "\t" if fmt == "tsv" else ","
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        fields = line.rstrip("\r\n").split(sep)
        if i == 0 and not _is_number(fields[0]):
            continue  # header row, as the classifier's reader treats it
        out.append(_label(fields[-1]))
    return out


def class_counts(labels: Iterable[Any]) -> Dict[Any, int]:
    counts = Counter(labels)
    return dict(sorted(counts.items(), key=lambda kv: str(kv[0]) if not isinstance(kv[0], int) else f"{kv[0]:020d}"))


def imbalance_ratio(counts: Dict[Any, int]) -> float:
    if not counts:
        return 1.0
    return max(counts.values()) / min(counts.values())


def suggest_method(ratio: float) -> str:
    if ratio < NONE_BELOW:
        return "none"
    if ratio <= CLASS_WEIGHT_UP_TO:
        return "class_weight"
    return "weighted_sampler"


def infer_from_lines(path: str, lines: List[str], fmt: Optional[str] = None) -> Dict[str, Any]:
    """Everything ``doctor --data`` reports about a dataset, from its lines."""
    fmt = fmt or detect_format(path, lines[0] if lines else "")
    if fmt == "text":
        return {"path": path, "format": "text", "workload": "gpt", "bytes": sum(len(l.encode()) for l in lines)}
    counts = class_counts(labels_from_lines(lines, fmt))
    if not counts:
        raise ValueError(f"{path}: no labelled rows found")
    ratio = imbalance_ratio(counts)
    return {"path": path, "format": fmt, "workload": "classifier", "num_classes": len(counts),
            "class_counts": counts, "num_samples": sum(counts.values()),
            "imbalance_ratio": round(ratio, 2), "imbalance_method": suggest_method(ratio), "rule": RULE}


def infer_file(path: str | Path) -> Dict[str, Any]:
    """Read ``path`` (UTF-8) and infer its data section."""
    p = Path(path)
    with open(p, encoding="utf-8", errors="replace") as handle:
        lines = handle.readlines()
    return infer_from_lines(str(p.resolve()), lines)


def to_layer(info: Dict[str, Any]) -> Dict[str, Any]:
    """The config layer (a plain dict that ``build_config`` merges)."""
    data: Dict[str, Any] = {"path": info["path"]}
    if info["workload"] == "classifier":
        data.update(num_classes=info["num_classes"], imbalance_ratio=max(1.0, float(info["imbalance_ratio"])),
                    imbalance_method=info["imbalance_method"])
    return {"train": {"workload": info["workload"]}, "data": data}


def render_yaml(info: Dict[str, Any]) -> str:
    """The data section as YAML with a comment header (format, class counts, the rule)."""
    from omegaconf import OmegaConf

    head = [f"# Inferred by python -m hpc_agent.doctor --data from {info['path']}", f"# format: {info['format']}"]
    if info["workload"] == "classifier":
        counts = ", ".join(f"{k}: {v}" for k, v in info["class_counts"].items())
        head += [f"# samples: {info['num_samples']}, classes: {info['num_classes']}",
                 f"# class counts: {counts}",
                 f"# imbalance ratio (largest/smallest): {info['imbalance_ratio']}",
                 f"# imbalance_method rule: {info['rule']}"]
        if info["format"] != "csv":
            head.append("# note: the classifier workload reads CSV (label last); convert this file to CSV")
    else:
        head.append("# plain text: a corpus for the gpt workload (no classes)")
    return "\n".join(head) + "\n" + OmegaConf.to_yaml(OmegaConf.create(to_layer(info)))
