"""Where hpc_agent's shipped files live: the configs (configs/) and the sbatch templates (sbatch_templates/).

The top-level folders of the checkout are the source of truth. Three ways to find them, first match wins:

1. ``HPC_AGENT_HOME``: a folder holding ``configs/`` and ``sbatch_templates/`` (for instance one made by
   ``hpc-agent config --copy DIR`` to edit them);
2. a wheel install (``pip install .``): the wheel carries copies inside the package, as
   ``hpc_agent/shipped/configs`` and ``hpc_agent/shipped/sbatch_templates`` (pyproject.toml maps the
   top-level folders there), found through importlib.resources;
3. a checkout (an editable install, or the checkout on PYTHONPATH): the top-level folders next to the
   ``hpc_agent`` package.

The wheel's copy is looked for before the checkout because only a wheel install has it: the checkout
never contains ``hpc_agent/shipped``, and a site-packages folder may hold an unrelated ``configs/``.
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

HOME_ENV = "HPC_AGENT_HOME"
SHIPPED = "shipped"  # the folder inside the hpc_agent package that a wheel install carries
FOLDERS = ("configs", "sbatch_templates")


def code_root() -> Path:
    """The folder that holds the ``hpc_agent`` and ``launch`` packages: the checkout, or site-packages for
    a wheel install. This is the ``{repo}`` placeholder of sbatch templates (e.g. for PYTHONPATH)."""
    return Path(__file__).resolve().parent.parent


def _packaged_home() -> Path | None:
    shipped = resources.files("hpc_agent") / SHIPPED
    if all(shipped.joinpath(name).is_dir() for name in FOLDERS):
        # An installed wheel is unpacked on disk, so the Traversable is a real directory.
        return Path(str(shipped))
    return None


def shipped_home() -> Path:
    """The folder whose ``configs/`` and ``sbatch_templates/`` hpc_agent reads (see the module docstring)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    return _packaged_home() or code_root()


def configs_dir() -> Path:
    return shipped_home() / "configs"


def templates_dir() -> Path:
    return shipped_home() / "sbatch_templates"
