"""Load a config: structured defaults <- configs/base.yaml <- a cluster profile (``--profile``,
docs/profiles.md) <- the file <- $HPC_AGENT_RUNS <- key=value overrides.

Every layer is applied leaf by leaf so that one bad key does not hide the next one: unknown keys and
wrong types are collected, then every section validates itself, then cross-section checks run, and
all problems are raised together in one :class:`ConfigError`.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpc_agent.config.env_origin import ORIGIN_KEY, carried_origins, escape_literals, metadata_problems, scan_layer
from hpc_agent.config.fields import value_problems
from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.schema import SECTIONS, Config
from hpc_agent.config.yaml_safe import load_mapping, parse_text
from hpc_agent.core import rundir
from hpc_agent.core.paths import configs_dir

RUNS_ENV = "HPC_AGENT_RUNS"


def resolve_config_path(name: str) -> Path:
    """A path as given, else ``configs/<name>`` or ``configs/<name>.yaml`` in the repo. A path that exists
    but is no regular file (a directory, a FIFO, a link loop) is returned for the reader to refuse by name."""
    if "\0" not in name and os.path.lexists(name):
        return Path(name)
    candidates = [configs_dir() / name, configs_dir() / f"{name}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(p.stem for p in configs_dir().glob("*.yaml")))
    raise ConfigError([Problem("CONFIG", name, f"an existing YAML file, or one of the shipped configs: {known}")])


def _leaves(node: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """Flatten nested mappings to ``(dotted.key, value)`` pairs."""
    if isinstance(node, Mapping):
        # An empty mapping (``model: {}``) sets nothing, so it yields nothing.
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _short(value: Any, limit: int = 200) -> Any:
    """A value to echo back in a problem: long strings are cut (a hostile file can hold megabytes)."""
    return value if not isinstance(value, str) or len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def _describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_describe_type(inner[0])} or null"
    if origin in (dict, Dict):
        return "a mapping of option: value"
    if origin in (list, List):
        return f"a list of {_ITEMS.get(args[0], 'values') if args else 'values'}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


_ITEMS = {int: "integers", float: "numbers", bool: "true/false values", str: "strings"}
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_./:@%+-]+$")


def _is_list(tp: Any) -> bool:
    """``List[...]`` or ``Optional[List[...]]``."""
    if typing.get_origin(tp) is typing.Union:
        return any(_is_list(a) for a in typing.get_args(tp) if a is not type(None))
    return typing.get_origin(tp) in (list, List)


def _list_hint(path: str, value: Any) -> str:
    """How to write a list, on the command line above all, where ``train.command=python`` is the natural first
    try: the words of a string meant as the list (``python train.py --lr 3`` -> ``'[python,train.py,--lr,"3"]'``,
    a word YAML would read as another type in double quotes), when each is a plain word, else placeholders; never
    a secret's words."""
    from hpc_agent.core.redact import is_secret_name

    example = "[a,b]"
    words = value.split() if isinstance(value, str) and len(value) <= 200 else []
    if words and not is_secret_name(path) and all(_PLAIN_WORD.match(w) for w in words):
        try:
            flow = "[" + ",".join(w if parse_text(w, path) == w else f'"{w}"' for w in words) + "]"
            if parse_text(flow, path) == words:
                example = flow
        except ConfigError:
            pass
    return (f"; write a list as [a, b] in YAML, and on the command line as {path}='{example}' "
            "(quoted, so that the shell keeps the brackets)")


@functools.lru_cache(maxsize=None)
def _field_types(cls: type) -> Mapping[str, Any]:
    """A section's field types, resolved once per class: ``get_type_hints`` evaluates every annotation string
    anew (0.6 ms a call, once per key of a layer: 0.15 s of each job start-up's config load, P1)."""
    hints = typing.get_type_hints(cls)
    return types.MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls)})


def _key_problem(path: str, value: Any) -> Problem:
    """An unknown key: say which keys exist there and suggest the closest."""
    head, _, rest = path.partition(".")
    if head in SECTIONS and not rest:  # ``train: [1, 2]``: the section itself is not a mapping
        return Problem(head, _short(value), f"a mapping of {head}'s keys: {', '.join(_field_types(SECTIONS[head]))}")
    if head not in SECTIONS or not rest:
        choices = list(SECTIONS)
        where = "a top-level section"
        name = head
    else:
        choices = list(_field_types(SECTIONS[head]))
        where = f"a key of {head}"
        name = rest.split(".")[0]
    close = difflib.get_close_matches(name, choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    shown = path if path.strip(". ") else f"{path!r} (an empty key)"
    return Problem(_short(shown), _short(value), f"{where}: {', '.join(choices)}{hint}")


def _type_problem(path: str, value: Any) -> Problem:
    head, _, rest = path.partition(".")
    name = rest.split(".")[0]
    tp = _field_types(SECTIONS[head]).get(name) if head in SECTIONS else None
    if tp is None:
        return Problem(path, _short(value), "a valid value")
    hint = _list_hint(path, value) if _is_list(tp) and path.count(".") == 1 else ""
    return Problem(path, _short(value), _describe_type(tp) + hint)


def _is_known(path: str) -> bool:
    head, _, rest = path.partition(".")
    if head not in SECTIONS or not rest:
        return False
    name, _, sub = rest.partition(".")
    types = _field_types(SECTIONS[head])
    if name not in types:
        return False
    # Only mapping-typed fields (extra_sbatch) accept sub-keys.
    return not sub or typing.get_origin(types[name]) in (dict, Dict)


def _apply_layer(cfg: DictConfig, layer: Mapping[str, Any], problems: List[Problem]) -> None:
    for path, value in _leaves(layer):
        if not _is_known(path):
            problems.append(_key_problem(path, value))
            continue
        try:
            OmegaConf.update(cfg, path, value, merge=True)
        except OmegaConfBaseException:
            problems.append(_type_problem(path, value))


_OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+){0,7}$")


def parse_overrides(overrides: Sequence[str], problems: List[Problem]) -> Dict[str, Any]:
    """``key=value`` strings to a nested mapping; each value is read as YAML by the same safe reader as files."""
    out: Dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not _OVERRIDE_KEY.match(key):
            problems.append(Problem("override", _short(item), "key=value with a dotted key, e.g. train.lr=1e-3"))
            continue
        try:
            value = parse_text(text, f"override {key}=") if text.strip() else None
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        node = out
        *head, last = key.split(".")
        for part in head:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return out


def _read_yaml(path: Path, problems: List[Problem]) -> Dict[str, Any]:
    try:
        return load_mapping(path, "a YAML mapping with sections " + ", ".join(SECTIONS))
    except ConfigError as exc:
        problems.extend(exc.problems)
        return {}


@functools.lru_cache(maxsize=1)
def _defaults() -> DictConfig:
    """The schema defaults as a DictConfig, built once: copying it is 4x cheaper than building it."""
    return OmegaConf.structured(Config)


def _allowed_in_metadata(cfg: DictConfig) -> List[str]:
    try:
        return [str(x) for x in OmegaConf.to_container(cfg.slurm.env_in_metadata, resolve=False) or []]
    except (OmegaConfBaseException, TypeError):
        return []


def build_config(layers: Sequence[Mapping[str, Any]], problems: Optional[List[Problem]] = None) -> Config:
    """Merge plain-dict layers onto the defaults and validate everything, raising all problems at once."""
    problems = [] if problems is None else problems
    cfg = copy.deepcopy(_defaults())
    fresh: Dict[str, List[str]] = {}     # keys read from the environment in this load: checked
    carried: Dict[str, List[str]] = {}   # keys a snapshot says were: already allowed at submit
    for layer in layers:
        layer = dict(layer)
        record = carried_origins(layer.pop(ORIGIN_KEY, None), "", problems)
        clean, origins, paths = scan_layer(layer, _is_known, problems)
        for path in paths:  # a later literal value replaces an earlier one from the environment
            fresh.pop(path, None)
            carried.pop(path, None)
        carried.update(record)  # a snapshot's own record describes the literal values next to it
        fresh.update(origins)
        _apply_layer(cfg, clean, problems)
    sections: Dict[str, Any] = {}
    for name in SECTIONS:
        try:
            sections[name] = OmegaConf.to_object(cfg[name])
        except ConfigError as exc:
            problems.extend(exc.problems)
        except OmegaConfBaseException as exc:
            problems.append(Problem(name, "<section>", f"resolvable values ({exc})"))
    problems.extend(_value_problems(cfg, problems))
    # Cross-section checks read attributes only, so they run on the merged DictConfig even when a
    # section failed its own checks: the user still sees every problem in one go.
    problems.extend(Config.problems(cfg))  # type: ignore[arg-type]
    problems.extend(metadata_problems(fresh, _allowed_in_metadata(cfg), _is_known))
    if not problems:
        return Config(**sections, env_origin={**carried, **fresh})
    raise ConfigError(_capped(problems))


def _value_problems(cfg: DictConfig, found: List[Problem]) -> List[Problem]:
    """The one check every leaf of every section gets (``fields.value_problem``: lone surrogates, non-finite
    floats, integers out of range), on the resolved values (so ``${oc.env:..}`` and coerced strings too), for
    keys no section check has already refused."""
    taken = {p.key for p in found}
    out: List[Problem] = []
    for name in SECTIONS:
        try:
            data = OmegaConf.to_container(cfg[name], resolve=True)
        except OmegaConfBaseException:  # an unresolvable value: already a problem of its section
            continue
        out += [p for p in value_problems(data, name) if p.key not in taken]
    return out


def _capped(problems: List[Problem], limit: int = 50) -> List[Problem]:
    """At most ``limit`` problems: a hostile file can produce thousands, and the first ones say enough."""
    if len(problems) <= limit:
        return problems
    return problems[:limit] + [Problem("<config>", f"{len(problems) - limit} more problems",
                                       "fix the ones above first")]


def load_config(path: str | os.PathLike, overrides: Sequence[str] = (), *, env: Mapping[str, str] = os.environ,
                with_base: bool = True, profile: Optional[str] = None) -> Config:
    """Load ``path`` (plus ``configs/base.yaml``, the profile ``profile`` or ``$HPC_AGENT_PROFILE``, and
    ``overrides``) into a validated :class:`Config`."""
    from hpc_agent.config.profile import profile_layers, selected
    problems: List[Problem] = []
    layers: List[Mapping[str, Any]] = []
    try:
        file_path = resolve_config_path(str(path))
    except ConfigError as exc:
        problems.extend(exc.problems)
        file_path = None
    base = configs_dir() / "base.yaml"
    if with_base and base.is_file() and (file_path is None or _same_file(file_path, base)):
        layers.append(_read_yaml(base, problems))
    record: List[Mapping[str, Any]] = []
    if name := selected(profile, env):  # between the base and your file: yours wins (docs/profiles.md)
        found, why = profile_layers(name, [file_path] if file_path is not None else [])
        problems.extend(why)
        layers, record = layers + found[:1], found[1:]
    if file_path is not None:
        layers.append(_read_yaml(file_path, problems))
    if env.get(RUNS_ENV):
        layers.append({"run": {"runs_root": env[RUNS_ENV]}})
    layers.append(parse_overrides(overrides, problems))
    return build_config(layers + record, problems)  # the record last: it names the profile really read


def _same_file(path: Path, base: Path) -> bool:
    """False when ``path`` is the base config itself (so it is not applied twice)."""
    try:
        return path.resolve() != base.resolve()
    except (OSError, RuntimeError):  # a link loop: the reader will say so
        return True


def load_snapshot(path: str | os.PathLike) -> Config:
    """Load a run's resolved ``config.yaml`` as written by submit: no base layer, no environment."""
    problems: List[Problem] = []
    return build_config([_read_yaml(Path(path), problems)], problems)


def load_snapshot_text(text: str, source: str = "config.yaml") -> Config:
    """A snapshot from its text (already read, bounded, by ``rundir``): invalid YAML is a ConfigError."""
    data = parse_text(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([Problem(source, type(data).__name__, "a YAML mapping with sections run, slurm, train, watch")])
    return build_config([data])


def to_yaml(config: Config) -> str:
    """The resolved config as YAML: the snapshot written into the run directory. Every ``${`` in a value
    is escaped, so reading the snapshot back gives the same values and never reads the environment."""
    return OmegaConf.to_yaml(OmegaConf.create(escape_literals(dataclasses.asdict(config))))


def to_dict(config: Config) -> Dict[str, Any]:
    return dataclasses.asdict(config)


def load_run_config(run_dir: Path) -> Config:
    """The run's ``config.yaml``, read bounded and regular-file-only, then validated like any snapshot."""
    return load_snapshot_text(rundir.read_text(rundir.config_path(run_dir)), source=str(rundir.config_path(run_dir)))


def write_run_config(run_dir: Path, cfg: Config, name: str = rundir.CONFIG) -> Path:
    """Write ``cfg`` as the run's ``config.yaml`` (or the attempt copy ``name``), atomically: a reader sees the old
    file or the new one, never half of it. The one writer of the file that :func:`load_run_config` reads."""
    from hpc_agent.core.fsutil import atomic_write_text

    path = Path(run_dir) / name
    atomic_write_text(path, to_yaml(cfg))
    return path


def apply_patch(cfg: Config, patch: Mapping[str, Any]) -> Config:
    """``cfg`` with ``patch`` applied, validated again (raises ConfigError listing every problem)."""
    return build_config([to_dict(cfg), dict(patch)])


def patch_as_overrides(patch: Mapping[str, Any]) -> list[str]:
    """``{"train.lr": 0.0001}`` -> ``["train.lr=0.0001"]`` (for ``submit`` and the ledger)."""
    def fmt(v: Any) -> str:
        return "null" if v is None else ("true" if v is True else "false" if v is False else str(v))

    return [f"{k}={fmt(v)}" for k, v in patch.items()]
