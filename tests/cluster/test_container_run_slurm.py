"""A real containerised run under the real Slurm: the quickstart job with ``container.runtime=apptainer``.

Apptainer and pyxis are not packaged for Debian bookworm, so ``apptainer`` here is a stand-in script that
runs what hpc_agent's job command asks for (``apptainer exec [--nv] --bind LIST [--pwd DIR] IMAGE CMD..``)
with podman: its own mount namespace and root file system (IMAGE, a folder), the mounts from ``--bind``.
The interpreter, ``container.python``, is a wrapper that exists only inside that image, so the job can
only complete if every rank really ran in the container. Skips (saying why) without podman and runc, or
where podman cannot start a container; CI does not install them (docs/containers.md).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slurm

STAND_IN = """#!/bin/bash
# NOT Apptainer: runs `apptainer exec [--nv] --bind LIST [--pwd DIR] IMAGE CMD...` with podman.
set -eu
[ "$1" = exec ] && shift
args=(-v "$PWD:$PWD" -w "$PWD")
while [[ "$1" == -* ]]; do
  case "$1" in
    --nv) shift;;
    --bind) IFS=, read -ra ms <<< "$2"; for m in "${ms[@]}"; do args+=(-v "$m"); done; shift 2;;
    --pwd) args+=(-w "$2"); shift 2;;
    *) echo "stand-in apptainer: unknown option $1" >&2; exit 2;;
  esac
done
image=$1; shift
printf '%s\\0' "$image" "$@" >> "$(dirname "$0")/calls"
# runc and cgroupfs: crun refuses this host's hybrid cgroups; ulimits no higher than ours (no CAP_SYS_RESOURCE)
exec podman --runtime runc --cgroup-manager=cgroupfs run --rm --cgroupns=host --network=host --ipc=host \\
  --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=4096:4096 --env-host "${args[@]}" --rootfs "$image" "$@"
"""
IMAGE_PYTHON = "/hpc_agent_image_python"  # exists only inside the image


def _image(tmp: Path) -> tuple[Path, list[str]]:
    """A root file system folder with the host's system and this venv bind-mounted in (a test image)."""
    image = tmp / "image"
    image.mkdir()
    (image / IMAGE_PYTHON.lstrip("/")).write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (image / IMAGE_PYTHON.lstrip("/")).chmod(0o755)
    system = [p for p in ("/usr", "/lib", "/lib64", "/bin", "/etc") if Path(p).exists()]
    mounts = [f"{p}:{p}:ro" for p in dict.fromkeys(system + [sys.prefix, sys.base_prefix])
              if not any(p.startswith(s + "/") for s in system)]
    return image, mounts


@pytest.fixture
def stand_in(tmp_path):
    if not (shutil.which("podman") and shutil.which("runc")):
        pytest.skip("podman and runc are not installed (apt-get install podman runc); CI does not install them")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(STAND_IN)
    (bin_dir / "apptainer").chmod(0o755)
    image, mounts = _image(tmp_path)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    probe = subprocess.run([str(bin_dir / "apptainer"), "exec", "--bind", ",".join(mounts), str(image), IMAGE_PYTHON,
                            "-c", "print('ok')"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        pytest.skip(f"podman cannot start a container here: {probe.stderr.strip()[-300:]}")
    (bin_dir / "calls").unlink()
    return {"bin": bin_dir, "image": image, "mounts": mounts, "env": env}


def test_quickstart_runs_inside_a_container_under_slurm(stand_in, tmp_path):
    overrides = [f"run.runs_root={tmp_path / 'runs'}", "container.runtime=apptainer",
                 f"container.image={stand_in['image']}", f"container.python={IMAGE_PYTHON}",
                 f"container.mounts=[{','.join(stand_in['mounts'])}]"]
    doctor = run_cli("-m", "hpc_agent.doctor", "quickstart", *overrides, env=stand_in["env"], timeout=240)
    assert any(l.startswith("OK    job python") for l in doctor.stdout.splitlines()), doctor.stdout
    proc = run_cli("-m", "hpc_agent.submit", "quickstart", "--executor", "slurm", "--wait", *overrides,
                   env=stand_in["env"], timeout=480)
    assert proc.returncode == 0 and "COMPLETED" in proc.stdout, proc.stdout + proc.stderr
    words = (stand_in["bin"] / "calls").read_text().split("\0")  # doctor's probe, then the job's ranks
    start = words.index("submitit.core._submit") - 4
    assert words[start:start + 5] == [str(stand_in["image"]), IMAGE_PYTHON, "-u", "-m", "submitit.core._submit"], words
