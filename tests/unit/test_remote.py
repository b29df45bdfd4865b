"""``--remote``'s pure parts without any sshd: the ssh argv, quoting of hostile words, option stripping, the
submit forwarding, the TB export/mirror protocol, status lines and the watcher's service files.

The quoting tests run the built command string through a real ``sh -c`` (what the remote login shell does
with the one string ssh hands it) and check the program receives exactly the words it was given."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_agent import status
from hpc_agent.remote import ssh, ssh_submit, tb_pull
from hpc_agent.watcher import service_files

HOSTILE = ["plain", "two words", "it's", 'say "hi"', "$(touch /tmp/pwned_hpc_agent)", "`id`", "a;b", "x && y",
           "line1\nline2", "# not a comment", "#", "*", "~", "$HOME", "back\\slash", "-n", "--", "", "tab\there",
           "ünïcödé", "%C %h"]


def _echo_words(command: str) -> list:
    """What a POSIX login shell makes of ``command``: the argv that reaches the program."""
    script = "import json, sys; print(json.dumps(sys.argv[1:]))"
    command = command.replace("exec " + shlex.quote(sys.executable), "exec " + shlex.quote(sys.executable)
                              + " -c " + shlex.quote(script), 1)
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("word", HOSTILE)
def test_every_hostile_word_arrives_as_one_argv_word(word):
    command = ssh.remote_command([sys.executable, word, "after"])
    assert _echo_words(command) == [word, "after"]
    assert not Path("/tmp/pwned_hpc_agent").exists()


def test_all_hostile_words_at_once_and_with_a_remote_dir(tmp_path):
    folder = tmp_path / "it's a $(dir); #x"
    folder.mkdir()
    words = [sys.executable, *HOSTILE]
    assert _echo_words(ssh.remote_command(words)) == HOSTILE
    assert _echo_words(ssh.remote_command(words, str(folder))) == HOSTILE


def test_remote_dir_is_relative_to_home_and_quoted():
    assert ssh.remote_command(["py", "x"], "~/proj dir") == "cd -- 'proj dir' && exec py x"
    assert ssh.remote_command(["py"], "/abs") == "cd -- /abs && exec py"
    with pytest.raises(ssh.RemoteError):
        ssh.remote_command(["py", "a\0b"])


@pytest.mark.parametrize("target, ok", [
    ("login", True), ("me@login.cluster.org", True), ("root@127.0.0.1", True), ("u@[::1]", True),
    ("-oProxyCommand=touch /tmp/x", False), ("me@-x", False), ("me @host", False), ("host;id", False),
    ("a\nb", False), ("", False), ("me@host:22", False)])
def test_targets(target, ok):
    if ok:
        assert ssh.check_target(target) == target
    else:
        with pytest.raises(ssh.RemoteError):
            ssh.check_target(target)


@pytest.mark.parametrize("option, ok", [
    ("Port=2222", True), ("IdentityFile=/tmp/my key", True), ("StrictHostKeyChecking=accept-new", True),
    ("-p", False), ("Port", False), ("=x", False), ("Port=1\nProxyCommand=x", False), ("1Port=2", False)])
def test_ssh_options(option, ok):
    if ok:
        assert ssh.check_options([option]) == [option]
    else:
        with pytest.raises(ssh.RemoteError):
            ssh.check_options([option])


def test_ssh_argv_shape(tmp_path):
    argv = ssh.ssh_argv("me@login", "exec python3 -m hpc_agent status", tmp_path, ["Port=2222"])
    assert argv[:4] == ["ssh", "-T", "-o", "Port=2222"]  # the user's options first: ssh keeps the first value
    assert argv[-3:] == ["--", "me@login", "exec python3 -m hpc_agent status"]
    opts = [argv[i + 1] for i, w in enumerate(argv) if w == "-o"]
    assert "BatchMode=yes" in opts and "ControlMaster=auto" in opts and f"ControlPath={tmp_path}/%C" in opts
    assert any(o.startswith("ConnectTimeout=") for o in opts) and any(o.startswith("ControlPersist=") for o in opts)
    assert ssh.close_argv(argv)[-4:] == ["-O", "exit", "--", "me@login"]


def test_socket_path_with_percent_and_space_is_escaped(tmp_path):
    argv = ssh.ssh_argv("h", "true", tmp_path / "50% a", [])
    assert f'ControlPath="{tmp_path}/50%% a"/%C' in argv


def test_env_options(monkeypatch):
    assert ssh.env_options({ssh.SSH_OPTS_ENV: "Port=2 'IdentityFile=/a b'"}) == ["Port=2", "IdentityFile=/a b"]
    with pytest.raises(ssh.RemoteError):
        ssh.env_options({ssh.SSH_OPTS_ENV: "-p 2"})


@pytest.mark.parametrize("argv, rest", [
    (["--remote", "h", "runs/x", "--json"], ["runs/x", "--json"]),
    (["--remote=h", "--ssh-option", "Port=2", "--ssh-option=User=x", "12"], ["12"]),
    (["12", "--remote-python", "/v/bin/python", "--remote-dir", "p", "--tail-bytes", "10"], ["12", "--tail-bytes", "10"]),
    (["--remote", "h", "--", "--remote", "x"], ["--", "--remote", "x"]),
])
def test_split_argv(argv, rest):
    assert ssh.split_argv(argv) == rest


def test_split_argv_refuses_abbreviations():
    with pytest.raises(ssh.RemoteError):
        ssh.split_argv(["--remote-p", "x"])


def test_socket_dir_is_private_and_short(tmp_path, monkeypatch):
    folder = ssh.ensure_socket_dir(ssh.socket_dir({"XDG_RUNTIME_DIR": str(tmp_path)}))
    assert folder == tmp_path / "hpc_agent-ssh" or folder.name.startswith("hpc_agent-ssh-")
    assert folder.stat().st_mode & 0o777 == 0o700 and len(str(folder)) <= ssh.MAX_SOCKET_DIR
    os.chmod(folder, 0o755)
    assert ssh.ensure_socket_dir(folder).stat().st_mode & 0o777 == 0o700  # tightened
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(ssh.RemoteError):
        ssh.ensure_socket_dir(link)
    long_home = {"HOME": "/" + "h" * 80}
    assert str(ssh.socket_dir(long_home)) == f"/tmp/hpc_agent-ssh-{os.getuid()}"


def _submit_args(argv):
    from hpc_agent.submit import build_parser

    return build_parser().parse_intermixed_args(argv)


def test_submit_sends_stdin_config_and_flags_without_overrides():
    argv = ["--remote", "me@login", "quickstart", "train.max_steps=7", "--wait", "--ssh-option", "Port=2"]
    args = _submit_args(argv)
    assert ssh_submit.remote_args(argv, args) == ["-", "--wait"]


def test_submit_remote_validates_locally_and_sends_nothing(monkeypatch, capsys):
    sent = []
    monkeypatch.setattr(ssh, "forward", lambda *a, **k: sent.append((a, k)) or 0)
    argv = ["--remote", "me@login", "quickstart", "train.max_steps=-3", "slurm.nodes=zero"]
    assert ssh_submit.submit_remote(_submit_args(argv), argv) == 2
    err = capsys.readouterr().err
    assert "train.max_steps" in err and "slurm.nodes" in err and "Nothing was sent" in err and not sent


def test_submit_remote_sends_the_resolved_yaml(monkeypatch):
    sent = {}
    monkeypatch.setenv("HPC_AGENT_RUNS", "/laptop/runs")  # the laptop's runs root never reaches the login node

    def fake_forward(command, argv, args, stdin=None, timeout_s=None):
        sent.update(command=command, argv=argv, stdin=stdin)
        return 0

    monkeypatch.setattr(ssh, "forward", fake_forward)
    argv = ["--remote", "me@login", "quickstart", "train.max_steps=7"]
    assert ssh_submit.submit_remote(_submit_args(argv), argv) == 0
    assert sent["command"] == "submit" and sent["argv"] == ["-"]
    from hpc_agent.config.load import load_snapshot_text

    cfg = load_snapshot_text(sent["stdin"].decode())
    assert cfg.train.max_steps == 7 and cfg.run.runs_root != "/laptop/runs"


def test_config_from_stdin(tmp_path):
    import io

    from hpc_agent.config.problems import ConfigError

    path = Path(ssh_submit.config_from_stdin(io.BytesIO(b"train:\n  max_steps: 3\n")))
    assert path.read_text() == "train:\n  max_steps: 3\n" and path.parent.stat().st_mode & 0o777 == 0o700
    for data in (b"", b"x" * ((1 << 20) + 1)):
        with pytest.raises(ConfigError):
            ssh_submit.config_from_stdin(io.BytesIO(data))


# --- the TB pull protocol, both halves in one process ----------------------------------------------------
def _pull_round(run_dir, mirror, state, budget=tb_pull.BUDGET):
    reply = json.loads(json.dumps(tb_pull.export(run_dir, state, budget)))
    return reply, tb_pull.apply(mirror, reply, state)


def test_export_and_apply_mirror_incrementally(tmp_path):
    from tests.unit.test_review import RUN_ID, make_run

    run_dir = make_run(tmp_path / "runs")
    mirror, state = tmp_path / "mirror", {}
    reply, got = _pull_round(run_dir, mirror, state)
    tb_total = sum(p.stat().st_size for p in (run_dir / "tb").iterdir())
    assert got["tb_bytes"] == tb_total and not reply["more"]
    for p in (run_dir / "tb").iterdir():
        assert (mirror / RUN_ID / "tb" / p.name).read_bytes() == p.read_bytes()
    assert (mirror / RUN_ID / "config.yaml").read_bytes() == (run_dir / "config.yaml").read_bytes()
    _, again = _pull_round(run_dir, mirror, state)
    assert again["tb_bytes"] == 0 and again["other_bytes"] == 0  # nothing new: nothing moves
    newest = sorted((run_dir / "tb").iterdir())[-1]
    with open(newest, "ab") as handle:
        handle.write(b"appended!")
    _, third = _pull_round(run_dir, mirror, state)
    assert third["tb_bytes"] == len(b"appended!")
    assert (mirror / RUN_ID / "tb" / newest.name).read_bytes() == newest.read_bytes()


def test_a_small_budget_takes_several_rounds_and_a_replaced_file_starts_over(tmp_path):
    from tests.unit.test_review import RUN_ID, make_run

    run_dir = make_run(tmp_path / "runs")
    mirror, state, rounds = tmp_path / "mirror", {}, 0
    while True:
        reply, _ = _pull_round(run_dir, mirror, state, budget=1000)
        rounds += 1
        if not reply["more"]:
            break
    assert rounds > 2
    for p in (run_dir / "tb").iterdir():
        assert (mirror / RUN_ID / "tb" / p.name).read_bytes() == p.read_bytes()
    victim = sorted((run_dir / "tb").iterdir())[0]
    victim.unlink()
    victim.write_bytes(b"new file, new inode")
    _pull_round(run_dir, mirror, state)
    assert (mirror / RUN_ID / "tb" / victim.name).read_bytes() == b"new file, new inode"


def test_export_never_follows_links(tmp_path):
    from tests.unit.test_review import make_run

    run_dir = make_run(tmp_path / "runs")
    secret = tmp_path / "secret"
    secret.write_text("private")
    (run_dir / "tb" / "events.out.tfevents.1.link").symlink_to(secret)
    (run_dir / "run.json").symlink_to(secret)
    reply = tb_pull.export(run_dir, {})
    paths = [f["path"] for r in reply["runs"] for f in r["files"]]
    assert "tb/events.out.tfevents.1.link" not in paths and "run.json" not in paths
    assert any("symbolic link" in n for n in reply["notes"])


@pytest.mark.parametrize("run_id, rel", [("../x", "run.json"), ("ok", "../../.bashrc"), ("ok", "tb/../../x"),
                                         ("ok", "tb/notevents"), (".hidden", "run.json"), ("ok", "code/a.py")])
def test_apply_refuses_what_a_pull_never_writes(tmp_path, run_id, rel):
    reply = {"runs": [{"run_id": run_id, "files": [{"path": rel, "offset": 0, "size": 1, "data": "eA=="}]}]}
    with pytest.raises(ValueError):
        tb_pull.apply(tmp_path / "m", reply, {})
    assert not (tmp_path / "x").exists()


def test_drop_option():
    assert tb_pull.drop_option(["a", "--pull", "d", "--plot", "p.png", "--pull=e"], "--pull") == ["a", "--plot", "p.png"]


def test_review_remote_refuses_local_outputs_without_pull(capsys):
    from hpc_agent import review

    assert review.main(["runs", "--remote", "me@login", "--plot", "x.png"]) == 2
    assert "--pull" in capsys.readouterr().err
    assert review.main(["runs", "--pull", "m"]) == 2


# --- status ----------------------------------------------------------------------------------------------
def test_status_lines_for_a_reviewed_run(tmp_path):
    from tests.unit.test_review import RUN_ID, make_run

    make_run(tmp_path / "runs")

    class FakeCLI:
        def sacct(self, ids, fields=(), **kwargs):
            assert ids == ["1002"]  # one batched call with every run's newest job
            return "JobID|State\n1002|COMPLETED\n"

    (line,) = status.collect(tmp_path / "runs", cli=FakeCLI())
    assert (line["run_id"], line["phase"], line["job_id"], line["slurm_state"]) == (RUN_ID, "completed", "1002", "COMPLETED")
    assert (line["step"], line["max_steps"]) == (100, 100) and line["last_step_age_s"] > 0
    text = status.render([line])
    assert text.splitlines()[0].split()[:4] == ["run", "phase", "job", "state"]  # Slurm's, or a local process's
    assert RUN_ID in text and "100/100" in text and "ago" in text


def test_status_never_sends_a_local_runs_process_id_to_sacct(tmp_path):
    """A run on the local executor records its process id as its job id: status shows it, and asks sacct
    about the Slurm runs only (a pid is no Slurm job id, and may be another user's job)."""
    from hpc_agent.state.ledger import Ledger
    from tests.unit.test_review import RUN_ID, make_run

    make_run(tmp_path / "runs")
    local_dir = tmp_path / "runs" / "gpt-local"
    local_dir.mkdir()
    ledger = Ledger.in_runs_root(tmp_path / "runs")
    ledger.add_run("gpt-local", "gpt", str(local_dir))
    ledger.record_submitted(ledger.record_intent("gpt-local", "local", str(local_dir / "config.yaml"), "submit"), "4242")
    ledger.close()
    asked = []

    class FakeCLI:
        def sacct(self, ids, fields=(), **kwargs):
            asked.append(list(ids))
            return "JobID|State\n1002|COMPLETED\n"

    lines = {line["run_id"]: line for line in status.collect(tmp_path / "runs", cli=FakeCLI())}
    assert asked == [["1002"]]
    assert lines[RUN_ID]["slurm_state"] == "COMPLETED"
    # Its state from its process and files: process 4242 is not this run's (no command line names its folder),
    # and it left no result: it ended without success.
    assert "gpt-local" not in lines or (lines["gpt-local"]["job_id"], lines["gpt-local"]["slurm_state"]) == \
        ("4242", "FAILED (local)")


def test_status_cli_without_a_runs_root(tmp_path, capsys):
    assert status.main(["--runs-root", str(tmp_path / "none")]) == 2
    assert status.main(["--remote", "-bad"]) == 2


# --- the watcher's service files -------------------------------------------------------------------------
def test_systemd_unit_names_python_and_runs_root_absolutely(tmp_path):
    unit = service_files.systemd_unit("/shared/me/venv/bin/python", Path("/shared/me/runs"))
    assert "ExecStart=/shared/me/venv/bin/python -m hpc_agent.watch --runs-root /shared/me/runs\n" in unit
    odd = service_files.systemd_unit("/v/bin/python", Path("/a b/%h $x"))
    assert 'ExecStart=/v/bin/python -m hpc_agent.watch --runs-root "/a b/%%h $$x"' in odd
    with pytest.raises(service_files.ServiceError):
        service_files.systemd_unit("/v/bin/python", Path("/a\nb"))


def test_scrontab_lines_are_shell_quoted():
    text = service_files.scrontab_lines("/v/bin/python", Path("/it's runs"))
    assert text.startswith("#SCRON ") and shlex.split(text.splitlines()[1])[1:] == [
        "/v/bin/python", "-m", "hpc_agent.watch", "--runs-root", "/it's runs", "--max-ticks", "700"]
    with pytest.raises(service_files.ServiceError):
        service_files.scrontab_lines("/v/bin/python", Path("/50%"))


def test_watch_install_systemd_writes_the_unit_and_prints_the_command(tmp_path, monkeypatch, capsys):
    from hpc_agent import watch

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert watch.main(["--install-systemd", "--runs-root", str(tmp_path / "runs")]) == 0
    unit = (tmp_path / "cfg" / "systemd" / "user" / service_files.UNIT_NAME).read_text()
    assert f"--runs-root {tmp_path / 'runs'}" in unit and sys.executable in unit
    assert "systemctl --user enable --now hpc-agent-watch.service" in capsys.readouterr().out
    assert watch.main(["--print-scrontab", "--runs-root", str(tmp_path / "runs")]) == 0
    assert "@hourly" in capsys.readouterr().out
