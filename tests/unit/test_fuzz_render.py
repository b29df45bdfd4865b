"""Fuzzing the job-script renderer (issue 16, must-show 5): random values, placeholders and metacharacters in.

Invariant: the only exception is a ConfigError naming a field; whatever is rendered parses (``bash -n``) and,
run by bash with ``set -u`` in an empty folder with ``touch`` stubbed, executes nothing and exports exactly
the values given. All renderings run in ONE bash process (one subshell each) to keep the test fast. A second
target does the same for the ``#SBATCH`` half: any value a field's allow-list accepts is read back by sbatch
(tests/helpers/sbatch_parse.py) exactly as given.
"""
from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings, strategies as st
from submitit.slurm.slurm import _as_sbatch_flag

from hpc_agent.config.fields import EXTRA_PREFIX, FIELD_RULES, OPTION_RULES, field_problem
from hpc_agent.config.problems import ConfigError
from hpc_agent.jobs import executor
from tests.helpers.sbatch_parse import sbatch_words

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
# Placeholders and metacharacters a path may hold (rendered, then run by bash) ...
TOKENS = ["{run_dir}", "{config}", "{repo}", "{run_id}", "{other}", "$(touch CANARY)", "`touch CANARY`", ";", "&&",
          "|", ">", "<", "${IFS}", "$HOME", "$1", "'", '"', " ", "*", "?", "[", "]", "~", "!", "#", "ü", "😀", "/",
          "..", "-"]
# ... and ones it may not (a control character, sbatch's escape, Slurm's pattern sign, an over-long component).
BAD_TOKENS = ["%", "\\", "\n", "\t", "\x00", "\u2028", "x" * 300]
GOOD = st.one_of(st.sampled_from(TOKENS), st.text(alphabet="abc/_-.", min_size=1, max_size=4))
PIECE = st.integers(0, 19).flatmap(lambda i: st.sampled_from(BAD_TOKENS) if i == 0 else GOOD)  # 1 in 20 bad
VALUE = st.lists(PIECE, max_size=8).map("".join)
# Run ids are on an allow-list: mostly valid ones, so that most renderings get as far as bash.
RUN_ID = st.one_of(*[st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,30}", fullmatch=True)] * 3, VALUE)
SETUP = ["export HPC_AGENT_RUN_DIR={run_dir}", "export HPC_AGENT_RUN_ID={run_id}", "export HPC_AGENT_CONFIG={config}",
         "export HPC_AGENT_REPO={repo}", "export JOINED={run_dir}{config}:{repo}/{run_id}",
         "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"]
READ_BACK = 'printf "%s\\0" "$HPC_AGENT_RUN_DIR" "$HPC_AGENT_RUN_ID" "$HPC_AGENT_CONFIG" "$HPC_AGENT_REPO" "$JOINED"'


def test_fuzz_setup_lines_execute_nothing_and_export_exact_values(tmp_path):
    cases, rejected, started = [], [], time.monotonic()

    @FUZZ
    @given(run_dir=VALUE, config=VALUE, repo=VALUE, run_id=RUN_ID)
    def render(run_dir, config, repo, run_id):
        run_dir, config, repo = (str(Path("/" + v)) for v in (run_dir, config, repo))
        try:
            with mock.patch.object(executor, "code_root", lambda: Path(repo)):
                values = executor.template_values(run_id, Path(run_dir), Path(config))
        except ConfigError as exc:  # the one allowed exception: it names a field and what to change
            assert exc.problems and all(p.key in ("run.runs_root", "run.name", "hpc_agent install folder")
                                        and p.expected for p in exc.problems)
            rejected.append(exc)
            return
        lines = executor.render_lines(SETUP, values)
        cases.append((lines, [run_dir, run_id, config, repo, f"{run_dir}{config}:{repo}/{run_id}"]))

    render()
    total = len(cases) + len(rejected)
    assert total >= EXAMPLES and len(cases) >= EXAMPLES // 4, (len(cases), len(rejected))

    work = tmp_path / "work"
    work.mkdir()
    stub = tmp_path / "bin" / "touch"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/bash\necho "$*" >> {shlex.quote(str(tmp_path / "executed"))}\n')
    stub.chmod(0o755)
    script = tmp_path / "all.sh"
    script.write_text("set -u\n" + "".join("(\n" + "\n".join(lines) + f"\n{READ_BACK}\n)\nprintf '\\1'\n"
                                           for lines, _ in cases))
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=60).returncode == 0
    proc = subprocess.run(["bash", str(script)], cwd=work, capture_output=True, timeout=120,
                          env={"PATH": f"{stub.parent}:/usr/bin:/bin"})
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert not (tmp_path / "executed").exists() and list(work.iterdir()) == []
    outputs = proc.stdout.decode("utf-8").split("\1")[:-1]
    assert len(outputs) == len(cases)
    for (lines, expected), out in zip(cases, outputs):
        assert out.split("\0")[:-1] == expected, lines
    print(f"\nfuzz render: {total} examples, {len(cases)} rendered and run by bash, {len(rejected)} rejected as "
          f"config errors, {time.monotonic() - started:.1f} s")


SBATCH_KEYS = sorted(FIELD_RULES) + [EXTRA_PREFIX + option for option in sorted(OPTION_RULES)] + \
    [EXTRA_PREFIX + "gres", EXTRA_PREFIX + "begin"]
SBATCH_PIECE = st.one_of(PIECE, st.sampled_from(["node[1-3,5]", "a&b", "[r1*2|r2*4]", "(x)", "01:00:00", "2-12",
                                                 "UNLIMITED", "4G", "afterok:12:13", "END,FAIL", "gpu:a100:2"]))


def test_fuzz_sbatch_values_are_accepted_only_when_sbatch_reads_them_back_exactly():
    counts = {"accepted": 0, "rejected": 0}

    @FUZZ
    @given(key=st.sampled_from(SBATCH_KEYS), value=st.lists(SBATCH_PIECE, max_size=4).map("".join))
    def check(key, value):
        problem = field_problem(key, value)
        if problem is not None:
            assert isinstance(problem, str) and problem
            counts["rejected"] += 1
            return
        counts["accepted"] += 1
        option = key.rsplit(".", 1)[-1].replace("_", "-")
        assert sbatch_words(_as_sbatch_flag(option, value)[len("#SBATCH"):]) == [f"--{option}={value}"]

    check()
    assert sum(counts.values()) >= EXAMPLES and counts["accepted"] >= 100, counts
    print(f"\nfuzz #SBATCH values: {counts}")
