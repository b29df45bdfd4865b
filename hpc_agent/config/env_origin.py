"""Which config values come from the environment, and keeping them out of Slurm's metadata.

A config value may read an environment variable with ``${oc.env:NAME}`` or ``${oc.env:NAME,default}``;
OmegaConf resolves it at submit. That is the only interpolation a config may use: references to
other keys and other resolvers can chain into values of any size (an interpolation "billion laughs"),
so they are refused before OmegaConf sees them. A literal ``${`` is written ``\\${``.

Environment values are often secrets (tokens, account names, paths with user names). ``#SBATCH``
options and the job name are readable by every user of the cluster (``squeue``, ``sacct``,
``scontrol show job``), so a value taken from the environment may not land in them unless
``slurm.env_in_metadata`` names the field. Which fields came from which variables is recorded (names,
never values) in the config snapshot under ``env_origin``.
"""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.config.problems import Problem

ORIGIN_KEY = "env_origin"        # the top-level snapshot key holding the record
MAX_VALUE_CHARS = 4096           # PATH_MAX; longer values only end in E2BIG at sbatch
MAX_LEAVES = 10_000              # a config has ~100 keys; a layer with more is not one
_OPEN = re.compile(r"(\\*)\$\{")
_ENV_REF = re.compile(r"oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^${}\\]*))?\}")
# Fields that become #SBATCH options, the job name or the log paths in them; the rest never reach Slurm.
_RUN_METADATA = ("run.name", "run.runs_root", "notify.mail_type", "notify.mail_user")  # mail: #SBATCH --mail-*
_SLURM_PRIVATE = ("slurm.template", "slurm.gpu_memory_gib", "slurm.env_in_metadata")


def env_refs(value: str) -> Tuple[List[Tuple[str, Optional[str]]], Optional[str]]:
    """The ``(NAME, default)`` of each ``${oc.env:...}`` in ``value``, and why the value is refused if it has
    any other interpolation. An odd number of backslashes before ``${`` escapes it."""
    refs: List[Tuple[str, Optional[str]]] = []
    for opening in _OPEN.finditer(value):
        if len(opening.group(1)) % 2:
            continue
        ref = _ENV_REF.match(value, opening.end())
        if ref is None:
            return refs, ("a plain value or ${oc.env:NAME} / ${oc.env:NAME,default}: other interpolations "
                          "(key references, other resolvers) are not supported; write the value out, or "
                          "write a literal '${' as '\\${'")
        refs.append((ref.group(1), ref.group(2)))
    return refs, None


def _strings(node: Any, path: str) -> Iterator[Tuple[str, str]]:
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, (list, tuple)):
        for item in node:
            yield from _strings(item, path)


def _leaf_items(node: Any, keys: Tuple[Any, ...] = ()) -> Iterator[Tuple[Tuple[Any, ...], Any]]:
    """``(keys from the root, value)`` per leaf; keys stay as given (a key may itself hold a dot)."""
    if isinstance(node, Mapping) and node:
        for key, value in node.items():
            yield from _leaf_items(value, keys + (key,))
    elif keys:
        yield keys, node


def _nested(leaves: Sequence[Tuple[Tuple[Any, ...], Any]]) -> Dict[Any, Any]:
    """The sub-tree of the original layer that holds exactly these leaves."""
    out: Dict[Any, Any] = {}
    for keys, value in leaves:
        node = out
        for part in keys[:-1]:
            node = node.setdefault(part, {})
        node[keys[-1]] = value
    return out


def scan_layer(layer: Mapping[str, Any], is_known: Callable[[str], bool], problems: List[Problem],
               environ: Mapping[str, str] = os.environ) -> Tuple[Dict[str, Any], Dict[str, List[str]], List[str]]:
    """Check every string of a layer before OmegaConf sees it.

    Returns the layer without the refused leaves, ``{key: [VARIABLE, ...]}`` for the leaves that read
    the environment, and every key the layer sets (a later layer's literal value clears an origin).
    Unknown keys are passed on untouched: the loader reports them with suggestions."""
    leaves = []
    for count, item in enumerate(_leaf_items(layer)):
        if count >= MAX_LEAVES:
            problems.append(Problem("<config>", f"more than {MAX_LEAVES} keys", "a config of at most "
                                    f"{MAX_LEAVES} keys (a few hundred at most is normal)"))
            return {}, {}, []
        leaves.append(item)
    keep, origins, paths = [], {}, []
    for keys, value in leaves:
        path = ".".join(map(str, keys))
        if not is_known(path):
            keep.append((keys, value))
            continue
        paths.append(path)
        names, bad = [], False
        for _, text in _strings(value, path):
            refs, reason = env_refs(text)
            size = len(text) + sum(len(environ.get(name, default or "")) for name, default in refs)
            if reason:
                problems.append(Problem(path, text[:200], reason))
                bad = True
            elif size > MAX_VALUE_CHARS:
                problems.append(Problem(path, f"{size} characters", f"a value of at most {MAX_VALUE_CHARS} characters"))
                bad = True
            for name, default in refs:
                names.append(name)
                if default is None and name not in environ:
                    problems.append(Problem(path, f"${{oc.env:{name}}}", f"the environment variable {name} to be set, "
                                            f"or a default: ${{oc.env:{name},VALUE}}"))
                    bad = True
        if names:
            origins[path] = sorted(set(names))
        if not bad:
            keep.append((keys, value))
    return _nested(keep), origins, paths


def carried_origins(record: Any, where: str, problems: List[Problem]) -> Dict[str, List[str]]:
    """A snapshot's ``env_origin`` record, checked for shape (it is data from a file like any other)."""
    if record is None:
        return {}
    if not isinstance(record, Mapping) or not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(n, str) for n in v) for k, v in record.items()):
        problems.append(Problem(f"{where}{ORIGIN_KEY}", "<record>", "a mapping of config key: [VARIABLE, ...] "
                                "(written by submit; remove it if in doubt)"))
        return {}
    return {k: list(v) for k, v in record.items()}


def is_metadata(path: str) -> bool:
    """Does this key end up in an ``#SBATCH`` line or the job name?"""
    return path in _RUN_METADATA or (path.startswith("slurm.") and path not in _SLURM_PRIVATE)


def allowed_key(entry: str) -> str:
    """``account`` and ``extra_sbatch.reservation`` are short for the ``slurm.`` keys; others are full keys."""
    entry = str(entry)
    return entry if entry.startswith(("slurm.", "run.", "notify.")) else f"slurm.{entry}"


def metadata_problems(origins: Mapping[str, List[str]], allowed: Sequence[str],
                      is_known: Callable[[str], bool]) -> List[Problem]:
    """Values from the environment that would reach Slurm's metadata without being allowed."""
    problems: List[Problem] = []
    allow = set()
    for entry in allowed:
        key = allowed_key(entry)
        if not (is_known(key) and is_metadata(key)):
            problems.append(Problem("slurm.env_in_metadata", entry, "keys that reach Slurm's metadata, such as "
                                    "account, extra_sbatch.reservation or run.runs_root"))
        allow.add(key)
    for path, names in sorted(origins.items()):
        if is_metadata(path) and path not in allow:
            short = path[len("slurm."):] if path.startswith("slurm.") else path
            problems.append(Problem(path, f"${{oc.env:{names[0]}}}", (
                f"a value written in the config: {path} takes the environment variable {', '.join(names)}, and "
                "Slurm shows #SBATCH options and job names to every user of the cluster (squeue, sacct). "
                f"Write the value itself, or if it is not secret allow it with slurm.env_in_metadata: [{short}]")))
    return problems


def escape_literals(node: Any) -> Any:
    """A resolved value with every ``${`` escaped, so that reading a snapshot back never interpolates."""
    if isinstance(node, str):
        return _OPEN.sub(lambda m: m.group(1) * 2 + "\\${", node)
    if isinstance(node, Mapping):
        return {k: escape_literals(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [escape_literals(v) for v in node]
    return node
