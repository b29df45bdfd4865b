"""hpc-agent init [DIR] [--force]: start a project in DIR (default: the current directory).

Writes a commented starter config, ``hpc_agent.yaml``, and a copy of the shipped sbatch templates in
``sbatch_templates/``, which submit then uses instead of the shipped ones (``hpc_agent.core.paths.template_dirs``:
next to the config file, then the current directory). A user installed from a wheel has the shipped files
inside site-packages; this gives them files of their own to edit, found without ``HPC_AGENT_HOME``.

Never overwrites a file that differs from what it would write (exit 2 naming them; ``--force`` overwrites);
files that are already identical are left alone, so running it twice is harmless.
Exit codes: 0 written (or already there), 2 refused or not writable. Login-node code: no torch.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from hpc_agent.cli import exit_status, invocation
from hpc_agent.cli.flags import add_common_arguments, configure
from hpc_agent.core import paths

CONFIG_NAME = "hpc_agent.yaml"

# A quickstart-sized run that completes on the localhost cluster (docs/cluster.md) in seconds; base.yaml
# is applied under it. The comments name the keys a GPU user changes: they are the ones the config
# checks tie together (tasks_per_node = gpus_per_node, fp16 only with GPUs).
STARTER = """\
# hpc_agent config, written by `hpc-agent init`. The shipped base config is applied under it, then this
# file, then key=value overrides on the command line. Every key: `hpc-agent config` (docs/config.md).
# As written: a tiny GPT for a few steps on one CPU task, which runs on any Slurm (and the localhost one).
run:
  name: my_run                 # the run directory is <runs_root>/<name>-<date>-<time>
  runs_root: ./runs            # on a cluster: a shared file system that the compute nodes see too

slurm:
  # partition: gpu             # GPU cluster: your GPU partition (sinfo lists them); unset: the default one
  # account: my_project        # if your cluster charges an account
  nodes: 1
  tasks_per_node: 1            # one training process per GPU: GPU cluster, set this = gpus_per_node
  gpus_per_node: 0             # 0 = CPU only. GPU cluster: e.g. 4, with tasks_per_node: 4
  cpus_per_task: 1             # GPU cluster: e.g. 8 (data loading and the CPU side of each rank)
  mem: 2G                      # per node; GPU cluster: e.g. 128G
  time: "00:10:00"             # a timeout is requeued from the last checkpoint by `hpc-agent watch`
  # python: /shared/venvs/train/bin/python   # the interpreter the job runs, as compute nodes see it;
  #                                          # unset: the one running submit ({python})
  template: default            # ./sbatch_templates/default.yaml: add `module load ...` lines there

train:
  workload: gpt                # your model: my_pkg.model:build (docs/your_model.md), importable by slurm.python
  max_steps: 10
  micro_batch_size: 4
  grad_accum_steps: 1
  lr: 1.0e-3
  warmup_steps: 2
  precision: auto              # auto: fp16 on CUDA, bf16 on CPU; GPU cluster: bf16 on A100/H100
  zero_stage: 0                # 1-3 shard optimizer state, gradients, parameters across ranks
  ckpt_every: 5

# container:                   # run the tasks in an image instead of the node's environment
#   runtime: pyxis             # or apptainer
#   image: nvcr.io#nvidia/pytorch:24.05-py3
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=invocation.prog("init"),
        description=f"Write a starter config ({CONFIG_NAME}) and a copy of the sbatch templates "
                    f"(sbatch_templates/) into DIR, for you to edit.",
        epilog="Example: mkdir myproject && cd myproject && hpc-agent init && hpc-agent submit hpc_agent.yaml --dry-run\n"
               "Submit uses DIR/sbatch_templates/<name>.yaml before the shipped template of that name.\n"
               "Exit codes: 0 written (or already identical), 2 a file exists and differs (see --force), or DIR "
               "is not writable.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", nargs="?", default=".", help="the project folder (default: the current directory; "
                                                          "created if missing)")
    parser.add_argument("--force", action="store_true", help="overwrite files that exist and differ")
    parser.add_argument("--profile", metavar="NAME", help="also write DIR/profiles/NAME.yaml to edit: the shipped "
                        "profile NAME, else the annotated example (docs/profiles.md)")
    return add_common_arguments(parser)


def planned_files(dest: Path, profile: Optional[str] = None) -> Dict[Path, str]:
    """Every file init writes, with its content; with ``profile``, a profile skeleton (``profiles/`` next to
    the config is the first place ``--profile NAME`` looks: hpc_agent.core.paths.profile_dirs)."""
    files = {dest / CONFIG_NAME: STARTER.format(python=sys.executable)}
    if profile:
        shipped_profiles = paths.configs_dir() / paths.PROFILES
        source = shipped_profiles / f"{profile}.yaml"
        source = source if source.is_file() else shipped_profiles / "example.yaml"
        files[dest / paths.PROFILES / f"{profile}.yaml"] = source.read_text(encoding="utf-8")
    shipped = paths.templates_dir()
    for template in sorted(shipped.glob("*.yaml")):
        files[dest / paths.TEMPLATES / template.name] = template.read_text(encoding="utf-8")
    return files


def _differs(path: Path, text: str) -> bool:
    try:
        return path.read_text(encoding="utf-8") != text
    except (FileNotFoundError, NotADirectoryError):  # absent (a missing folder, or a file where one goes)
        return False
    except (OSError, UnicodeDecodeError):  # a directory, unreadable, binary: not ours to replace silently
        return True


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the current directory where it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def next_commands(config: Path, profile: Optional[str] = None) -> List[str]:
    """The steps after init. With ``profile``, its file comes first, and doctor and submit read it through
    ``--profile NAME``: profiles/ next to the config is where that name is looked for first."""
    shown = _shown(config)
    use = f" --profile {profile}" if profile else ""
    lines = [f"  edit {shown}: its comments say which keys a GPU cluster changes"]
    if profile:
        lines += [f"  edit {_shown(config.parent / paths.PROFILES / f'{profile}.yaml')}: this cluster's account, "
                  f"partition, GPU request and activation lines (docs/profiles.md); doctor and submit below read it "
                  f"through --profile {profile} (or: export HPC_AGENT_PROFILE={profile})"]
    return lines + [
        f"  hpc-agent doctor{use} {shown}     # Slurm, the config, DeepSpeed's ops, GPUs, memory estimate",
        "  hpc-agent prepare      # once per virtualenv, if doctor says DeepSpeed's ops are not prepared",
        f"  hpc-agent submit{use} {shown} --dry-run     # the job script; nothing is submitted",
        f"  hpc-agent submit{use} {shown}     # then follow and repair it: hpc-agent watch"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    configure(args)
    dest = Path(args.dir).expanduser().absolute()
    from hpc_agent.config.profile import NAME_RE

    if args.profile is not None and not NAME_RE.match(args.profile):
        print(f"hpc-agent init: --profile {args.profile!r}: a profile name is letters, digits, '_' or '-'",
              file=sys.stderr)
        return exit_status.USAGE
    files = planned_files(dest, args.profile)
    conflicts = [path for path, text in files.items() if _differs(path, text)]
    if conflicts and not args.force:
        force = "hpc-agent init --force" + (f" {args.dir}" if args.dir != "." else "")
        print(f"hpc-agent init: not writing, these files exist and differ from what init writes: "
              f"{', '.join(map(_shown, conflicts))}\nEdit them as they are, or run `{force}` to replace them.",
              file=sys.stderr)
        return exit_status.USAGE
    written = []
    try:
        for path, text in files.items():
            if path.is_file() and not _differs(path, text):
                continue  # already what we would write: leave its timestamp alone
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_dir():
                raise IsADirectoryError(f"{path} is a directory")
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as exc:
        print(f"hpc-agent init: cannot write into {dest}: {exc}", file=sys.stderr)
        return exit_status.USAGE
    for path in written:
        print(f"wrote {_shown(path)}")
    if not written:
        print(f"{_shown(dest / CONFIG_NAME)} and {_shown(dest / paths.TEMPLATES)}/ are already there, unchanged")
    print(f"submit uses {_shown(dest / paths.TEMPLATES)}/<name>.yaml before the shipped template of that name.")
    print("next:")
    print("\n".join(next_commands(dest / CONFIG_NAME, args.profile)))
    return 0


if __name__ == "__main__":
    sys.exit(invocation.run(main))
