"""Property tests for the config loader (hypothesis, 1000 examples per target, derandomized).

The invariant: whatever the bytes, the loader returns a validated :class:`Config` or raises
:class:`ConfigError`, whose problems each name a location (``file:line:column`` for YAML it refuses, a
key path otherwise). No other exception escapes. Accepted configs also survive their own snapshot:
``to_yaml`` read back gives the same config. Run with ``pytest -s`` to see the example counts.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is in the test extra")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hpc_agent.config.load import build_config, load_snapshot_text, to_yaml  # noqa: E402
from hpc_agent.config.problems import ConfigError, Problem  # noqa: E402
from hpc_agent.config.schema import SECTIONS, Config  # noqa: E402
from hpc_agent.config.yaml_safe import load_mapping  # noqa: E402

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
LOCATED = re.compile(r":\d+:\d+$")
FIELDS = sorted({f"{s}.{name}" for s, cls in SECTIONS.items() for name in cls.__dataclass_fields__})

# Pieces people and attackers put into YAML: structure, anchors, tags, interpolations, odd characters.
TOKENS = ["train:", "slurm:", "run:", "data:", "lr:", "name:", "account:", "extra_sbatch:", "max_steps:", "time:",
          "\n", "\n  ", "\n    ", " ", "\t", "- ", "? ", ": ", "[", "]", "{", "}", ", ", "'", '"', "#", "---",
          "...", "&a ", "*a", "&b [*a, *a]", "<<: ", "!!python/object/apply:os.system [id]", "!!binary aGk=",
          "!env ", "!!str ", "!!int ", "~", "null", "yes", "1e-3", "1:30:00", "2024-01-01", "0x1F", "010",
          "99999999999999999999999", ".inf", "-", "${oc.env:HOME}", "${oc.env:NOPE_UNSET}", "${train.lr}",
          "${oc.decode:1}", "\\${x}", "$(", "`id`", ";", "|", ">", "&&", "\x00", "\x1b", "\ufeff", "é", "\u2028",
          "\r\n", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n", "a" * 300, "[" * 40, "]" * 40]


def _problem_is_located(problem: Problem) -> bool:
    key = str(problem.key)
    if str(problem.expected).startswith("valid YAML"):
        return bool(LOCATED.search(key))
    return bool(key)


def _check(outcome) -> None:
    """The invariant, on a Config or a ConfigError (anything else has already failed the test)."""
    if isinstance(outcome, Config):
        assert load_snapshot_text(to_yaml(outcome)) == outcome
        return
    assert isinstance(outcome, ConfigError) and outcome.problems
    assert all(_problem_is_located(p) for p in outcome.problems), outcome.problems
    assert "Traceback" not in outcome.render()


def _load(path: Path):
    """What ``load_config`` does with a file, minus the base layer: read it safely, then build and
    validate (the CLI itself is exercised by tests/unit/test_config_hostile.py)."""
    try:
        return build_config([load_mapping(path)])
    except ConfigError as exc:
        return exc


class _Counter:
    def __init__(self) -> None:
        self.n = self.ok = 0

    def add(self, outcome) -> None:
        self.n += 1
        self.ok += isinstance(outcome, Config)

    def report(self, name: str) -> None:
        print(f"\nfuzz {name}: {self.n} examples, {self.ok} valid configs, {self.n - self.ok} ConfigErrors, "
              "0 other exceptions")
        assert self.n >= EXAMPLES


@pytest.fixture
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def test_fuzz_random_bytes(workdir):
    counter = _Counter()
    path = workdir / "cfg.yaml"

    @FUZZ
    @given(st.binary(max_size=400))
    def run(data: bytes) -> None:
        path.write_bytes(data)
        outcome = _load(path)
        _check(outcome)
        counter.add(outcome)

    run()
    counter.report("random bytes")


def test_fuzz_yaml_like_text(workdir):
    counter = _Counter()
    path = workdir / "cfg.yaml"

    @FUZZ
    @given(st.lists(st.sampled_from(TOKENS) | st.text(max_size=6), max_size=40))
    def run(parts) -> None:
        path.write_text("".join(parts), encoding="utf-8", errors="surrogatepass")
        outcome = _load(path)
        _check(outcome)
        counter.add(outcome)

    run()
    counter.report("YAML-like text")


HOSTILE = st.sampled_from(["x;touch /tmp/p", "$(id)", "`id`", "a\nb", "${oc.env:HOME}", "${oc.env:NOPE_UNSET}",
                           "${train.lr}", "${oc.env:HOME,/x}", "\\${oc.env:HOME}", "{run_dir}", "", " ", "\x00",
                           "x" * 5000, "1:30:00", "4G", "low", "node[1-3]", "é", "'", '"', "\\"]) | st.text(max_size=20)
SCALARS = HOSTILE | st.integers(-(2 ** 70), 2 ** 70) | st.floats() | st.booleans() | st.none()
KEYS = st.sampled_from(sorted(SECTIONS) + [f.split(".")[1] for f in FIELDS] + ["env_origin", "extra_sbatch",
                                                                               "mail-type", "a.b", ""]) | st.text(max_size=8)
TREES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
                     max_leaves=8)
LAYERS = st.dictionaries(st.sampled_from(sorted(SECTIONS)) | KEYS,
                         st.dictionaries(KEYS, TREES, max_size=4) | TREES, max_size=4)


def test_fuzz_structured_dicts(workdir):
    counter = _Counter()
    path = workdir / "cfg.yaml"

    @FUZZ
    @given(LAYERS)
    def run(layer) -> None:
        try:
            outcome = build_config([layer])
        except ConfigError as exc:
            outcome = exc
        _check(outcome)
        counter.add(outcome)
        try:  # the same tree as a file, through the reader: it reads back what safe_dump wrote, or says where not
            text = yaml.safe_dump(layer, allow_unicode=True)
        except yaml.YAMLError:
            return
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            assert isinstance(load_mapping(path), dict)
        except ConfigError as exc:
            _check(exc)

    run()
    counter.report("structured dicts")
