"""Issue 44's must-show: a new cluster user's tour, end to end, as a non-root user created here.

CI runs as root, and root hides what a user meets (files only root can read, a HOME that is not theirs,
Slurm jobs that run as root). So the test creates an account and runs every step as it, with its own HOME,
nothing of root's environment, and the wheel installed into its own virtualenv (the README's "On a cluster,
without root": ``pip install``, ``init``, ``prepare``, ``doctor``, ``submit``, ``status``, ``review``, ``export``):

1. a wheel install into the user's venv, made from the system Python (built from this checkout; its dependencies come from the test's
   own venv through a ``.pth`` line, so nothing is downloaded), then ``init`` and ``doctor``;
2. mistakes caught at ``submit`` with exit 2, before any queue wait: a mistyped submodule
   (``my_model.modle:build``) and DeepSpeed ops not yet prepared for this venv; then ``prepare``;
3. the user's own model package (docs/your_model.md's example) and a command-mode script that reads a file
   next to itself (``Path(__file__).parent / "params.json"``) and a data file by a relative path, each
   run under Slurm with ``--wait`` to COMPLETED, and the same two on the local executor;
4. ``status`` and ``review`` show all four completed, one attempt each, ETTR above 0;
5. ``export`` of the Slurm model run: the load lines its README gives, run as they are,
   load ``model.safetensors`` into the user's own model.

The time of each step and of the whole tour is printed (``pytest -s``) and kept in the assertion messages.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.cluster.test_wheel_install import copy_source
from tests.helpers import users
from tests.helpers.doc_example import write_package
from tests.slurm_helpers import cleanup_jobs

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
USER = "hpcagent_newuser"
SCRIPT = '''"""A new user's script: its settings next to it, its data by a path relative to where it runs."""
import argparse
import json
from pathlib import Path

from launch import script_api as hpc

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
args = parser.parse_args()
params = json.loads((Path(__file__).parent / "params.json").read_text())
values = [float(x) for x in Path(args.data).read_text().split()]
for step in range(1, params["steps"] + 1):
    hpc.report_step(step, sum(values) / len(values) / step)
print(f"tour script: {len(values)} values, {params['steps']} steps, done", flush=True)
'''
COMMON = ["train.max_steps=6", "train.ckpt_every=3", "train.precision=fp32", "train.log_every=1"]


class Tour:
    """The account, its HOME and venv, and a runner that times each step."""

    def __init__(self, user: users.User, home: Path):
        self.user, self.home = user, home
        self.venv = home / "venv"
        self.project = home / "project"
        self.times: Dict[str, float] = {}
        self.env = {"PATH": f"{self.venv}/bin:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "USER": user.name,
                    "LOGNAME": user.name, "LANG": "C.UTF-8", "TMPDIR": str(home / "tmp")}

    def run(self, label: str, argv: List[str], timeout: float = 300, cwd: Path | None = None,
            extra_env: Dict[str, str] | None = None):
        started = time.monotonic()
        done = self.user.run(argv, cwd=cwd or self.project, timeout=timeout, env={**self.env, **(extra_env or {})})
        self.times[label] = self.times.get(label, 0.0) + time.monotonic() - started
        print(f"[tour] {label}: exit {done.returncode} after {time.monotonic() - started:.1f} s", flush=True)
        return done

    def agent(self, label: str, *args: str, timeout: float = 300):
        return self.run(label, [str(self.venv / "bin" / "hpc-agent"), *args], timeout=timeout)

    def summary(self) -> str:
        return ", ".join(f"{k} {v:.0f} s" for k, v in self.times.items())


def _out(done) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"


def _run_id(done) -> str:
    found = re.search(r"^run id: +(\S+)$", done.stdout, re.M)
    assert found, _out(done)
    return found.group(1)


def system_python() -> Path | None:
    """A Python of this minor version that every user may run: the new user's venv is made from it, and the
    test venv's packages (built for this minor version) are shared with it."""
    name = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for folder in ("/usr/bin", "/usr/local/bin"):
        path = Path(folder) / name
        if path.is_file() and os.stat(path).st_mode & 0o001:
            return path
    return None


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    if (why := users.why_not()) is not None:
        pytest.skip(why)
    home = Path(tempfile.mkdtemp(prefix="hpc_agent_tour."))  # under /tmp: /tmp/pytest-of-root is root's alone
    user = users.ensure_user(USER, home=home)
    within = [Path(tempfile.gettempdir()), REPO]
    python = system_python()
    if python is None:
        pytest.skip(f"no Python {sys.version_info[0]}.{sys.version_info[1]} that other users may run (in /usr/bin "
                    f"or /usr/local/bin) for the new user's venv; this one ({sys.base_prefix}) may be private")
    for needed in (Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["platlib"])):
        if (why := users.reachable_by_others(needed, within)) is not None:
            shutil.rmtree(home, ignore_errors=True)
            pytest.skip(f"the test's venv cannot be shared with the new user: {why}")
    # The wheel, built by the maintainer (root) from this checkout, handed to the user as a file.
    build = tmp_path_factory.mktemp("tour_wheel")
    copy_source(build / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            str(build / "src"), "-w", str(build / "dist")], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (build / "dist").glob("hpc_agent-*.whl")
    shutil.copy2(wheel, home / wheel.name)
    (home / "tmp").mkdir()
    (home / "project").mkdir()
    for path in [home, *home.rglob("*")]:
        os.chown(path, user.uid, user.gid)
    os.chmod(home, 0o755)
    t = Tour(user, home)
    t.python = python
    t.wheel = home / wheel.name
    try:
        yield t
    finally:
        cleanup_jobs(t.project / "runs")
        print(f"[tour] steps: {t.summary()}; total {sum(t.times.values()):.0f} s", flush=True)
        shutil.rmtree(home, ignore_errors=True)


def test_new_user_tour(tour):
    started = time.monotonic()
    project = tour.project
    # 1. The user's venv, sharing the test venv's dependencies (a user would have their own torch there).
    made = tour.run("venv", [str(tour.python), "-m", "venv", str(tour.venv)], timeout=120)
    assert made.returncode == 0, _out(made)
    purelib = tour.run("venv", [str(tour.venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    deps = "".join(f"{p}\n" for p in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
    wrote = tour.run("venv", [str(tour.venv / "bin" / "python"), "-c",
                              f"open({str(Path(purelib) / '_dependencies.pth')!r}, 'w').write({deps!r})"])
    assert wrote.returncode == 0, _out(wrote)
    installed = tour.run("pip install", [str(tour.venv / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index",
                                         str(tour.wheel)], timeout=300)
    assert installed.returncode == 0, _out(installed)
    where = tour.run("pip install", [str(tour.venv / "bin" / "python"), "-c", "import hpc_agent; print(hpc_agent.__file__)"])
    assert Path(where.stdout.strip()).is_relative_to(tour.venv), _out(where)  # the wheel's, not the checkout's

    init = tour.agent("init", "init")
    assert init.returncode == 0, _out(init)
    assert (project / "hpc_agent.yaml").is_file()
    doctor = tour.agent("doctor", "doctor", "hpc_agent.yaml", timeout=300)
    assert doctor.returncode in (0, 1), _out(doctor)  # 1: a FAIL among the checks (the ops are not prepared yet)
    assert re.search(r"^(READY|FAILED): ", doctor.stdout, re.M), _out(doctor)
    assert "Traceback" not in doctor.stdout + doctor.stderr

    # 2. Mistakes caught at submit, exit 2, nothing submitted.
    write_package(project)
    (project / "script").mkdir()
    (project / "script" / "train.py").write_text(SCRIPT)
    (project / "script" / "params.json").write_text(json.dumps({"steps": 6}))
    (project / "data").mkdir()
    (project / "data" / "values.txt").write_text("1 2 3 4\n")
    for path in [project, *project.rglob("*")]:
        os.chown(path, tour.user.uid, tour.user.gid)
    typo = tour.agent("submit typo", "submit", "hpc_agent.yaml", "--executor", "slurm",
                      "train.workload=my_model.modle:build", *COMMON)
    assert typo.returncode == 2, _out(typo)
    assert "my_model.modle" in typo.stderr and "my_model.model" in typo.stderr, _out(typo)  # did you mean
    assert "Traceback" not in typo.stderr
    unprepared = tour.agent("submit unprepared", "submit", "hpc_agent.yaml", "--executor", "slurm",
                            "train.workload=my_model.model:build", *COMMON)
    assert unprepared.returncode == 2, _out(unprepared)
    assert "prepare" in unprepared.stderr, _out(unprepared)
    assert not (project / "runs").exists() or not any((project / "runs").glob("*/run.json")), "a refused submit ran"
    prepared = tour.agent("prepare", "prepare", timeout=900)
    assert prepared.returncode == 0, _out(prepared)

    # 3. The model package and the script, under Slurm and on the local executor, each to COMPLETED.
    runs: Dict[str, str] = {}
    script = ["train.command=[python,script/train.py,--data,data/values.txt]"]
    for executor in ("slurm", "local"):
        for kind, extra in (("model", ["train.workload=my_model.model:build"]), ("script", script)):
            label = f"{kind} on {executor}"
            done = tour.agent(label, "submit", "hpc_agent.yaml", "--executor", executor, "--wait",
                              "--wait-timeout", "400", f"run.name=tour-{kind}-{executor}", *extra, *COMMON,
                              timeout=480)
            assert done.returncode == 0, label + "\n" + _out(done)
            assert "finished: COMPLETED" in done.stdout, label + "\n" + _out(done)
            runs[label] = _run_id(done)
            if kind == "script":
                log = "".join(p.read_text(errors="replace") for p in (project / "runs" / runs[label]).rglob("*_log.out"))
                assert "tour script: 4 values, 6 steps, done" in log, label + "\n" + log[-3000:]

    # 4. status and review: all four completed, one attempt each, ETTR above 0.
    status = tour.agent("status", "status", "--json")
    assert status.returncode == 0, _out(status)
    lines = {line["run_id"]: line for line in json.loads(status.stdout)["runs"]}
    for label, run_id in runs.items():
        assert lines[run_id]["phase"] == "completed", f"{label}: {lines[run_id]}"
    review = tour.agent("review", "review", "runs", "--json")
    assert review.returncode == 0, _out(review)
    reviewed = {r["run_id"]: r for r in json.loads(review.stdout)["runs"]}
    for label, run_id in runs.items():
        r = reviewed[run_id]
        assert r["phase"] == "completed" and r["attempts"] == 1, f"{label}: {r}"
        assert (r.get("ettr") or 0) > 0, f"{label}: {r}"

    # 5. export of the model run: weights that load into the user's model.
    out = tour.home / "exported"
    exported = tour.agent("export", "export", runs["model on slurm"], "--out", str(out), timeout=300)
    assert exported.returncode == 0, _out(exported)
    readme = (out / "README.md").read_text()
    (code,) = re.findall(r"```python\n(.*?)```", readme, re.S)  # the README's own load lines, run as they are
    assert "my_model.model" in code, readme
    loaded = tour.run("export", [str(tour.venv / "bin" / "python"), "-c",
                                 code + "\nprint('loaded', sum(p.numel() for p in model.parameters()), 'parameters')\n"],
                      cwd=out, extra_env={"PYTHONPATH": str(project)})
    assert loaded.returncode == 0 and "loaded" in loaded.stdout, _out(loaded) + "\n" + code
    assert (out / "config.json").is_file() and (out / "README.md").is_file()
    total = time.monotonic() - started
    print(f"[tour] end to end: {total:.0f} s ({tour.summary()})", flush=True)
