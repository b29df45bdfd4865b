"""Delivering notifications (the I/O half; which ones and what they say: ``hpc_agent/watcher/notify_events.py``).

Each tick the watcher calls :meth:`Notifier.tick`: the audit records since the ledger's notify cursor are
turned into notifications; those the run's ``notify:`` section (else the watcher's runs-root default) asks
for are written to the ``notifications`` table together with the new cursor, in one transaction, and only
then sent. So a watcher killed at any point never sends one twice (at most once: one killed *while*
sending is not sent again, and says so at start-up).

A notifier's failure (a command exiting non-zero, a closed port, a timeout) never stops the watcher: it is
said in the watcher's log and recorded in the run's audit trail (``action: notification``), and the watcher
carries on. Webhook URLs are secrets: only :func:`redact_url`'s scheme and host are ever written out.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Sequence

from hpc_agent.config.notify import NotifyConfig
from hpc_agent.core.redact import redact_url
from hpc_agent.state import run_config
from hpc_agent.watcher.notify_events import Notification, notifications_for, paused_notification, wants_budget

OUTPUT_TAIL = 300   # characters of a failed command's stderr kept in the log and audit
BATCH = 1000        # audit records read per tick: a backlog is worked off over several ticks
RESPONSE_BYTES = 64 * 1024  # of a webhook's answer body read (and dropped): the status line is what counts
KILL_WAIT_S = 1.0   # after the deadline: how long a killed command or an aborted request may take to go away


class NotifyFailed(Exception):
    """A channel did not take the notification; the message is safe to log (no secret in it)."""


def send_command(argv: Sequence[str], payload: Dict[str, Any], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> str:
    """Run ``argv`` (no shell) with the payload as JSON on stdin; raises NotifyFailed unless it exits 0 within
    ``timeout_s`` in all. The command runs in a session of its own: at the deadline the whole group is killed,
    and a grandchild that kept the pipes open cannot hold the watcher (``subprocess.run`` would wait for it)."""
    deadline = clock() + timeout_s
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise NotifyFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
    try:
        _, stderr = proc.communicate(json.dumps(payload, default=str).encode(), timeout=max(deadline - clock(), 0))
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        raise NotifyFailed(f"{argv[0]} did not finish within {timeout_s:g} s (killed)") from exc
    except BaseException:
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        tail = stderr.decode(errors="replace").strip()[-OUTPUT_TAIL:]
        raise NotifyFailed(f"{argv[0]} exited with status {proc.returncode}" + (f": {tail}" if tail else ""))
    return "sent"


def _kill_group(proc: "subprocess.Popen[bytes]") -> None:
    """SIGKILL the command's session, then reap it without waiting on pipes a grandchild may still hold."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # unkillable (D state): left to the kernel, the watcher goes on
        pass


class _Exchange:
    """One POST over http.client, in a worker thread, so the caller can stop waiting at the deadline: a socket
    timeout bounds each read, not the request, and an endpoint that drips a byte per read never trips it.
    :meth:`abort` shuts the socket down, which ends a blocked read at once."""

    def __init__(self, url: str, body: bytes):
        self.url, self.body = url, body
        self.conn: Any = None
        self.status: Optional[int] = None
        self.reason = ""
        self.error: Optional[BaseException] = None
        self.aborted = False
        self.lock = threading.Lock()

    def run(self, deadline: float, clock: Callable[[], float]) -> None:
        import http.client  # here: it imports ssl, which watch --pause need not load
        import urllib.parse

        try:
            parts = urllib.parse.urlsplit(self.url)
            cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
            conn = cls(parts.hostname or "", parts.port, timeout=max(deadline - clock(), 0.001))
            with self.lock:
                if self.aborted:
                    return
                self.conn = conn
            conn.connect()  # the name lookup and the connection; the caller may have stopped waiting meanwhile
            if self.aborted or clock() >= deadline:
                raise TimeoutError("the deadline passed while connecting")
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.sock.settimeout(max(deadline - clock(), 0.001))
            conn.request("POST", target, body=self.body,
                         headers={"Content-Type": "application/json", "User-Agent": "hpc_agent"})
            response = conn.getresponse()
            left = RESPONSE_BYTES
            while left > 0 and clock() < deadline:  # read (and drop) a bounded body, never past the deadline
                if conn.sock is not None:
                    conn.sock.settimeout(max(deadline - clock(), 0.001))
                chunk = response.read1(min(left, 8192)) if hasattr(response, "read1") else response.read(left)
                if not chunk:
                    break
                left -= len(chunk)
            self.status, self.reason = response.status, response.reason
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, which turns it into NotifyFailed
            self.error = exc
        finally:
            self.close()

    def abort(self) -> None:
        with self.lock:
            self.aborted = True
            conn = self.conn
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self.lock:
            conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass


def send_webhook(url: str, payload: Dict[str, Any], timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> str:
    """POST the payload as JSON; raises NotifyFailed (URL-free message) unless the answer is 2xx. ``timeout_s``
    is the whole exchange's deadline (name lookup, connect, send, the answer and its body), kept on a
    monotonic clock: at the deadline the socket is shut down and the watcher goes on, whatever the endpoint
    does. Redirects are not followed (a webhook that redirects is misconfigured: following it would re-send
    the body elsewhere), so a 3xx answer is a failure."""
    shown = redact_url(url)
    deadline = clock() + timeout_s
    exchange = _Exchange(url, json.dumps(payload, default=str).encode())
    worker = threading.Thread(target=exchange.run, args=(deadline, clock), name="hpc_agent-webhook", daemon=True)
    worker.start()
    worker.join(max(deadline - clock(), 0))
    if worker.is_alive():
        exchange.abort()  # the worker's blocked call ends now; a name lookup ends on its own (daemon thread)
        worker.join(KILL_WAIT_S)
        raise NotifyFailed(f"{shown}: no complete answer within {timeout_s:g} s (timeout: the deadline for the "
                           "whole request; stopped)")
    if exchange.error is not None:
        exc = exchange.error
        if isinstance(exc, (TimeoutError, socket.timeout)) or clock() >= deadline:
            raise NotifyFailed(f"{shown}: no complete answer within {timeout_s:g} s (timeout: the deadline for "
                               "the whole request)") from exc
        if isinstance(exc, (ConnectionError, OSError)):
            raise NotifyFailed(f"{shown} unreachable: {_scrub(str(exc) or type(exc).__name__, url)}") from exc
        raise NotifyFailed(f"{shown}: {type(exc).__name__}: {_scrub(str(exc), url)[:OUTPUT_TAIL]}") from exc
    if exchange.status is None:
        raise NotifyFailed(f"{shown}: no answer within {timeout_s:g} s (timeout)")
    if not 200 <= exchange.status < 300:
        raise NotifyFailed(f"{shown} answered HTTP {exchange.status} {_scrub(exchange.reason, url)[:80]}")
    return f"sent (HTTP {exchange.status})"


def _scrub(text: str, url: str) -> str:
    return text.replace(url, redact_url(url))


def deliver(notification: Notification, settings: NotifyConfig) -> Dict[str, str]:
    """Send to every channel of ``settings``; channel -> result ("failed: ..." for a failure). Never raises:
    a notifier is not worth a watcher."""
    payload, results = notification.payload(), {}
    for channel in settings.channels():
        try:
            if channel == "command":
                results[channel] = send_command(settings.command or [], payload, settings.timeout_s)
            else:
                results[channel] = send_webhook(str(settings.webhook_url), payload, settings.timeout_s)
        except NotifyFailed as exc:
            results[channel] = f"failed: {exc}"
        except Exception as exc:  # noqa: BLE001 - a bug or an odd error in a channel must not stop the watcher
            text = str(exc)
            if settings.webhook_url:
                text = _scrub(text, str(settings.webhook_url))
            results[channel] = f"failed: {type(exc).__name__}: {text[:OUTPUT_TAIL]}"
    return results


class Notifier:
    """Derives notifications from the audit trail and sends each once (see the module docstring)."""

    def __init__(self, ledger, journal, say: Callable[[str, str], None], default: Optional[NotifyConfig] = None,
                 limits: Any = None, send: Callable[[Notification, NotifyConfig], Dict[str, str]] = deliver):
        self.ledger, self.journal, self.say, self.default, self.limits, self.send = (
            ledger, journal, say, default, limits, send)
        self._started = False

    # --- the cursor and the record of what was sent ---------------------------------------------------
    def _cursor(self) -> int:
        row = self.ledger.db.execute("SELECT seq FROM notify_cursor WHERE one = 1").fetchone()
        if row is not None:
            return int(row[0])
        # A ledger from before notifications: start at its end rather than announce its whole history.
        with self.ledger.transaction():
            top = self.ledger.db.execute("SELECT COALESCE(MAX(seq), 0) FROM audit").fetchone()[0]
            self.ledger.db.execute("INSERT OR IGNORE INTO notify_cursor(one, seq) VALUES (1, ?)", (top,))
        return int(self.ledger.db.execute("SELECT seq FROM notify_cursor WHERE one = 1").fetchone()[0])

    def start(self) -> None:
        """Once per watcher, before its first decision: the cursor (a new one starts at the audit trail's end),
        and which notifications a killed watcher may not have sent (never sent again)."""
        self._started = True
        self._cursor()
        for key, run_id, event in self.ledger.db.execute(
                "SELECT key, run_id, event FROM notifications WHERE status = 'sending'").fetchall():
            self.say(run_id or "watcher", f"notification {event} #{key} may not have been sent (a watcher stopped "
                                          "while sending it); not sent again")
            self.ledger.db.execute("UPDATE notifications SET status = 'unknown' WHERE key = ?", (key,))

    # --- each tick ------------------------------------------------------------------------------------
    def tick(self) -> int:
        """Send what the audit records since the cursor call for; returns how many notifications went out
        (each sent, or failed and recorded as such)."""
        if not self._started:
            self.start()
        cursor = self._cursor()
        rows = self.ledger.db.execute("SELECT seq, run_id, record FROM audit WHERE seq > ? ORDER BY seq LIMIT ?",
                                      (cursor, BATCH)).fetchall()
        if not rows:
            return 0
        todo, settings = [], {}
        for seq, run_id, text in rows:
            try:
                record = json.loads(text)
            except ValueError:
                continue
            # A cheap first look with the worst budget: only a record that may notify costs a config read.
            if not notifications_for(seq, run_id, record, (0, "") if wants_budget(record) else None):
                continue
            try:
                todo += self._wanted(seq, run_id, record, settings)
            except Exception as exc:  # noqa: BLE001 - one odd record must not hold back every later notification
                self.say(run_id, f"no notification for audit record #{seq} ({type(exc).__name__}: {exc})")
        with self.ledger.transaction():  # the intent to send, with the cursor: a restart never sends these again
            todo = [(n, s) for n, s in todo if self._claim(n)]
            self.ledger.db.execute("UPDATE notify_cursor SET seq = ? WHERE one = 1", (rows[-1][0],))
        for notification, notify in todo:
            self._deliver(notification, notify)
        return len(todo)

    def _wanted(self, seq: int, run_id: str, record: Dict[str, Any], settings: Dict[str, Any]):
        if run_id not in settings:  # one config read per run and tick
            settings[run_id] = self._settings(run_id)
        notify, cfg = settings[run_id]
        if notify is None:
            return []
        budget = self._budget(run_id, record, cfg) if wants_budget(record) else None
        return [(n, notify) for n in notifications_for(seq, run_id, record, budget) if n.event in notify.events]

    def paused(self, pause_file: Path) -> None:
        """The kill switch is set: tell the runs-root default notifier, once per pause file."""
        if self.default is None or "attention" not in self.default.events or not self.default.channels():
            return
        try:
            st = os.stat(pause_file)
        except OSError:
            return
        notification = paused_notification(f"{st.st_ino}:{st.st_mtime_ns}", str(pause_file))
        with self.ledger.transaction():
            claimed = self._claim(notification)
        if claimed:
            self._deliver(notification, self.default)

    def _claim(self, n: Notification) -> bool:
        cur = self.ledger.db.execute("INSERT OR IGNORE INTO notifications(key, run_id, event, at) VALUES (?, ?, ?, ?)",
                                     (n.key, n.run_id, n.event, self.ledger.clock()))
        return cur.rowcount == 1

    def _settings(self, run_id: str):
        """(the notify settings for this run, its config or None): the run's own section when it names a
        channel (the run's config wins), else the runs-root default; None when neither has a channel. The run's
        config is the one its owner submitted, as the ledger keeps it (hpc_agent/state/run_config.py): a
        command or URL written into the run directory is never run or sent to."""
        cfg = None
        run = self.ledger.run(run_id)
        if run is not None:
            try:
                cfg = run_config.current(self.ledger, run_id, run.run_dir)
            except Exception:  # noqa: BLE001 - an unreadable config (often why a run needs attention): use the default
                cfg = None
        own = getattr(cfg, "notify", None)
        if own is not None and own.channels():
            return own, cfg
        if self.default is not None and self.default.channels():
            return self.default, cfg
        return None, cfg

    def _budget(self, run_id: str, record: Dict[str, Any], cfg: Any):
        if cfg is None:
            return None
        from hpc_agent.watcher.follow import history_from
        from hpc_agent.policy.decide import PolicyLimits, retries_left

        history = history_from(self.ledger.decisions(run_id))
        return retries_left(str(record.get("cause", "")), history, cfg, self.limits or PolicyLimits())

    def _deliver(self, n: Notification, notify: NotifyConfig) -> None:
        results = self.send(n, notify)
        failed = {k: v for k, v in results.items() if v.startswith("failed")}
        status = "failed" if failed else "sent"
        self.ledger.db.execute("UPDATE notifications SET status = ?, result = ? WHERE key = ?",
                               (status, json.dumps(results, sort_keys=True), n.key))
        where = {"command": (notify.command or [""])[0], "webhook": redact_url(notify.webhook_url)}
        said = "; ".join(f"{channel} {where[channel]}: {result}" for channel, result in results.items())
        kind = n.fields.get("kind", n.event)
        self.say(n.run_id or "watcher", f"notification {n.event} ({kind}) {'FAILED' if failed else 'sent'}: {said}")
        if n.run_id:
            record = {"action": "notification", "event": n.event, "kind": kind, "key": n.key, "status": status,
                      "results": results, "job_id": n.fields.get("job_id", ""),
                      "channels": {c: where[c] for c in results}}
            self.journal.add_audit(n.run_id, record)


# --- the runs-root default: ``watch --notify-webhook URL --notify-command 'ARGV'`` ---------------------
WEBHOOK_ENV, COMMAND_ENV = "HPC_AGENT_NOTIFY_WEBHOOK", "HPC_AGENT_NOTIFY_COMMAND"


def add_arguments(parser: Any) -> None:
    parser.add_argument("--notify-webhook", metavar="URL", default=os.environ.get(WEBHOOK_ENV),
                        help="default webhook for runs whose config has no notify: channel (default "
                             f"${WEBHOOK_ENV}; prefer the variable: a URL on the command line shows in ps)")
    parser.add_argument("--notify-command", metavar="ARGV", default=os.environ.get(COMMAND_ENV),
                        help="default notify command, split like a shell line but never run by one; the event "
                             f"arrives as JSON on stdin (default ${COMMAND_ENV})")


def default_from_args(args: Any) -> Optional[NotifyConfig]:
    """The runs-root default from the flags (or their variables); None without either. Raises ConfigError."""
    import shlex

    from hpc_agent.config.problems import ConfigError, Problem

    webhook, command = getattr(args, "notify_webhook", None), getattr(args, "notify_command", None)
    if not webhook and not command:
        return None
    try:
        argv = shlex.split(command) if command else None
    except ValueError as exc:
        raise ConfigError([Problem("--notify-command", command, f"a command line with balanced quotes ({exc})")])
    return NotifyConfig(command=argv, webhook_url=webhook or None)


def default_from_env(environ: Any = None) -> Optional[NotifyConfig]:
    """The runs-root default from ``$HPC_AGENT_NOTIFY_WEBHOOK`` / ``$HPC_AGENT_NOTIFY_COMMAND`` alone: what an
    embedded watcher (submit --wait, sweep) uses, as ``watch`` does without flags. Raises ConfigError."""
    from types import SimpleNamespace

    environ = os.environ if environ is None else environ
    return default_from_args(SimpleNamespace(notify_webhook=environ.get(WEBHOOK_ENV),
                                             notify_command=environ.get(COMMAND_ENV)))

