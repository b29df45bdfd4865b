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

Sbatch templates are also looked for in a project's own ``sbatch_templates/`` folder (one made by
``hpc-agent init``), before the shipped ones; :func:`template_dirs` is the one place with that order:

1. ``sbatch_templates/`` next to the config file (for a resubmission: the run dir, where submit copies
   a project template, so the watcher uses the same file whatever its working directory);
2. ``./sbatch_templates/`` in the current directory (neither of these two is ever the checkout's own
   top-level folder: that one is the shipped folder of 3, so ``HPC_AGENT_HOME`` still wins over it);
3. the shipped ``sbatch_templates/`` above (``HPC_AGENT_HOME``, the wheel, the checkout).

Cluster profiles (``--profile NAME``, docs/profiles.md) follow the same rule, with the user's own folder
between the project's and the shipped one; :func:`profile_dirs` is the one place with that order:

1. ``profiles/`` next to the config file, then ``./profiles/`` in the current directory;
2. ``$XDG_CONFIG_HOME/hpc_agent/profiles/`` (default ``~/.config/hpc_agent/profiles/``): yours, for every project;
3. the shipped ``configs/profiles/`` (``HPC_AGENT_HOME``, the wheel, the checkout).
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Iterable, List, Optional

HOME_ENV = "HPC_AGENT_HOME"
SHIPPED = "shipped"  # the folder inside the hpc_agent package that a wheel install carries
FOLDERS = ("configs", "sbatch_templates")
TEMPLATES = "sbatch_templates"
PROFILES = "profiles"


def code_root() -> Path:
    """The folder that holds the ``hpc_agent`` and ``launch`` packages: the checkout, or site-packages for
    a wheel install. This is the ``{repo}`` placeholder of sbatch templates (e.g. for PYTHONPATH)."""
    return Path(__file__).resolve().parents[2]  # hpc_agent/core/paths.py -> the folder above hpc_agent


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
    return shipped_home() / TEMPLATES


def template_dirs(near: Iterable[os.PathLike | str] = ()) -> List[Path]:
    """Where a template name is looked for, first match wins (the module docstring): the
    ``sbatch_templates/`` folder next to each config file in ``near``, then the one in the current
    directory, then the shipped one. Absolute, without duplicates."""
    found = [Path(config).expanduser().absolute().parent / TEMPLATES for config in near] + [Path.cwd() / TEMPLATES]
    # The checkout's own top-level folder is the shipped one, not a project's: it must not win over
    # HPC_AGENT_HOME just because a command runs from the checkout.
    found = [d for d in found if d != code_root() / TEMPLATES]
    return list(dict.fromkeys(found + [templates_dir().expanduser().absolute()]))


def find_template(name: str, near: Iterable[os.PathLike | str] = ()) -> Optional[Path]:
    """The file ``<name>.yaml`` from the first of :func:`template_dirs` that has it, or None."""
    for folder in template_dirs(near):
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    return None


def is_shipped(path: os.PathLike | str) -> bool:
    """True for a file in the shipped templates folder (not a project's own copy)."""
    return Path(path).absolute().parent == templates_dir().expanduser().absolute()


def keep_project_template(name: str, config_file: os.PathLike | str, run_dir: os.PathLike | str) -> Optional[Path]:
    """Copy the template a submit found in a project folder (not a shipped one) into the run directory's
    ``sbatch_templates/``: the run dir holds the config the watcher resubmits, so rule 1 of
    :func:`template_dirs` finds this copy on every attempt, whatever the watcher's working directory.
    Returns the copy, or None for a shipped template (read where it is, as before)."""
    import shutil

    found = find_template(name, [config_file])
    if found is None or is_shipped(found):
        return None
    target = Path(run_dir) / TEMPLATES / found.name
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(found, target)
    return target


def user_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/hpc_agent`` (default ``~/.config/hpc_agent``): the user's own files for every project."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config").expanduser() / "hpc_agent"


def profile_dirs(near: Iterable[os.PathLike | str] = ()) -> List[Path]:
    """Where a profile name is looked for, first match wins (the module docstring). Absolute, no duplicates."""
    found = [Path(config).expanduser().absolute().parent / PROFILES for config in near] + [Path.cwd() / PROFILES]
    shipped = (configs_dir() / PROFILES).expanduser().absolute()
    return list(dict.fromkeys(found + [user_config_dir().absolute() / PROFILES, shipped]))


def find_profile(name: str, near: Iterable[os.PathLike | str] = ()) -> Optional[Path]:
    """The file ``<name>.yaml`` from the first of :func:`profile_dirs` that has it, or None."""
    for folder in profile_dirs(near):
        if (folder / f"{name}.yaml").is_file():
            return folder / f"{name}.yaml"
    return None
