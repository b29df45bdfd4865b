"""The sweep file: search space, objective, budget and pruner. Pure: YAML data in, a SweepSpec out.

Optuna is imported inside the functions that build its objects, so parsing and validating a sweep file
(and ``--help``) stays cheap, and login-node CLIs that import this module never pay for Optuna.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from hpc_agent.config.problems import ConfigError, Problem

PARAM_TYPES = ("float", "logfloat", "int", "logint", "categorical")
DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("median", "hyperband", "none")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
KEY_RE = re.compile(r"^[a-z_]+(\.[A-Za-z0-9_]+)+$")


@dataclass(frozen=True)
class Param:
    key: str            # a dotted config key, e.g. train.lr
    kind: str           # one of PARAM_TYPES
    low: Optional[float] = None
    high: Optional[float] = None
    step: Optional[float] = None
    choices: Tuple[Any, ...] = ()


@dataclass(frozen=True)
class PrunerSpec:
    kind: str = "median"
    startup_trials: int = 2      # trials that must finish before any trial is pruned (median)
    warmup_steps: int = 0        # steps a trial runs before it can be pruned
    min_resource: int = 1        # hyperband
    max_resource: Optional[int] = None   # hyperband; default: train.max_steps
    reduction_factor: int = 3    # hyperband


@dataclass(frozen=True)
class SweepSpec:
    name: str
    tag: str                     # the TensorBoard tag that is the objective (its value at the last step)
    direction: str
    params: Tuple[Param, ...]
    trials: int = 8
    parallel: int = 2
    startup_trials: int = 4      # random trials before TPE takes over
    seed: Optional[int] = None
    storage: Optional[str] = None  # an Optuna RDB URL; default: sqlite in the sweep directory
    overrides: Tuple[str, ...] = ()  # key=value applied to every trial before its sampled values
    pruner: PrunerSpec = field(default_factory=PrunerSpec)


def _number(where: str, value: Any, problems: List[Problem]) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        problems.append(Problem(where, value, "a number"))
        return None
    try:
        return float(value)
    except ValueError:
        problems.append(Problem(where, value, "a number"))
        return None


def parse_param(key: str, raw: Any, problems: List[Problem]) -> Optional[Param]:
    where = f"params.{key}"
    if not KEY_RE.match(str(key)):
        problems.append(Problem(where, key, "a dotted config key such as train.lr"))
        return None
    if str(key).split(".")[0] in ("slurm", "run"):
        # Trials of one array share its sbatch options, and run.* names the trial's own run.
        problems.append(Problem(where, key, "a train/model/data/... key (slurm.* and run.* are the same for every trial)"))
        return None
    if isinstance(raw, (list, tuple)):  # shorthand: a list is a categorical
        raw = {"type": "categorical", "choices": list(raw)}
    if not isinstance(raw, Mapping):
        problems.append(Problem(where, raw, "a mapping with type and low/high (or choices), or a list of choices"))
        return None
    kind = str(raw.get("type", "float"))
    if kind == "float" and raw.get("log"):
        kind = "logfloat"
    if kind == "int" and raw.get("log"):
        kind = "logint"
    if kind not in PARAM_TYPES:
        problems.append(Problem(f"{where}.type", kind, ", ".join(PARAM_TYPES)))
        return None
    if kind == "categorical":
        choices = raw.get("choices")
        if not isinstance(choices, (list, tuple)) or not choices:
            problems.append(Problem(f"{where}.choices", choices, "a non-empty list"))
            return None
        return Param(key, kind, choices=tuple(choices))
    low = _number(f"{where}.low", raw.get("low"), problems)
    high = _number(f"{where}.high", raw.get("high"), problems)
    step = _number(f"{where}.step", raw["step"], problems) if raw.get("step") is not None else None
    if low is None or high is None:
        return None
    if not low < high:
        problems.append(Problem(f"{where}.high", high, f"greater than low ({low:g})"))
        return None
    if kind.startswith("log") and low <= 0:
        problems.append(Problem(f"{where}.low", low, "greater than 0 on a log scale"))
        return None
    if kind in ("int", "logint") and (low != math.floor(low) or high != math.floor(high)):
        problems.append(Problem(where, f"{low:g}..{high:g}", "whole numbers for an int parameter"))
        return None
    return Param(key, kind, low, high, step)


def _int(where: str, raw: Mapping, key: str, default: Optional[int], minimum: int, problems: List[Problem]):
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(Problem(f"{where}{key}", value, f"an integer >= {minimum}"))
        return default
    return value


def parse_spec(data: Any, default_name: str = "sweep") -> SweepSpec:
    """Validate a sweep file's contents; every problem is reported at once (as ConfigError)."""
    problems: List[Problem] = []
    if not isinstance(data, Mapping):
        raise ConfigError([Problem("SWEEP", data, "a YAML mapping with objective and params")])
    known = {"name", "objective", "params", "trials", "parallel", "startup_trials", "seed", "storage",
             "overrides", "pruner"}
    for key in data:
        if key not in known:
            problems.append(Problem(str(key), data[key], f"a sweep key: {', '.join(sorted(known))}"))
    name = str(data.get("name") or default_name)
    if not NAME_RE.match(name):
        problems.append(Problem("name", name, "letters, digits, _ . - (it names the sweep directory)"))
    objective = data.get("objective") or {}
    tag = str(objective.get("tag", "")) if isinstance(objective, Mapping) else ""
    direction = str(objective.get("direction", "")) if isinstance(objective, Mapping) else ""
    if not tag:
        problems.append(Problem("objective.tag", objective, "a TensorBoard tag, e.g. eval/macro_f1"))
    if direction not in DIRECTIONS:
        problems.append(Problem("objective.direction", direction or None, " or ".join(DIRECTIONS)))
    raw_params = data.get("params") or {}
    params: List[Param] = []
    if not isinstance(raw_params, Mapping) or not raw_params:
        problems.append(Problem("params", raw_params, "a mapping of config key: distribution"))
    else:
        for key, raw in raw_params.items():
            param = parse_param(str(key), raw, problems)
            if param is not None:
                params.append(param)
    trials = _int("", data, "trials", 8, 1, problems)
    parallel = _int("", data, "parallel", 2, 1, problems)
    startup = _int("", data, "startup_trials", min(4, trials or 4), 0, problems)
    seed = _int("", data, "seed", None, 0, problems)
    overrides = data.get("overrides") or []
    if not isinstance(overrides, (list, tuple)) or any("=" not in str(o) for o in overrides):
        problems.append(Problem("overrides", overrides, "a list of key=value strings"))
        overrides = []
    pruner = parse_pruner(data.get("pruner") or {}, problems)
    storage = data.get("storage")
    if problems:
        raise ConfigError(problems)
    return SweepSpec(name=name, tag=tag, direction=direction, params=tuple(params), trials=trials,
                     parallel=parallel, startup_trials=startup, seed=seed,
                     storage=str(storage) if storage else None, overrides=tuple(str(o) for o in overrides),
                     pruner=pruner)


def parse_pruner(raw: Any, problems: List[Problem]) -> PrunerSpec:
    if isinstance(raw, str):
        raw = {"kind": raw}
    if not isinstance(raw, Mapping):
        problems.append(Problem("pruner", raw, "a mapping with kind: median, hyperband or none"))
        return PrunerSpec()
    kind = str(raw.get("kind", "median"))
    if kind not in PRUNERS:
        problems.append(Problem("pruner.kind", kind, ", ".join(PRUNERS)))
    return PrunerSpec(kind=kind,
                      startup_trials=_int("pruner.", raw, "startup_trials", 2, 0, problems),
                      warmup_steps=_int("pruner.", raw, "warmup_steps", 0, 0, problems),
                      min_resource=_int("pruner.", raw, "min_resource", 1, 1, problems),
                      max_resource=_int("pruner.", raw, "max_resource", None, 1, problems),
                      reduction_factor=_int("pruner.", raw, "reduction_factor", 3, 2, problems))


# --- Optuna objects -----------------------------------------------------------------------------------
def distribution(param: Param):
    """The Optuna distribution of one parameter."""
    import optuna.distributions as d

    if param.kind == "categorical":
        return d.CategoricalDistribution(list(param.choices))
    if param.kind in ("int", "logint"):
        return d.IntDistribution(int(param.low), int(param.high), log=param.kind == "logint",
                                 step=int(param.step or 1))
    return d.FloatDistribution(param.low, param.high, log=param.kind == "logfloat",
                               step=param.step if param.kind == "float" else None)


def distributions(spec: SweepSpec) -> Dict[str, Any]:
    return {p.key: distribution(p) for p in spec.params}


def make_sampler(spec: SweepSpec, trials_so_far: int = 0):
    """``startup_trials`` random trials, then TPE (TPESampler's own random start-up does the first part).

    The seed moves on by the trials the study already has: a seeded sampler started again with the same
    seed replays its random sequence, so a resumed driver would ask the params of trials 0, 1, .. again
    (measured on the first resume test: trials 2 and 3 repeated 0 and 1).

    multivariate: learning rate and batch size interact, so model them jointly. constant_liar: trials are
    asked while others still run; without it each is drawn as if the running ones did not exist, and
    parallel trials crowd the same region."""
    import optuna

    seed = None if spec.seed is None else spec.seed + trials_so_far
    return optuna.samplers.TPESampler(n_startup_trials=spec.startup_trials, seed=seed, multivariate=True,
                                      constant_liar=True)


def make_pruner(spec: SweepSpec, max_steps: int):
    import optuna

    p = spec.pruner
    if p.kind == "none":
        return optuna.pruners.NopPruner()
    if p.kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=p.min_resource, max_resource=p.max_resource or max_steps,
                                              reduction_factor=p.reduction_factor)
    return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_steps)


# --- config overrides ---------------------------------------------------------------------------------
def format_value(value: Any) -> str:
    """A sampled value as the right-hand side of a key=value override (what load_config parses back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return "null"
    return str(value)


def trial_overrides(spec: SweepSpec, params: Mapping[str, Any], run_name: str, runs_root: str,
                    fixed: Sequence[str] = ()) -> List[str]:
    """key=value overrides for one trial: the sweep file's fixed overrides, then the command line's, then the
    trial's own run name and runs root (so it is an ordinary run under the runs root), then the sampled
    values (which win)."""
    out = list(spec.overrides) + list(fixed) + [f"run.name={run_name}", f"run.runs_root={runs_root}"]
    out += [f"{key}={format_value(value)}" for key, value in sorted(params.items())]
    return out


def trial_run_id(sweep_name: str, number: int) -> str:
    return f"{sweep_name}-t{number:03d}"


def sort_key(direction: str):
    """Key that sorts best first."""
    return (lambda v: -v) if direction == "maximize" else (lambda v: v)


def best_so_far(values: Sequence[Optional[float]], direction: str) -> List[Optional[float]]:
    """Running best over trial order; None (pruned, failed) keeps the previous best."""
    out: List[Optional[float]] = []
    best: Optional[float] = None
    better = (lambda a, b: a > b) if direction == "maximize" else (lambda a, b: a < b)
    for v in values:
        if v is not None and (best is None or better(v, best)):
            best = v
        out.append(best)
    return out
