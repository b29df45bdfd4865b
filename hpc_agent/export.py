"""``hpc-agent export RUN [--step N | --best METRIC [--mode min|max]] --out DIR [--force]``

One checkpoint of a run as a plain model: ``model.safetensors`` (the FP32 weights, consolidated from DeepSpeed's
ZeRO shards by DeepSpeed's own ``get_fp32_state_dict_from_zero_checkpoint``), ``config.json`` (the run config's
``model`` section) and ``README.md`` (run, step, the metrics logged at that step, the code that loads it).
docs/export.md.

The choice of checkpoint is pure (:mod:`hpc_agent.runs.export_plan`); this module reads the run and writes the
folder. torch, DeepSpeed and safetensors are imported only inside :func:`export_weights`.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure
from hpc_agent.runs.export_plan import MODES, ExportError
from hpc_agent.core.fsutil import fsync

log = logging.getLogger("hpc_agent.export")
WEIGHTS, CONFIG_JSON, README = "model.safetensors", "config.json", "README.md"
OUT_FILES = (WEIGHTS, CONFIG_JSON, README)


def build_parser() -> argparse.ArgumentParser:
    from hpc_agent.config.load import RUNS_ENV

    p = argparse.ArgumentParser(
        prog=invocation.prog("export"),
        description="Export one complete checkpoint of a run as model.safetensors + config.json + README.md "
                    "(DeepSpeed ZeRO 0-3, any number of ranks, with or without offload).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  hpc-agent export gpt-20261204-101500-ab12 --out exported/          # the newest checkpoint\n"
               "  hpc-agent export runs/gpt-20261204-101500-ab12 --step 400 --out exported/\n"
               "  hpc-agent export RUN --best eval/loss --out best/                  # lowest eval/loss\n"
               "  hpc-agent export RUN --best eval/macro_f1 --out best/              # highest (max by name)\n"
               "Reads the checkpoint's files with torch.load (pickles, like a resume does): export runs you "
               "trust. docs/export.md\n" + exit_status.epilog(exit_status.OK, exit_status.USAGE))
    p.add_argument("run", metavar="RUN_ID | RUN_DIR",
                   help="a run id (in the runs root's ledger, or a directory there) or a path to a run directory")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, metavar="N", help="the complete checkpoint of step N (default: the newest)")
    which.add_argument("--best", metavar="METRIC",
                       help="the complete checkpoint whose step has the best value of this TensorBoard scalar "
                            "(e.g. eval/loss)")
    p.add_argument("--mode", choices=MODES, default=None,
                   help="with --best: min (lower is better) or max; default by the name: min for loss, "
                        "perplexity, error; max for accuracy, f1, auc, ...")
    p.add_argument("--out", metavar="DIR", required=True,
                   help="folder to write (created; an existing one must be empty unless --force)")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out: its model.safetensors, config.json and README.md are "
                        "replaced, other files stay")
    p.add_argument("--runs-root", help=f"where run directories live (default: ${RUNS_ENV} or ./runs)")
    return add_common_arguments(p)


# --- the weights (torch, DeepSpeed, safetensors: imported here only) ------------------------------------------
@dataclass
class Weights:
    """What :func:`export_weights` wrote."""

    source: str
    """One line: where the values came from (for the README)."""
    shapes: Dict[str, Sequence[int]] = field(default_factory=dict)
    tied: Dict[str, str] = field(default_factory=dict)
    """name -> the name whose tensor it shared (stored as a copy)."""
    values: int = 0


def _stage0_state(path: Path, torch: Any) -> tuple:
    """ZeRO-0 keeps the whole model in ``mp_rank_00_model_states.pt`` (``module``); DeepSpeed has no consolidation
    for it (nothing is sharded). FP32 training: those are the weights. BF16/FP16: ``module`` holds the 16-bit
    copy and the optimizer the FP32 masters (``fp32_groups``, or ``fp32_groups_flat``), in parameter order; they
    are used when they match the trainable parameters one to one (by count of values), else the 16-bit weights."""
    states = torch.load(path, map_location="cpu", weights_only=False)
    module = dict(states["module"])
    half = [k for k, v in module.items() if torch.is_tensor(v) and v.is_floating_point() and v.dtype != torch.float32]
    if not half:
        return module, "the FP32 weights of the ZeRO-0 checkpoint"
    buffers = set(states.get("buffer_names") or ())
    opt = states.get("optimizer") or {}
    groups = opt.get("fp32_groups") or opt.get("fp32_groups_flat") or []
    masters = [t for g in groups for t in (g if isinstance(g, (list, tuple)) else [g])]
    first_of: Dict[Any, str] = {}
    names = []
    for name, value in module.items():
        if name in buffers or not torch.is_tensor(value):
            continue
        key = value.untyped_storage().data_ptr()
        if key in first_of and value.numel():
            continue
        first_of[key] = name
        names.append(name)
    flat = torch.cat([m.reshape(-1).float() for m in masters]) if masters else torch.empty(0)
    if flat.numel() != sum(module[n].numel() for n in names):
        return module, f"the {module[half[0]].dtype} weights of the ZeRO-0 checkpoint (its FP32 master copy did " \
                       "not match the parameters one to one)"
    offset, fresh = 0, {}
    for name in names:
        value = module[name]
        fresh[value.untyped_storage().data_ptr()] = flat[offset:offset + value.numel()].view(value.shape).clone()
        offset += value.numel()
    out = {}
    for name, value in module.items():
        key = value.untyped_storage().data_ptr() if torch.is_tensor(value) else None
        out[name] = fresh.get(key, value) if name not in buffers else value
    return out, "the FP32 master weights of the ZeRO-0 checkpoint (its optimizer's copy)"


def _untie(state: Dict[str, Any], torch: Any) -> tuple:
    """safetensors refuses tensors that share storage. Two kinds do here: tied weights (DeepSpeed's state dict
    gives both names one tensor) and ZeRO-1/2's consolidated parameters (views into one flat FP32 buffer). Every
    tensor after the first on a storage gets its own contiguous copy; returns the tensors and ``{copy: original}``
    for the tied ones (the same view of the same storage). Non-tensor entries are dropped."""
    storages: set = set()
    views: Dict[Any, str] = {}
    out: Dict[str, Any] = {}
    tied: Dict[str, str] = {}
    for name, value in state.items():
        if not torch.is_tensor(value):
            continue
        value = value.detach()
        storage = value.untyped_storage().data_ptr()
        view = (storage, value.storage_offset(), tuple(value.shape), tuple(value.stride()))
        if value.numel() and view in views:
            tied[name] = views[view]
        if value.numel() and storage in storages:
            out[name] = value.clone(memory_format=torch.contiguous_format)
        else:
            out[name] = value.contiguous()
        if value.numel():
            storages.add(storage)
            views.setdefault(view, name)
    return out, tied


def export_weights(tag_dir: Path, dest: Path, meta: Callable[[Dict[str, str]], Dict[str, str]]) -> Weights:
    """Consolidate the DeepSpeed checkpoint ``tag_dir`` and write it to ``dest`` (safetensors). ZeRO 1-3 (any
    number of ranks, offloaded or not: the shards are the same) go through DeepSpeed's
    ``get_fp32_state_dict_from_zero_checkpoint``; ZeRO-0 through :func:`_stage0_state`. ``meta(tied)``: the
    header's metadata. DeepSpeed's chatter goes to stderr (stdout carries the command's result)."""
    with contextlib.redirect_stdout(sys.stderr):
        import torch
        from safetensors.torch import save_file

        sharded = any(p.name.endswith("_optim_states.pt") for p in tag_dir.iterdir())
        if sharded:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            state = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
            source = "the FP32 master weights, consolidated from the ZeRO shards by DeepSpeed " \
                     "(get_fp32_state_dict_from_zero_checkpoint)"
        else:
            state, source = _stage0_state(tag_dir / "mp_rank_00_model_states.pt", torch)
        tensors, tied = _untie(state, torch)
        log.info("export: writing %d tensors to %s", len(tensors), dest)
        save_file(tensors, str(dest), metadata=meta(tied))
    return Weights(source, {k: tuple(v.shape) for k, v in tensors.items()}, tied,
                   sum(v.numel() for v in tensors.values()))


# --- the folder ----------------------------------------------------------------------------------------------
def out_problem(out: Path, force: bool) -> Optional[str]:
    """Why ``--out`` cannot be written, or None."""
    if out.is_symlink():
        return f"--out {out} is a symbolic link: give the real folder"
    if out.exists() and not out.is_dir():
        return f"--out {out} exists and is not a folder: give a folder path"
    if out.is_dir() and any(out.iterdir()) and not force:
        return (f"--out {out} is not empty: give a new or empty folder, or add --force (replaces "
                f"{', '.join(OUT_FILES)} there; other files stay)")
    return None


def publish(staging: Path, out: Path) -> None:
    """Move the written files into place: the whole folder in one rename when ``out`` is absent or empty, else
    each file by ``os.replace`` (a reader sees an old file or the new one, never half of one)."""
    umask = os.umask(0)
    os.umask(umask)
    for name in OUT_FILES:
        os.chmod(staging / name, 0o666 & ~umask)  # as any file the user writes (safetensors writes 0600)
        fsync(staging / name)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp made it 0700
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        os.replace(staging, out)
        return
    for name in OUT_FILES:
        os.replace(staging / name, out / name)
    staging.rmdir()


def _text(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def run_export(args: argparse.Namespace) -> int:
    from hpc_agent.config.load import load_run_config, to_dict
    from hpc_agent.config.problems import ConfigError
    from hpc_agent.core import checkpoint_format, rundir
    from hpc_agent.diagnose import UsageError, resolve_run
    from hpc_agent.metrics.tb_reader import RunScalars
    from hpc_agent.runs import export_plan

    if args.mode and not args.best:
        raise ExportError("--mode goes with --best METRIC")
    out = Path(args.out).expanduser().absolute()
    problem = out_problem(out, args.force)
    if problem:
        raise ExportError(problem)
    try:
        target = resolve_run(args.run, args)
    except UsageError as exc:  # diagnose's wording also offers a job id, which export does not take
        raise ExportError(str(exc).replace(" is neither a Slurm job id (12, 12_3, 12+1) nor a run", " is not a run")
                          + "; give a run id (--runs-root) or a run directory") from None
    run_dir, run_id = target.run_dir, target.run_id
    try:
        cfg = load_run_config(run_dir)
    except (OSError, ConfigError, ValueError) as exc:
        raise ExportError(f"run {run_id}: cannot read its config ({rundir.config_path(run_dir)}): {exc}. export "
                          "needs the run's config.yaml (its model section and train.workload)") from None
    try:
        found = checkpoint_format.scan(rundir.checkpoints_dir(run_dir))
    except OSError as exc:
        raise ExportError(f"run {run_id}: {exc}") from None
    ckpts, broken = export_plan.complete_checkpoints([(c.step, c.name, checkpoint_format.problem(c)) for c in found])
    scalars = RunScalars(rundir.tb_dir(run_dir))
    if ckpts:
        scalars.update()
    for line in scalars.problems():
        log.warning("export: %s", line)
    series = {p.step: p.value for p in scalars.series(args.best)} if args.best else None
    chosen = export_plan.pick(ckpts, broken, run_id, args.step, args.best, args.mode, series, scalars.tags())
    step, tag = chosen.ckpt.step, chosen.ckpt.name
    log.info("export: run %s, checkpoint %s: %s", run_id, tag, chosen.why)
    marker = next((c.marker for c in found if c.name == tag), None) or {}
    layout = marker.get("layout") if isinstance(marker.get("layout"), dict) else {}
    metrics = {}
    for name in scalars.tags():
        at = [p.value for p in scalars.series(name) if p.step == step]
        if at:
            metrics[name] = at[0]
    workload = str(cfg.train.workload)

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        trained = ", ".join(f"{k} {v}" for k, v in layout.items()) or "?"  # job-written: printable only
        log.info("export: consolidating %s (%s) ...", tag, "".join(c if c.isprintable() else "?" for c in trained))
        try:
            weights = export_weights(rundir.checkpoints_dir(run_dir) / tag, staging / WEIGHTS,
                                     lambda tied: export_plan.metadata(run_id, step, workload, tied))
        except Exception as exc:  # noqa: BLE001 - a checkpoint DeepSpeed cannot read: said, no traceback
            others = ", ".join(str(c.step) for c in ckpts if c.step != step) or "none"
            raise ExportError(f"run {run_id}: consolidating checkpoint {tag} failed ({type(exc).__name__}: "
                              f"{exc}); export another one with --step (other complete steps: {others})") from None
        _text(staging / CONFIG_JSON, json.dumps(to_dict(cfg)["model"], indent=2, sort_keys=True) + "\n")
        code = export_plan.load_code(workload, weights.shapes, str(rundir.config_path(run_dir)))
        _text(staging / README, export_plan.readme(run_id, step, tag, chosen.why, workload, layout, metrics, code,
                                                   weights.tied, weights.source, len(weights.shapes), weights.values))
        publish(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    size = (out / WEIGHTS).stat().st_size
    print(f"exported run {run_id} step {step} ({tag}) to {out}: {WEIGHTS} ({size / 1e6:.1f} MB, "
          f"{len(weights.shapes)} tensors), {CONFIG_JSON}, {README}")
    if weights.tied:
        print("tied weights stored as copies: " + ", ".join(f"{a} = {b}" for a, b in sorted(weights.tied.items())))
    return exit_status.OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    configure(args, chatter_on_stderr=True)  # stdout: the result line only
    try:
        return run_export(args)
    except ExportError as exc:
        print(f"export: {exc}", file=sys.stderr)
        return exit_status.USAGE


if __name__ == "__main__":
    sys.exit(invocation.run(main))
