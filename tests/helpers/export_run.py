"""A run directory for ``hpc-agent export``'s unit tests, without torch: config.yaml, checkpoints with real
COMPLETE.json markers (complete or not), TensorBoard scalars written by TensorBoard's own writer, and a stand-in
for the torch half (``export.export_weights``)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, Optional

from hpc_agent.config.load import build_config, to_yaml
from hpc_agent.core.checkpoint_format import MARKER, tag_for

SHARD = "mp_rank_00_model_states.pt"


def make_run(root: Path, name: str = "run1", complete: Iterable[int] = (2, 4), torn: Iterable[int] = (),
             scalars: Optional[Dict[str, Dict[int, float]]] = None, workload: str = "gpt") -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(build_config([{"train": {"workload": workload}}])))
    for step in list(complete) + list(torn):
        tag = run_dir / "checkpoints" / tag_for(step)
        tag.mkdir(parents=True)
        (tag / SHARD).write_bytes(b"x" * 10)
        if step in complete:
            (tag / MARKER).write_text(json.dumps({"version": 1, "step": step, "tag": tag.name, "files": {SHARD: 10},
                                                  "layout": {"zero_stage": 0, "world_size": 1}}))
    if scalars:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        writer = EventFileWriter(str(run_dir / "tb"), filename_suffix=".attempt0")
        for tag_name, points in scalars.items():
            for step, value in points.items():
                summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag_name, simple_value=value)])
                writer.add_event(event_pb2.Event(step=step, wall_time=1000.0 + step, summary=summary))
        writer.close()
    return run_dir


def stand_in_weights(tag_dir: Path, dest: Path, meta):
    """``export.export_weights`` without torch: writes a placeholder file and says what it was given."""
    from hpc_agent.export import Weights

    dest.write_text(json.dumps({"tag": tag_dir.name, "meta": meta({})}))
    return Weights("stand-in", {"net.0.weight": (8, 5), "net.2.weight": (3, 8)}, {}, 64)
