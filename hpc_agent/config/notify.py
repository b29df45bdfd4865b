"""The ``notify:`` section: who hears about a run that completed, gave up or needs attention.

Three channels, any together: a command (an argv list, never a shell, given the event as JSON on stdin), a
webhook (a Slack-compatible JSON POST) and Slurm's own mail (``--mail-type``/``--mail-user``, produced here
in one place for ``hpc_agent/jobs/executor.py``). The watcher sends each event once (``hpc_agent/watcher/notifier.py``).

A webhook URL usually carries its token in the path or query, so it is a secret: problems and logs show
:func:`hpc_agent.core.redact.redact_url`'s form only (scheme and host), never the whole URL.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hpc_agent.config.checks import raise_if
from hpc_agent.config.fields import MAIL_TYPE, MAIL_USER
from hpc_agent.config.problems import Problem
from hpc_agent.core.redact import redact_url

EVENTS = ("completed", "gave_up", "attention")
# sbatch's --mail-type values (Slurm 22.05-24.x); a typo would otherwise only show at sbatch.
MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
              "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")
MAX_URL = 2048
MAX_TIMEOUT_S = 300.0  # the watcher waits for a notifier inside its tick: minutes would stall every run


def url_problem(url: str) -> Optional[str]:
    """None for an http(s) URL with a host and nothing a reader could see two ways; else what to change."""
    text = str(url)
    if len(text) > MAX_URL:
        return f"a URL of at most {MAX_URL} characters (it has {len(text)})"
    if any(ch.isspace() or not ch.isprintable() for ch in text):
        return "a URL without spaces or control characters (percent-encode them)"
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        return f"a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return (f"an http:// or https:// URL (the scheme is {parts.scheme or 'missing'!r}; file:, ftp: and others "
                "are refused so a config cannot make the watcher read files)")
    if not parts.hostname:
        return "a URL with a host, e.g. https://hooks.slack.com/services/..."
    return None


@dataclass
class NotifyConfig:
    """Notifications when a run completes, gives up or needs attention (docs/notifications.md)."""

    events: List[str] = field(default_factory=lambda: list(EVENTS))
    """Which events reach ``command`` and ``webhook_url``: ``completed``, ``gave_up`` (the watcher stopped
    the run: code error, budget spent, same hang twice...) and ``attention`` (a run parked in
    needs_attention, a hang detected, a retry budget nearly spent, the kill switch set)."""

    command: Optional[List[str]] = None
    """A program to run for each event, as an argv list (``[notify-send, hpc_agent]``, never through a shell);
    it gets the event as one JSON object on stdin and must finish within ``timeout_s``. null: none."""

    webhook_url: Optional[str] = field(default=None, repr=False)  # a secret: kept out of reprs and logs
    """An http(s) URL that receives each event as a Slack-compatible JSON POST (``{"text": ..., "event": ...,
    "run_id": ...}``), e.g. a Slack or Mattermost incoming webhook. It usually holds a token: logs and the
    audit trail show only its scheme and host, and the run's config.yaml that keeps it is private (0600).
    null: none."""

    mail_type: Optional[str] = None
    """Slurm's own mail: ``--mail-type`` for every job of the run, e.g. ``END,FAIL`` (Slurm mails per job,
    so a requeue or resubmission mails too). null: no mail."""

    mail_user: Optional[str] = None
    """``--mail-user``: who gets Slurm's mail (null: the submitting user). Needs ``mail_type``."""

    timeout_s: float = 10.0
    """Seconds the command or the webhook may take in all, per channel: one deadline for the whole request
    (connect, send, answer), however slowly the endpoint answers; a slower one is stopped and logged as failed."""

    def channels(self) -> List[str]:
        """The channels the watcher drives itself (Slurm's mail goes through the job)."""
        return [name for name, on in (("command", self.command), ("webhook", self.webhook_url)) if on]

    def problems(self) -> List[Problem]:
        problems: List[Problem] = []
        events = self.events if isinstance(self.events, list) else []
        for event in events:
            if event not in EVENTS:
                problems.append(Problem("notify.events", event, "a list of " + ", ".join(EVENTS)))
        if self.command is not None and (not self.command or not all(str(w).strip() for w in self.command)):
            problems.append(Problem("notify.command", self.command, "an argv list whose words are not empty, e.g. "
                                    "[/usr/local/bin/page-me, --quiet] (or null: no command)"))
        if self.webhook_url is not None and (why := url_problem(self.webhook_url)):
            # Never the URL itself in the message: it may carry the hook's token.
            problems.append(Problem("notify.webhook_url", redact_url(self.webhook_url), why))
        if self.mail_type is not None:
            why = MAIL_TYPE.problem(str(self.mail_type))
            unknown = [t for t in str(self.mail_type).split(",") if t.upper() not in MAIL_TYPES]
            if why or unknown:
                problems.append(Problem("notify.mail_type", self.mail_type,
                                        why or f"Slurm mail types separated by ',': {', '.join(MAIL_TYPES)}"))
        if self.mail_user is not None:
            if why := MAIL_USER.problem(str(self.mail_user)):
                problems.append(Problem("notify.mail_user", self.mail_user, why))
            elif self.mail_type is None:
                problems.append(Problem("notify.mail_user", self.mail_user, "set notify.mail_type too (e.g. END,FAIL): "
                                        "without it Slurm sends no mail"))
        if self.timeout_s is None or not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            problems.append(Problem("notify.timeout_s", self.timeout_s, f"seconds, more than 0 and at most {MAX_TIMEOUT_S:g}"))
        return problems

    def __post_init__(self) -> None:
        raise_if(self.problems())


def sbatch_options(notify: NotifyConfig) -> Dict[str, str]:
    """The job's mail options: the one place ``--mail-type``/``--mail-user`` come from."""
    out: Dict[str, str] = {}
    if notify.mail_type:
        out["mail-type"] = str(notify.mail_type).upper()
    if notify.mail_user:
        out["mail-user"] = str(notify.mail_user)
    return out


def mail_problems(notify: Any, extra_sbatch: Any) -> List[Problem]:
    """Mail set both in ``notify`` and ``slurm.extra_sbatch``: one would silently win, so say where it goes."""
    problems: List[Problem] = []
    for option, key in (("mail-type", "mail_type"), ("mail-user", "mail_user")):
        if getattr(notify, key, None) is not None and option in (extra_sbatch or {}):
            problems.append(Problem(f"slurm.extra_sbatch.{option}", extra_sbatch[option],
                                    f"mail in one place: remove it here and keep notify.{key}"))
    return problems
