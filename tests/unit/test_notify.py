"""Issue 19 part 6, notifications: which events notify (a table), the notify: section's checks, the delivery
adapter against a local HTTP server and a command, failures that are logged and survived, no resend after a
restart, and the watcher end to end against the fake Slurm."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hpc_agent.config.load import build_config, write_run_config
from hpc_agent.config.notify import NotifyConfig, sbatch_options
from hpc_agent.config.problems import ConfigError
from hpc_agent.core.redact import redact_url
from hpc_agent.policy.decide import PastAttempt, retries_left
from hpc_agent.state import run_config
from hpc_agent.state.journal import Journal
from hpc_agent.state.ledger import Ledger
from hpc_agent.watcher.notifier import Notifier, NotifyFailed, deliver, send_command, send_webhook
from hpc_agent.watcher.notify_events import Notification, notifications_for, paused_notification
from tests.helpers.webhook import Receiver, closed_port_url
from tests.unit.test_watcher import CODE_LOG, add_run, world  # noqa: F401 - the fake-Slurm watcher fixture

STOP = {"job_id": "7", "attempt": 1, "cause": "code_error", "decision": {"action": "stop", "reason": "code error: fix it"}}


# --- which records notify ---------------------------------------------------------------------------------
@pytest.mark.parametrize("record, budget, expected", [
    ({"job_id": "7", "cause": "completed", "action": "done", "reason": "completed"}, None, [("completed", "completed")]),
    (STOP, None, [("gave_up", "gave_up")]),
    ({**STOP, "cause": "hung", "decision": {"action": "stop", "reason": "hangs at step 5 twice"}}, None,
     [("gave_up", "gave_up")]),
    ({"job_id": "7", "action": "needs_attention", "reason": "config.yaml is a FIFO"}, None,
     [("attention", "needs_attention")]),
    ({"job_id": "7", "action": "hang_suspected", "cause": "hung", "verdict": {"reason": "no step for 130 s"}}, None,
     [("attention", "hang")]),
    ({"job_id": "7", "cause": "gpu_oom", "decision": {"action": "resubmit", "free": False}}, (1, "gpu_oom retries"),
     [("attention", "budget")]),
    ({"job_id": "7", "cause": "gpu_oom", "decision": {"action": "resubmit", "free": False}}, (0, "overall"),
     [("attention", "budget")]),
    ({"job_id": "7", "cause": "gpu_oom", "decision": {"action": "resubmit", "free": False}}, (3, "gpu_oom"), []),
    ({"job_id": "7", "cause": "preempted", "decision": {"action": "requeue", "free": True}}, (0, "overall"), []),
    ({"job_id": "7", "cause": "timeout", "decision": {"action": "requeue"}}, None, []),
    ({"job_id": "7", "action": "expedite", "cause": "preempted"}, None, []),
    ({"job_id": "7", "action": "resubmit", "by": {"process": "watcher"}, "decision": {"action": "stop"}}, None, []),
    ({"job_id": "7", "action": "notification", "event": "gave_up"}, None, []),
    ({"job_id": "7", "action": "hang_cleared", "cause": "hung"}, None, []),
    ({"job_id": "7", "cause": "gpu_oom", "decided_in": "job", "decision": {"action": "resubmit"}}, (0, "x"), []),
])
def test_which_audit_records_notify(record, budget, expected):
    found = notifications_for(12, "run-a", record, budget)
    assert [(n.event, n.fields["kind"]) for n in found] == expected
    for n in found:
        payload = n.payload()
        assert payload["run_id"] == "run-a" and payload["key"] == "12" and payload["text"].startswith("hpc_agent:")
        assert payload["job_id"] == "7" and "reason" in payload


def test_gave_up_payload_names_the_cause_and_reason():
    (n,) = notifications_for(3, "run-a", STOP)
    assert n.payload() == {"text": "hpc_agent: gave up on run run-a (job 7, code_error): code error: fix it",
                           "event": "gave_up", "run_id": "run-a", "key": "3", "job_id": "7", "cause": "code_error",
                           "attempt": 1, "kind": "gave_up", "reason": "code error: fix it"}


def test_retries_left_is_the_tighter_budget():
    cfg = build_config([{"watch": {"max_retries": 3}}])
    oom = [PastAttempt("1", "gpu_oom", "resubmit")] * 2
    assert retries_left("gpu_oom", oom, cfg) == (1, "overall retries (2 of watch.max_retries=3 used)")
    assert retries_left("gpu_oom", [], build_config([]))[0] == 8
    preempted = [PastAttempt("1", "preempted", "requeue")] * 5
    assert retries_left("preempted", preempted, cfg) is None  # preemptions are free and unlimited


# --- the notify: section ------------------------------------------------------------------------------------
@pytest.mark.parametrize("section, key, words", [
    ({"webhook_url": "ftp://hooks.example/SECRET"}, "notify.webhook_url", "http:// or https://"),
    ({"webhook_url": "file:///etc/passwd"}, "notify.webhook_url", "http:// or https://"),
    ({"webhook_url": "https:///no-host"}, "notify.webhook_url", "with a host"),
    ({"webhook_url": "https://h.example/a b"}, "notify.webhook_url", "without spaces"),
    ({"command": []}, "notify.command", "argv list"),
    ({"command": ["notify", ""]}, "notify.command", "argv list"),
    ({"events": ["completed", "failed"]}, "notify.events", "completed, gave_up, attention"),
    ({"mail_type": "END,SOMETIMES"}, "notify.mail_type", "Slurm mail types"),
    ({"mail_type": "END;rm"}, "notify.mail_type", "mail types"),
    ({"mail_user": "ana@example.org"}, "notify.mail_user", "notify.mail_type too"),
    ({"timeout_s": 0}, "notify.timeout_s", "more than 0"),
])
def test_bad_notify_settings_name_the_fix(section, key, words):
    with pytest.raises(ConfigError) as exc:
        build_config([{"notify": section}])
    text = str(exc.value)
    assert key in text and words in text, text
    assert "SECRET" not in text  # a webhook URL is never shown whole


def test_mail_is_set_in_one_place_and_reaches_sbatch(tmp_path):
    from hpc_agent.jobs.executor import Template, slurm_parameters

    with pytest.raises(ConfigError, match="mail in one place"):
        build_config([{"notify": {"mail_type": "END"}, "slurm": {"extra_sbatch": {"mail-type": "FAIL"}}}])
    cfg = build_config([{"notify": {"mail_type": "end,fail", "mail_user": "ana@example.org"}}])
    assert sbatch_options(cfg.notify) == {"mail-type": "END,FAIL", "mail-user": "ana@example.org"}
    params = slurm_parameters(cfg, "r-1", tmp_path / "r-1", tmp_path / "r-1" / "config.yaml", Template([], []))
    assert params["additional_parameters"]["mail-type"] == "END,FAIL"
    assert params["additional_parameters"]["mail-user"] == "ana@example.org"


def test_webhook_urls_are_redacted():
    assert redact_url("https://hooks.slack.com/services/T0/B0/SECRET") == "https://hooks.slack.com/..."
    assert redact_url("http://user:pw@127.0.0.1:8080/x?token=SECRET") == "http://127.0.0.1:8080/..."
    assert "SECRET" not in repr(NotifyConfig(webhook_url="https://h.example/SECRET"))


# --- delivery -------------------------------------------------------------------------------------------------
NOTE = Notification("5", "gave_up", "run-a", "hpc_agent: gave up on run run-a", {"kind": "gave_up", "cause": "code_error"})


def test_webhook_receives_slack_compatible_json():
    with Receiver() as server:
        assert send_webhook(server.url, NOTE.payload(), 5) == "sent (HTTP 200)"
    (body,) = server.received
    assert body["text"] == NOTE.text and body["event"] == "gave_up" and body["run_id"] == "run-a"
    assert body["cause"] == "code_error"


def test_command_gets_the_event_as_json_on_stdin(tmp_path):
    out = tmp_path / "event.json"
    argv = [sys.executable, "-c", f"import sys; open({str(out)!r}, 'w').write(sys.stdin.read())"]
    assert send_command(argv, NOTE.payload(), 10) == "sent"
    assert json.loads(out.read_text())["text"] == NOTE.text


@pytest.mark.parametrize("settings, words", [
    ({"command": ["sh", "-c", "echo boom >&2; exit 1"]}, "exited with status 1: boom"),
    ({"command": ["/nonexistent/notifier"]}, "cannot run /nonexistent/notifier"),
    ({"command": ["sleep", "30"], "timeout_s": 0.5}, "did not finish within 0.5 s"),
    ({"webhook_url": closed_port_url()}, "unreachable"),
])
def test_a_failing_channel_is_reported_never_raised(settings, words):
    started = time.monotonic()
    results = deliver(NOTE, NotifyConfig(**settings))
    (result,) = results.values()
    assert result.startswith("failed") and words in result, result
    assert "SECRET" not in result
    assert time.monotonic() - started < 10


def test_a_slow_or_refusing_webhook_fails_within_its_timeout():
    with Receiver(delay_s=3) as slow:
        started = time.monotonic()
        with pytest.raises(NotifyFailed, match="timed out|timeout"):
            send_webhook(slow.url, NOTE.payload(), 0.5)
        assert time.monotonic() - started < 2.5
    with Receiver(status=500) as refusing:
        with pytest.raises(NotifyFailed, match="HTTP 500"):
            send_webhook(refusing.url, NOTE.payload(), 5)


# --- the notifier: once per event, across restarts, failures audited --------------------------------------------
def _run_with_notify(tmp_path: Path, ledger: Ledger, run_id: str, **notify) -> Path:
    run_dir = tmp_path / run_id
    run_dir.mkdir(parents=True)
    write_run_config(run_dir, build_config([{"notify": notify}]))
    ledger.add_run(run_id, "t", str(run_dir))
    return run_dir


def test_each_event_is_sent_once_even_after_a_restart_and_failures_are_audited(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    journal, said = Journal(ledger), []
    with Receiver() as server:
        _run_with_notify(tmp_path, ledger, "r", webhook_url=server.url, command=["sh", "-c", "exit 1"])
        journal.add_audit("r", {"action": "submit", "job_id": "7", "by": {"process": "submit"}})  # history
        notifier = Notifier(ledger, journal, lambda run, text: said.append((run, text)))
        notifier.start()
        journal.add_audit("r", STOP)
        assert notifier.tick() == 1
        assert [b["event"] for b in server.received] == ["gave_up"]
        restarted = Notifier(ledger, journal, lambda run, text: said.append((run, text)))
        assert restarted.tick() == 0 and len(server.received) == 1
    (record,) = [r for _, _, r in journal.audit_records("r") if r.get("action") == "notification"]
    assert record["status"] == "failed" and record["results"]["webhook"] == "sent (HTTP 200)"
    assert record["results"]["command"].startswith("failed: sh exited with status 1")
    assert record["channels"]["webhook"].endswith("/...")
    assert any("FAILED" in text and "command sh" in text for _, text in said)
    assert "SECRET" not in json.dumps(journal.audit_records("r")) + repr(said)


def test_a_notification_interrupted_mid_send_is_not_sent_again(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    journal, sent, said = Journal(ledger), [], []
    _run_with_notify(tmp_path, ledger, "r", command=["true"])
    Notifier(ledger, journal, lambda *a: None).start()
    journal.add_audit("r", STOP)

    def killed(notification, settings):  # the watcher dies while sending
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Notifier(ledger, journal, lambda *a: None, send=killed).tick()
    again = Notifier(ledger, journal, lambda run, text: said.append(text), send=lambda n, s: sent.append(n) or {})
    assert again.tick() == 0 and sent == []
    assert any("may not have been sent" in text for text in said)


def test_the_run_config_wins_over_the_runs_root_default_and_an_unreadable_run_uses_the_default(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    journal, sent = Journal(ledger), []
    _run_with_notify(tmp_path, ledger, "own", command=["own-notifier"], events=["completed"])
    broken = _run_with_notify(tmp_path, ledger, "broken")
    (broken / "config.yaml").write_text("train: [")
    default = NotifyConfig(command=["root-notifier"])
    notifier = Notifier(ledger, journal, lambda *a: None, default, send=lambda n, s: sent.append((n, s)) or {})
    notifier.start()
    journal.add_audit("own", STOP)  # gave_up: not among this run's events
    journal.add_audit("own", {"job_id": "8", "cause": "completed", "action": "done", "reason": "completed"})
    journal.add_audit("broken", {"job_id": "9", "action": "needs_attention", "reason": "config.yaml is invalid"})
    notifier.tick()
    assert [(n.run_id, n.event, s.command) for n, s in sent] == [
        ("own", "completed", ["own-notifier"]), ("broken", "attention", ["root-notifier"])]


def test_the_kill_switch_is_announced_once_per_pause(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    sent = []
    notifier = Notifier(ledger, Journal(ledger), lambda *a: None, NotifyConfig(command=["x"]),
                        send=lambda n, s: sent.append(n) or {})
    pause = tmp_path / "watch.paused"
    pause.write_text("")
    notifier.paused(pause)
    notifier.paused(pause)
    assert [n.fields["kind"] for n in sent] == ["paused"] and sent[0].key.startswith("paused:")
    pause.unlink()
    pause.write_text("")  # paused again later: a new pause, announced again
    notifier.paused(pause)
    assert len(sent) == 2 and paused_notification("1:2", str(pause)).event == "attention"


def test_the_watcher_announces_the_kill_switch(world):  # noqa: F811
    sent = []
    world["watcher"].notifier.default = NotifyConfig(command=["x"])
    world["watcher"].notifier.send = lambda n, s: sent.append(n) or {}
    world["watcher"].pause_file.write_text("paused")
    assert world["watcher"].tick().paused and world["watcher"].tick().paused
    assert [n.fields["kind"] for n in sent] == ["paused"]


def test_watch_refuses_a_bad_default_notifier_without_showing_the_url(tmp_path, capsys):
    from hpc_agent.watch import main

    assert main(["--runs-root", str(tmp_path), "--once", "--notify-webhook", "ftp://hooks.example/SECRET"]) == 2
    err = capsys.readouterr().err
    assert "notify.webhook_url" in err and "SECRET" not in err


# --- the watcher, end to end against the fake Slurm ------------------------------------------------------------
def test_the_watcher_notifies_a_run_it_gives_up_on_and_survives_a_failing_notifier(world):  # noqa: F811
    run_dir, job = add_run(world, "r", log=CODE_LOG)
    with Receiver() as server:
        cfg = build_config([{"run": {"name": "t"}, "notify": {"webhook_url": server.url,
                                                                "command": ["sh", "-c", "exit 1"]}}])
        run_config.record(world["ledger"], "r", cfg, "submitted (submit)")  # the owner's config, as submit keeps it
        world["slurm"].fail(job, 1)
        world["watcher"].tick()
        world["watcher"].tick()
    assert world["ledger"].run("r").phase == "stopped"
    (body,) = server.received
    assert body["event"] == "gave_up" and body["run_id"] == "r" and body["cause"] == "code_error"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    (note,) = [e for e in events if e.get("action") == "notification"]
    assert note["results"]["command"].startswith("failed")
    assert any("notification gave_up (gave_up) FAILED" in line for line in world["out"])


def test_a_nearly_spent_budget_asks_for_attention(tmp_path):
    ledger = Ledger(tmp_path / "ledger.sqlite")
    journal, sent = Journal(ledger), []
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    write_run_config(run_dir, build_config([{"watch": {"max_retries": 3}, "notify": {"command": ["x"]}}]))
    ledger.add_run("r", "t", str(run_dir))
    notifier = Notifier(ledger, journal, lambda *a: None, send=lambda n, s: sent.append(n) or {})
    notifier.start()
    for attempt in range(2):
        decision = {"action": "resubmit", "cause": "host_oom", "reason": "more memory", "free": False}
        ledger.record_decision("r", "7", attempt, "host_oom", "resubmit", "more memory", {}, [], None, decision)
        journal.add_audit("r", {"job_id": "7", "attempt": attempt + 1, "cause": "host_oom", "decision": decision})
        notifier.tick()
    (note,) = sent  # after the second of 3 retries: one left
    assert note.fields["kind"] == "budget" and note.fields["retries_left"] == 1
    assert "host_oom retries (2 of 3 used)" in note.text or "2 of watch.max_retries=3" in note.text
