"""Load a config: structured defaults <- configs/base.yaml <- the file <- $HPC_AGENT_RUNS <- key=value overrides.

Every layer is applied leaf by leaf so that one bad key does not hide the next one: unknown keys and
wrong types are collected, then every section validates itself, then cross-section checks run, and
all problems are raised together in one :class:`ConfigError`.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpc_agent.config.problems import ConfigError, Problem
from hpc_agent.config.schema import SECTIONS, Config
from hpc_agent.paths import configs_dir

RUNS_ENV = "HPC_AGENT_RUNS"
_SEXAGESIMAL = re.compile(r"^\d+(-\d+)?(:\d+)+$")


def resolve_config_path(name: str) -> Path:
    """A path as given, else ``configs/<name>`` or ``configs/<name>.yaml`` in the repo."""
    candidates = [Path(name), configs_dir() / name, configs_dir() / f"{name}.yaml"]
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


def _describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_describe_type(inner[0])} or null"
    if origin in (dict, Dict):
        return "a mapping of option: value"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _field_types(cls: type) -> Dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _key_problem(path: str, value: Any) -> Problem:
    """An unknown key: say which keys exist there and suggest the closest."""
    head, _, rest = path.partition(".")
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
    return Problem(path, value, f"{where}: {', '.join(choices)}{hint}")


def _type_problem(path: str, value: Any) -> Problem:
    head, _, rest = path.partition(".")
    name = rest.split(".")[0]
    tp = _field_types(SECTIONS[head]).get(name) if head in SECTIONS else None
    return Problem(path, value, _describe_type(tp) if tp is not None else "a valid value")


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


def parse_overrides(overrides: Sequence[str], problems: List[Problem]) -> Dict[str, Any]:
    """``key=value`` strings to a nested mapping (values parsed as YAML, as OmegaConf does)."""
    good = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            problems.append(Problem("override", item, "key=value, e.g. train.lr=1e-3"))
        else:
            key, _, value = item.partition("=")
            # YAML 1.1 reads 1:30 as the base-60 integer 90; a Slurm time like that must stay a string.
            if _SEXAGESIMAL.match(value):
                item = f"{key}='{value}'"
            good.append(item)
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(good))  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        problems.append(Problem("override", " ".join(good), f"valid key=value overrides ({exc.__class__.__name__})"))
        return {}


def _read_yaml(path: Path, problems: List[Problem]) -> Dict[str, Any]:
    try:
        data = OmegaConf.to_container(OmegaConf.load(path))
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        problems.append(Problem(str(path), "<file>", f"a readable YAML mapping ({exc})"))
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(Problem(str(path), type(data).__name__, "a YAML mapping with sections run, slurm, train, watch"))
        return {}
    return data


def build_config(layers: Sequence[Mapping[str, Any]], problems: Optional[List[Problem]] = None) -> Config:
    """Merge plain-dict layers onto the defaults and validate everything, raising all problems at once."""
    problems = [] if problems is None else problems
    cfg = OmegaConf.structured(Config)
    for layer in layers:
        _apply_layer(cfg, layer, problems)
    sections: Dict[str, Any] = {}
    for name in SECTIONS:
        try:
            sections[name] = OmegaConf.to_object(cfg[name])
        except ConfigError as exc:
            problems.extend(exc.problems)
        except OmegaConfBaseException as exc:
            problems.append(Problem(name, "<section>", f"resolvable values ({exc})"))
    # Cross-section checks read attributes only, so they run on the merged DictConfig even when a
    # section failed its own checks: the user still sees every problem in one go.
    problems.extend(Config.problems(cfg))  # type: ignore[arg-type]
    if not problems:
        return Config(**sections)
    raise ConfigError(problems)


def load_config(path: str | os.PathLike, overrides: Sequence[str] = (), *, env: Mapping[str, str] = os.environ,
                with_base: bool = True) -> Config:
    """Load ``path`` (plus ``configs/base.yaml`` and ``overrides``) into a validated :class:`Config`."""
    problems: List[Problem] = []
    layers: List[Mapping[str, Any]] = []
    try:
        file_path = resolve_config_path(str(path))
    except ConfigError as exc:
        problems.extend(exc.problems)
        file_path = None
    base = configs_dir() / "base.yaml"
    if with_base and base.is_file() and (file_path is None or file_path.resolve() != base.resolve()):
        layers.append(_read_yaml(base, problems))
    if file_path is not None:
        layers.append(_read_yaml(file_path, problems))
    if env.get(RUNS_ENV):
        layers.append({"run": {"runs_root": env[RUNS_ENV]}})
    layers.append(parse_overrides(overrides, problems))
    return build_config(layers, problems)


def load_snapshot(path: str | os.PathLike) -> Config:
    """Load a run's resolved ``config.yaml`` as written by submit: no base layer, no environment."""
    return load_config(path, with_base=False, env={})


def load_snapshot_text(text: str, source: str = "config.yaml") -> Config:
    """A snapshot from its text (already read, bounded, by ``rundir``): invalid YAML is a ConfigError."""
    problems: List[Problem] = []
    try:
        data = OmegaConf.to_container(OmegaConf.create(text)) if text.strip() else {}
    except (OmegaConfBaseException, ValueError, yaml.YAMLError) as exc:
        raise ConfigError([Problem(source, "<file>", f"a readable YAML mapping ({exc})")]) from None
    if not isinstance(data, dict):
        raise ConfigError([Problem(source, type(data).__name__, "a YAML mapping with sections run, slurm, train, watch")])
    return build_config([data], problems)


def to_yaml(config: Config) -> str:
    """The resolved config as YAML: the snapshot written into the run directory."""
    return OmegaConf.to_yaml(OmegaConf.structured(config))


def to_dict(config: Config) -> Dict[str, Any]:
    return dataclasses.asdict(config)
