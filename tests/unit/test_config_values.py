"""Table tests of the pure checks behind finding 7 (issue 42): one value check for every leaf, the sbatch
options hpc_agent owns, and the activation-line rules (here-documents, unclosed quoting)."""
from __future__ import annotations

import math

import pytest

from hpc_agent.config.fields import INT_LIMIT, OWNED_OPTIONS, owned_option_problem, value_problem, value_problems
from hpc_agent.config.profile import activate_problem, unclosed

VALUES = [  # (key, value, None or a fragment of the expected-text)
    ("train.lr", 3e-4, None), ("train.lr", math.nan, "finite"), ("train.lr", math.inf, "finite"),
    ("train.lr", -math.inf, "finite"), ("train.max_steps", INT_LIMIT, None),
    ("train.max_steps", INT_LIMIT + 1, str(INT_LIMIT)),
    ("train.max_steps", -INT_LIMIT - 1, str(INT_LIMIT)), ("train.seed", 2 ** 32 - 1, None),
    ("train.seed", 2 ** 32, "2**32-1"), ("train.seed", -1, "0 to"), ("slurm.signal_lead_s", 65536, "65535"),
    ("slurm.nodes", 2 ** 31, "32 bits"), ("watch.enabled", True, None), ("run.name", "ok-ü😀", None),
    ("run.name", "a\ud800", "lone surrogate"), ("run.name", "\udfff", "\\udfff"), ("x", None, None),
]


@pytest.mark.parametrize("key,value,expected", VALUES)
def test_value_problem_table(key, value, expected):
    why = value_problem(key, value)
    if expected is None:
        assert why is None, why
    else:
        assert why is not None and expected in why, why


def test_value_problems_walks_keys_lists_and_mappings():
    data = {"command": ["python", "\ud800"], "costs": {"gpu": math.nan}, "k\ud800": 1, "n": 10 ** 30}
    found = {p.key: p for p in value_problems(data, "s")}
    assert set(found) == {"s.command[1]", "s.costs.gpu", "s (key)", "s.n"}, found
    assert "integer" in found["s.n"].expected


OWNED = [("output", "--output"), ("outp", "--output"), ("o", "--"), ("sig", "--signal"), ("open", "--open-mode"),
         ("arr", "--array"), ("no-requeue", "--no-requeue"), ("job", "--job-name"), ("mem", "--mem"),
         ("gpus", "--gpus"), ("time", "--time"), ("wait", "--wait"), ("test", "--test-only")]
FREE = ["mail-type", "mail-user", "reservation", "exclusive", "dependency", "hold", "begin", "mem-per-cpu",
        "time-min", "nodelist", "gpus-per-task", "wckey", "licenses"]


@pytest.mark.parametrize("option,named", OWNED)
def test_owned_options_and_their_abbreviations_are_refused(option, named):
    why = owned_option_problem(option)
    assert why is not None and named in why and "remove it from slurm.extra_sbatch" in why


@pytest.mark.parametrize("option", FREE)
def test_other_options_stay_free(option):
    assert owned_option_problem(option) is None


def test_every_owned_option_names_what_to_do_instead():
    for name, fix in OWNED_OPTIONS.items():
        assert fix.startswith(("set ", "use ", "there is no setting")), (name, fix)


ACTIVATE = [  # (line, None or a fragment of the expected-text)
    ("module load cuda/12.4", None), ("source /shared/venv/bin/activate", None), ("cat <<< word", None),
    ("echo \"it's $(date)\" # don't", None), ("echo $'a\\'b'", None), ("export X=${X:-1}", None),
    ("echo $((1 + 2)) `date`", None), ("x=$(echo ')')", None), ("echo \\'", None),
    ("cat <<EOF", "here-document"), ("cat <<\\EOF", "here-document"), ("cat <<.", "here-document"),
    ("cat <<@", "here-document"), ("cat <<'E'", "here-document"), ("cat <<-E", "here-document"),
    ("cat <<<x <<E", "here-document"), ("echo 'a", "' at position 5"), ('echo "a', '" at position 5'),
    ("echo $(a", "$( at position 5"), ("echo `a", "` at position 5"), ("echo ${a", "${ at position 5"),
    ("echo $'a", "$' at position 5"), ("(cd x", "( at position 0"), ("echo \"$(a)", '" at position 5'),
]


@pytest.mark.parametrize("line,expected", ACTIVATE)
def test_activation_line_table(line, expected):
    why = activate_problem(line)
    if expected is None:
        assert why is None and unclosed(line) is None, why
    else:
        assert why is not None and expected in why, why
