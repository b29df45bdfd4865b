"""Issue 42, finding 10: intent settling could adopt another user's job. A watcher that died between its
intent and sbatch's answer asks Slurm for jobs under the run's job name (``hpc_agent:<run id>``). squeue lists
every user's jobs (unless the cluster sets PrivateData=jobs) and sacct lists everyone's to root, so another
user's job of the same name (a colleague's run with the same id, or one named so on purpose) was taken as
this run's: the watcher would then follow, requeue or cancel someone else's job and never submit its own.

Every lookup by name now carries ``--user=<uid>`` (``hpc_agent/slurm/queries.py::own_jobs``): squeue, sacct
and scancel take it on Slurm 20.11-24.x."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import List

import pytest

from hpc_agent.slurm.cli import SlurmCLI
from hpc_agent.slurm.job_match import job_name_for
from hpc_agent.slurm.queries import jobs_named, own_jobs
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher.effects import Context, settle_intent
from tests.helpers.fake_slurm import FakeSlurm
from tests.unit.test_watcher import add_run, world  # noqa: F401 - the fake-Slurm watcher fixture

OTHER = ("mallory", "4242")
MINE, THEIRS = "555", "777"

# A squeue/sacct that answers as Slurm does for root on a cluster without PrivateData=jobs: every user's
# jobs unless the argv scopes the lookup to users (--me, --user=/-u); each argv is recorded.
FAKE = r'''#!{python}
import json, os, sys
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *args]) + "\n")
users = set()
for i, a in enumerate(args):
    if a == "--me":
        users |= {{str(os.getuid())}}
    elif a.startswith("--user="):
        users |= set(a.split("=", 1)[1].split(","))
    elif a in ("-u", "--user") and i + 1 < len(args):
        users |= set(args[i + 1].split(","))
jobs = [({mine!r}, str(os.getuid())), ({theirs!r}, {other_uid!r}), ({theirs_name_only!r}, "mallory")]
shown = [j for j, owner in jobs if not users or owner in users]
if os.path.basename(sys.argv[0]) == "sacct":
    print("JobID|JobName|State")
    for j in shown:
        print(f"{{j}}|{name}|PENDING")
else:
    for j in shown:
        print(j)
'''


@pytest.fixture
def fake_slurm_on_path(tmp_path, monkeypatch):
    bin_dir, log = tmp_path / "bin", tmp_path / "argv.jsonl"
    bin_dir.mkdir()
    for command in ("squeue", "sacct"):
        path = bin_dir / command
        path.write_text(FAKE.format(python=sys.executable, log=str(log), mine=MINE, theirs=THEIRS,
                                    other_uid=OTHER[1], theirs_name_only="778", name=job_name_for("r")))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("HPC_AGENT_CLUSTERS", raising=False)
    return log


def _argvs(log: Path) -> List[List[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_own_jobs_is_this_users_uid():
    assert own_jobs() == [f"--user={os.getuid()}"]
    assert own_jobs(1234) == ["--user=1234"]


def test_settling_an_intent_never_adopts_another_users_job(tmp_path, fake_slurm_on_path):
    """Through the real Slurm adapter and PATH: Slurm lists our job 555 and another user's 777 (and 778)
    under the run's name; the intent settles to 555, and every argv that looks up by name is scoped."""
    now = [1_000_000.0]
    ledger = Ledger(tmp_path / "runs" / "ledger.sqlite", clock=lambda: now[0])
    ledger.add_run("r", "t", str(tmp_path / "runs" / "r"))
    sid = ledger.record_intent("r", "slurm", str(tmp_path / "runs" / "r" / "config.yaml"), "gpu_oom: resubmit")
    now[0] += 3600
    said: List[str] = []
    ctx = Context(ledger=ledger, slurm=SlurmCLI(timeout_s=30), submit=lambda *a, **k: pytest.fail("submitted"),
                  say=lambda run, text: said.append(text), clock=lambda: now[0])
    run = ledger.run("r")
    (sub,) = [s for s in ledger.submissions("r") if s.id == sid]
    assert settle_intent(ctx, run, sub) == MINE
    assert ledger.latest_submission("r").job_id == MINE
    by_name = [argv for argv in _argvs(fake_slurm_on_path) if "--name" in argv]
    assert {argv[0] for argv in by_name} == {"squeue", "sacct"}
    for argv in by_name:
        assert f"--user={os.getuid()}" in argv, argv
    assert not any(THEIRS in text or "778" in text for text in said)


def test_the_attack_was_live_without_the_scope(fake_slurm_on_path):
    """The same Slurm asked the old way (no user scope) lists the other user's jobs: the test above would
    have settled the intent to 778, the newest."""
    out = SlurmCLI().run(["squeue", "--noheader", "--states", "all", "--name", job_name_for("r"), "--format", "%i"])
    assert out.stdout.split() == [MINE, THEIRS, "778"]


def test_the_watcher_submits_its_own_job_instead_of_adopting_anothers(world):  # noqa: F811
    """The in-memory Slurm (tests/helpers/fake_slurm.py) with another user's job under the run's name: the
    watcher's reconcile leaves it alone and submits the run's own job; the other user's job is untouched;
    a second run goes on."""
    slurm: FakeSlurm = world["slurm"]
    run_dir, job = add_run(world, "r")
    _, other_run_job = add_run(world, "s")
    slurm.oom(job)
    ledger = world["ledger"]
    ledger.set_phase("r", "recovering")
    ledger.record_intent("r", "slurm", str(run_dir / "config.yaml"), "gpu_oom: resubmit")
    theirs = slurm.submit(job_name_for("r"), owner=OTHER)  # mallory's job, same name, after our intent
    slurm.advance(121)
    world["watcher"].reconcile()
    (call,) = world["submit"].calls
    latest = ledger.latest_submission("r")
    assert latest.job_id == call["job_id"] != theirs
    assert slurm.owner_of(slurm.job(latest.job_id))[0] == slurm.user
    assert slurm.job(theirs).state == "PENDING" and slurm.job(theirs).name == job_name_for("r")
    for argv in slurm.calls:
        if "--name" in argv or any(a.startswith("--name=") for a in argv):
            assert f"--user={os.getuid()}" in argv, argv
    assert not [a for a in slurm.calls if a[0] in ("scancel", "scontrol") and theirs in " ".join(a)]
    world["watcher"].tick()
    assert ledger.run("s").phase == "running" and slurm.job(other_run_job).state == "RUNNING"


def test_fake_slurm_scopes_like_slurm():
    """The in-memory Slurm answers by-name lookups the way the real one does for root: everyone's jobs
    unless scoped with --me or --user (names or uids); sacct without -u shows everyone's to root only."""
    slurm = FakeSlurm(uid="0", user="root")
    mine = slurm.submit("hpc_agent:x")
    theirs = slurm.submit("hpc_agent:x", owner=OTHER)
    squeue = lambda *a: slurm.run(["squeue", "--noheader", "--states", "all", *a, "--name", "hpc_agent:x",  # noqa: E731
                                   "--format", "%i|%u"]).stdout.split()
    assert squeue() == [f"{mine}|root", f"{theirs}|mallory"]
    assert squeue("--me") == squeue("--user=0") == squeue("--user", "root") == [f"{mine}|root"]
    assert squeue("--user=mallory") == squeue("-u", OTHER[1]) == [f"{theirs}|mallory"]
    sacct = lambda *a: [line.split("|")[0] for line in slurm.run(  # noqa: E731
        ["sacct", "--parsable2", "--allocations", *a, "--name", "hpc_agent:x", "--format", "JobID,User"]
    ).stdout.splitlines()[1:]]
    assert sacct() == [mine, theirs] and sacct("--user=0") == [mine]
    user_slurm = FakeSlurm(uid="1000", user="alice")
    own = user_slurm.submit("hpc_agent:x")
    user_slurm.submit("hpc_agent:x", owner=OTHER)
    assert [line.split("|")[0] for line in user_slurm.run(["sacct", "--parsable2", "--name", "hpc_agent:x",
                                                           "--format", "JobID"]).stdout.splitlines()[1:]] == [own]
    own_slurm = FakeSlurm(user="me")  # this process's uid, as the watcher's Slurm sees it
    ours = own_slurm.submit("hpc_agent:x")
    own_slurm.submit("hpc_agent:x", owner=OTHER)
    assert jobs_named(own_slurm, "hpc_agent:x", since=own_slurm.now - 60) == [ours]
