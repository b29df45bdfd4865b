"""Per-cluster profiles: a cluster's defaults in one YAML file, selected with ``--profile NAME``.

A profile file is a config layer that sits between the shipped base config and your config file (yours and
the command line's ``key=value`` win). It may set the cluster-wide sections (``slurm``, ``container``,
``run``), checked by the same schema as any config, plus the ``profile`` section: the :class:`Profile`
dataclass below, the settings that are no Slurm option of their own (how GPUs are requested, environment
activation lines, Slurm version quirks). The loader records the profile's name, file and text in the
``profile`` section, so a run's config snapshot carries it and the watcher resubmits with the same settings
without the file (docs/profiles.md).

Where a name is looked for: :func:`hpc_agent.core.paths.profile_dirs` (the one home of that rule).
"""
from __future__ import annotations

import difflib
import os
import re
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.config.checks import check_choice, raise_if
from hpc_agent.config.fields import char_name
from hpc_agent.config.problems import Problem

PROFILE_ENV = "HPC_AGENT_PROFILE"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
# The sections a profile may set: cluster-wide settings. Training settings belong in the user's config.
PROFILE_SECTIONS = ("profile", "slurm", "container", "run", "placement")
# The loader writes these (from the file it read); a profile or config that sets them is overridden.
RECORDED = ("name", "source", "content")

GPU_REQUESTS = ("gpus-per-node", "gres", "gres-typed")
GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
QUIRKS = {
    "gpus_per_node_option": "sbatch has --gpus-per-node (Slurm >= 19.05); false refuses gpu_request=gpus-per-node",
    "sacct_json": "sacct has --json (Slurm >= 21.08); false: a watcher under this profile reads text, no probe",
}
"""The quirks, each a boolean the code consults (docs/profiles.md); True is what a current Slurm does."""
QUIRK_SINCE = {"gpus_per_node_option": (19, 5), "sacct_json": (21, 8)}
"""The Slurm release (major, minor) that brought each quirk's feature: doctor compares the live version."""
ACTIVATE_MAX_LINES = 64
ACTIVATE_MAX_LEN = 4096
_PLACEHOLDER = re.compile(r"\{(run_dir|run_id|config|repo|image|mounts|workdir)\}")


def _all_quirks() -> Dict[str, bool]:
    return {name: True for name in QUIRKS}


def activate_problem(line: Any) -> Optional[str]:
    """Why an activation line cannot go into the job script as written, or None. They are the user's own
    shell and run unquoted; each must stay ONE line that cannot swallow the script's next line."""
    text = str(line)
    bad = next((ch for ch in text if unicodedata.category(ch) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        return (f"one line of shell without control characters ({char_name(bad)} at position {text.index(bad)}): "
                "write two list items instead of a line break")
    if not text.strip():
        return "a shell line such as 'module load cuda/12.4' (it is empty: remove it)"
    if len(text) > ACTIVATE_MAX_LEN:
        return f"at most {ACTIVATE_MAX_LEN} characters"
    if text.rstrip().endswith("\\"):
        return "a line that does not end in a backslash (it would join the job script's next line)"
    if text.lstrip().upper().startswith("#SBATCH"):
        return "a shell line: sbatch ignores #SBATCH after the first command; put the option in slurm.extra_sbatch"
    if "<<" in text.replace("<<<", ""):
        return ("a line without a here-document: '<<' starts one in every form (<<EOF, <<'EOF', <<\\EOF, <<., <<@) "
                "and it would read the job script's next lines, srun's included, as its text; a here-string "
                "(<<< word) is fine, or put the text in a file")
    if why := unclosed(text):
        return (f"a line whose quotes and substitutions close on it ({why}): unclosed, it would take the job "
                "script's next lines, srun's included, as part of it and the job would end without training")
    if placeholder := _PLACEHOLDER.search(text):
        return (f"a line without {placeholder.group(0)}: activation lines run as written, nothing is filled in; "
                "use the environment ($HPC_AGENT_RUN_DIR, $HPC_AGENT_RUN_ID, $HPC_AGENT_CONFIG)")
    return None


_OPENERS = {"'": "'", '"': '"', "`": "`", "$'": "'", "$(": ")", "${": "}", "(": ")"}


def unclosed(text: str) -> Optional[str]:
    """The first quote or substitution ``text`` opens and never closes, in words, or None (pure; bash -n at
    submit is the authority, this names the usual mistakes early). Reads ' " ` $'..' $( ${ and ( as bash
    does, a backslash escape outside single quotes, and a ``#`` comment where a word starts."""
    stack: List[Tuple[str, int]] = []
    i = 0
    while i < len(text):
        top = stack[-1][0] if stack else ""
        two, ch = text[i:i + 2], text[i]
        if top == "'":  # nothing is special inside single quotes but the closing one
            if ch == "'":
                stack.pop()
        elif ch == "\\":
            i += 1  # the next character is escaped (inside $'..' and "..", and unquoted)
        elif top == "$'":
            if ch == "'":
                stack.pop()
        elif top == '"' and ch == '"':
            stack.pop()
        elif two in ("$(", "${") or (top != '"' and two == "$'"):
            stack.append((two, i))
            i += 1
        elif ch == "`":
            stack.pop() if top == "`" else stack.append(("`", i))
        elif top == '"':
            pass  # only $( ${ ` and the closing quote matter inside double quotes
        elif ch in "'\"":
            stack.append((ch, i))
        elif ch == "(":
            stack.append(("(", i))
        elif ch in ")}" and top in _OPENERS and _OPENERS[top] == ch and top not in ("'", '"', "`", "$'"):
            stack.pop()
        elif ch == "#" and (i == 0 or text[i - 1] in " \t;&|()") and top in ("", "$(", "("):
            break  # a comment: the rest of the line is not read
        i += 1
    if not stack:
        return None
    opener, at = stack[0]
    return f"{opener} at position {at} is never closed by {_OPENERS[opener]}"


@dataclass
class Profile:
    """The cluster profile in use (``--profile NAME``, docs/profiles.md): how GPUs are requested, the
    environment activation lines, the Slurm version quirks, and which profile file was read."""

    name: Optional[str] = None
    """Written by the loader, not by you: the profile selected at submit (None: no profile). Kept in the run's
    config snapshot, so every resubmission uses the same settings without the profile file."""

    source: Optional[str] = None
    """Written by the loader: the profile file that was read."""

    content: Optional[str] = None
    """Written by the loader: the profile file's text as it was read at submit (a record; never re-read)."""

    gpu_request: str = "gpus-per-node"
    """How the job asks for ``slurm.gpus_per_node`` GPUs: ``gpus-per-node`` (``--gpus-per-node=N``, Slurm >=
    19.05), ``gres`` (``--gres=gpu:N``, any Slurm) or ``gres-typed`` (``--gres=gpu:TYPE:N`` with ``gpu_type``)."""

    gpu_type: Optional[str] = None
    """The GPU type for ``gpu_request: gres-typed``, as the cluster's gres names it (``sinfo -o %G``), e.g.
    ``h100``."""

    activate: List[str] = field(default_factory=list)
    """Environment activation lines (e.g. ``module load cuda/12.4``, ``source /shared/venv/bin/activate``),
    added to the job script's setup after the template's lines, before the training step. They are your own
    shell and run AS WRITTEN (not quoted, no placeholders); one line each that closes on itself: no control
    characters, no here-document (any ``<<`` but a ``<<<`` here-string), no unclosed quote or substitution, and
    each must pass ``bash -n`` alone (checked at submit, with the whole job script). They run in the batch
    shell on the host, outside any container (docs/profiles.md)."""

    quirks: Dict[str, bool] = field(default_factory=_all_quirks)
    """What this cluster's Slurm can do, each true on a current Slurm: ``gpus_per_node_option`` (sbatch has
    ``--gpus-per-node``, Slurm >= 19.05; false refuses ``gpu_request: gpus-per-node``) and ``sacct_json``
    (``sacct --json``, Slurm >= 21.08; false: a watcher started with ``HPC_AGENT_PROFILE`` naming this profile
    reads sacct as text without probing). ``doctor --profile`` checks both against the cluster's version."""

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        if self.name is not None and not NAME_RE.match(str(self.name)):
            problems.append(Problem("profile.name", self.name, "a profile name: letters, digits, '_' or '-'"))
        check_choice("profile.gpu_request", self.gpu_request, GPU_REQUESTS, problems)
        if self.gpu_type is not None and not GPU_TYPE_RE.match(str(self.gpu_type)):
            problems.append(Problem("profile.gpu_type", self.gpu_type, "a gres GPU type such as h100 or a100_80g"))
        if self.gpu_request == "gres-typed" and not self.gpu_type:
            problems.append(Problem("profile.gpu_type", self.gpu_type, "the GPU type for gpu_request=gres-typed "
                                    "(sinfo -o %G shows gpu:TYPE:N), or set profile.gpu_request=gres"))
        elif self.gpu_type and self.gpu_request != "gres-typed":
            problems.append(Problem("profile.gpu_type", self.gpu_type, "null, or set profile.gpu_request=gres-typed "
                                    "to ask for this type"))
        quirks = dict(self.quirks or {})
        for key in quirks:
            if key not in QUIRKS:
                close = difflib.get_close_matches(str(key), list(QUIRKS), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(Problem(f"profile.quirks.{key}", quirks[key], f"a quirk: {', '.join(QUIRKS)}{hint}"))
        if self.gpu_request == "gpus-per-node" and quirks.get("gpus_per_node_option") is False:
            problems.append(Problem("profile.gpu_request", self.gpu_request, "gres or gres-typed: "
                                    "profile.quirks.gpus_per_node_option=false says sbatch lacks --gpus-per-node"))
        lines = list(self.activate or [])
        if len(lines) > ACTIVATE_MAX_LINES:
            problems.append(Problem("profile.activate", f"{len(lines)} lines", f"at most {ACTIVATE_MAX_LINES} lines"))
        for i, line in enumerate(lines[:ACTIVATE_MAX_LINES]):
            if why := activate_problem(line):
                shown = str(line) if len(str(line)) <= 200 else str(line)[:200] + "..."
                problems.append(Problem(f"profile.activate[{i}]", shown, why))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


def gpu_request(profile: Profile, gpus: int) -> Tuple[str, str]:
    """The ONE place that turns a GPU count into an sbatch option: ``(option, value)`` without the dashes,
    e.g. ``("gpus-per-node", "4")``, ``("gres", "gpu:4")`` or ``("gres", "gpu:h100:4")``. ``jobs.executor`` hands
    it to submitit (``#SBATCH --option=value``) and doctor to ``sbatch --test-only``."""
    if profile.gpu_request == "gres":
        return "gres", f"gpu:{gpus}"
    if profile.gpu_request == "gres-typed":
        return "gres", f"gpu:{profile.gpu_type}:{gpus}"
    return "gpus-per-node", str(gpus)


def layer_problems(layer: Mapping[str, Any], shown: str) -> List[Problem]:
    """A profile sets cluster-wide sections only, and not what the loader records."""
    problems = []
    for key, value in layer.items():
        if key not in PROFILE_SECTIONS:
            problems.append(Problem(f"{shown}: {key}", "<section>", f"a profile section: {', '.join(PROFILE_SECTIONS)} "
                                    f"(training settings such as {key}.* belong in your config file)"))
    recorded = [k for k in RECORDED if isinstance(layer.get("profile"), Mapping) and k in layer["profile"]]
    for key in recorded:
        problems.append(Problem(f"{shown}: profile.{key}", layer["profile"][key], "nothing: the loader writes "
                                f"profile.{key} (remove it from the profile file)"))
    return problems


def profile_layers(name: str, near: Sequence[os.PathLike | str] = ()) -> Tuple[List[Dict[str, Any]], List[Problem]]:
    """The layers of profile ``name``: ``(the file's layer, the record layer)``, each a config mapping, and
    the problems found (an unknown name lists the known ones). The record layer goes LAST, after the user's
    overrides, so the snapshot names the profile that was really read."""
    from hpc_agent.config.env_origin import escape_literals
    from hpc_agent.config.problems import ConfigError
    from hpc_agent.config.yaml_safe import load_mapping
    from hpc_agent.core.paths import find_profile, profile_dirs

    if not NAME_RE.match(str(name)):
        return [], [Problem("--profile", name, "a profile name: letters, digits, '_' or '-' (no path, no .yaml)")]
    path = find_profile(name, near)
    if path is None:
        known = sorted({p.stem for d in profile_dirs(near) if d.is_dir() for p in d.glob("*.yaml")})
        where = ", ".join(str(d) for d in profile_dirs(near))
        return [], [Problem("--profile", name, f"a profile in {where}: {', '.join(known) or 'none found'}")]
    try:
        layer = load_mapping(path, "a profile: a YAML mapping with sections " + ", ".join(PROFILE_SECTIONS))
        text = Path(path).read_text(encoding="utf-8")
    except ConfigError as exc:
        return [], list(exc.problems)
    problems = layer_problems(layer, str(path))
    layer = {k: v for k, v in layer.items() if k in PROFILE_SECTIONS}
    # The text is a record: escaped, so its own ``${`` never resolves when the snapshot is read back.
    record = {"profile": {"name": str(name), "source": str(path), "content": escape_literals(text)}}
    return [layer, record], problems


def selected(flag: Optional[str], env: Mapping[str, str] = os.environ) -> Optional[str]:
    """``--profile NAME`` wins over ``$HPC_AGENT_PROFILE``. An empty flag (``--profile ''``) means none, even
    with the variable set: a resolved config (submit --remote's) carries its profile already."""
    if flag is not None:
        return flag or None
    return env.get(PROFILE_ENV) or None


def sacct_json_quirk(env: Mapping[str, str] = os.environ) -> Optional[bool]:
    """For a watcher: False when ``$HPC_AGENT_PROFILE`` names a profile whose ``quirks.sacct_json`` is false
    (the watcher then reads sacct as text without probing ``--json``); None otherwise, where the watcher's own
    one-time probe decides. Never raises: a missing or broken profile leaves the decision to the probe."""
    from hpc_agent.config.yaml_safe import load_mapping
    from hpc_agent.core.paths import find_profile

    name = selected(None, env)
    try:
        path = find_profile(name) if name and NAME_RE.match(name) else None
        quirks = (load_mapping(path, "a profile").get("profile") or {}).get("quirks") or {} if path else {}
        return False if quirks.get("sacct_json") is False else None
    except Exception:  # noqa: BLE001 - a hint only: the probe still works without it
        return None
