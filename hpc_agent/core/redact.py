"""Secrets out of messages: the one redaction of URLs, ``key=value`` secrets and token-shaped words (pure).

Where a value may carry a secret and a person or another user may read the text (config problems, the
watcher's log, the audit trail and ``events.jsonl``, the job log's ``running ...`` line), it goes through
:func:`redact` (free text) or :func:`redact_argv` (a command line). What is hidden:

- a URL's user:password, query and fragment, and a path that holds a token: the URL is shown as
  ``scheme://host[:port]/...`` (:func:`redact_url`: the scheme and host say which endpoint it is; a webhook's
  token lives in its path, so a webhook URL is always shown that way);
- the value of a secret-named key or option: ``token=...``, ``"password": "..."``, ``--api-key ...``,
  ``HF_TOKEN=...``, ``Authorization: Bearer ...`` become ``token=***`` and so on;
- words shaped like the tokens of common services (GitHub ``ghp_...``, Slack ``xox?-...``, OpenAI-style
  ``sk-...``, Hugging Face ``hf_...``, AWS ``AKIA...`` and JSON web tokens);
- values the caller knows are secret (``secrets``: for instance what ``${oc.env:NAME}`` read).

It hides too much rather than too little (a key named ``token_budget`` loses its value in a message), and it
is no proof: a secret with no recognisable shape in a free-text field is only caught through ``secrets``.
"""
from __future__ import annotations

import re
import urllib.parse
from typing import Any, Iterable, List, Mapping, Sequence

MASK = "***"
MAX_CHARS = 64 * 1024  # of one text redacted; the rest is cut (said so): no message is that long, a hostile one may be
# Names whose value is a secret, as a key (token=, "password":), an option (--api-key) or a variable (HF_TOKEN=).
_SECRET_WORD = re.compile(r"(?i)token(?!s)|secret|passw(?:or)?d|pwd|api[_-]?key|apikey|access[_-]?key"
                          r"|private[_-]?key|credentials?|authorization|session[_-]?id|cookie")
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.-]+")  # a key, option or variable name: each found once (linear)
_AFTER_KEY = re.compile(r"(?i)(?P<q1>['\"]?)(?P<sep>[ \t]*[=:][ \t]*)(?P<q2>['\"]?)"
                        r"(?P<value>(?:bearer[ \t]+|basic[ \t]+)?[^\s'\",;&)}\]]{1,4096})")
_KEY_SEPARATOR = re.compile(r"['\"]?[=:]")  # right after a key's name ("password:", '"api_key":'), no space before
_AFTER_OPTION = re.compile(r"[ \t]+['\"]?(?P<value>[^\s'\",;&)}\]]{1,4096})")
_BEARER = re.compile(r"(?i)\b(bearer|basic)[ \t]+[A-Za-z0-9._~+/=-]{8,4096}")
# Each shape starts with a fixed prefix and has bounded repeats: the scan stays linear on any input.
_TOKEN_SHAPES = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,255}|github_pat_[A-Za-z0-9_]{20,255}|xox[abposr]-[A-Za-z0-9-]{10,255}"
    r"|sk-[A-Za-z0-9_-]{20,255}|hf_[A-Za-z0-9]{20,255}|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,255}"
    r"|eyJ[A-Za-z0-9_-]{8,2048}\.[A-Za-z0-9_-]{8,2048}\.[A-Za-z0-9_-]{8,2048})")
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{1,15}://[^\s'\"<>`]{1,8192}")
_TOKENISH_SEGMENT = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_-]{20,}$")  # a long mixed key, not a word
MIN_SECRET_CHARS = 4  # a known secret shorter than this ("1", "on") would blank out unrelated text


def redact_url(url: Any) -> str:
    """``https://hooks.slack.com/services/T0/B0/secret`` -> ``https://hooks.slack.com/...``: the scheme and
    host say which hook it is; the path, query and any user:password are where tokens live."""
    try:
        parts = urllib.parse.urlsplit(str(url))
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<an unparsable URL>"
    if not parts.scheme or not host:
        return "<a URL without scheme or host>"
    return f"{parts.scheme}://{host}{port}/..."


def is_secret_name(name: Any) -> bool:
    """Whether a key (its last dotted part: ``train.password_file``, ``HF_TOKEN``, ``--api-key``) names a
    secret value."""
    last = str(name).rsplit(".", 1)[-1]
    return len(last) <= 256 and _NAME_CHARS.fullmatch(last) is not None and _SECRET_WORD.search(last) is not None


def _starts_a_secret(text: str, at: int) -> bool:
    """Whether the word at ``at`` is itself a secret's name, whose own value the scan masks next: an option
    (``--api-key V``) or a key with its separator right after it (``password: V``, ``token=V``). A word followed
    by a space is a value, whatever letters it holds."""
    name = _NAME_CHARS.match(text, at)
    if name is None:
        return False
    if name.group(0).startswith("-"):
        return is_secret_name(name.group(0).lstrip("-"))
    return (_KEY_SEPARATOR.match(text, name.end()) is not None and is_secret_name(name.group(0))
            and _AFTER_KEY.match(text, name.end()) is not None)


def _mask_key_values(text: str) -> str:
    """``token=V``, ``"password": "V"``, ``HF_TOKEN=V``, ``--api-key V`` -> the value masked. One pass over the names in the
    text (a regex with an open-ended name before the secret word would be quadratic on ``a-a-a-...``)."""
    out: List[str] = []
    done = 0
    for name in _NAME_CHARS.finditer(text):
        if name.start() < done or not is_secret_name(name.group(0).lstrip("-")):
            continue
        after = _AFTER_KEY.match(text, name.end())
        if after is None and name.group(0).startswith("-"):  # an option and its value: --api-key V
            after = _AFTER_OPTION.match(text, name.end())
        if after is None or _starts_a_secret(text, after.start("value")):
            continue  # "TOKEN= password: V", "-TOKEN --api-key V": the next word names its own secret, masked next
        out += [text[done:after.start("value")], MASK]
        done = after.end("value")
    return "".join(out) + text[done:] if out else text


def _url_has_secret(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return True
    if "@" in parts.netloc or parts.query or parts.fragment:
        return True
    return any(_TOKENISH_SEGMENT.match(seg) or _TOKEN_SHAPES.search(seg) for seg in parts.path.split("/"))


def _one_url(match: "re.Match[str]") -> str:
    url = match.group(0)
    return redact_url(url) if _url_has_secret(url) else url


def redact(text: Any, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret this module recognises (and each of ``secrets``) masked."""
    out = str(text)
    if len(out) > MAX_CHARS:
        out = f"{out[:MAX_CHARS]}... ({len(out) - MAX_CHARS} more characters not shown)"
    for secret in sorted({str(s) for s in secrets if s is not None and len(str(s)) >= MIN_SECRET_CHARS},
                         key=len, reverse=True):
        out = out.replace(secret, MASK)
    out = _URL.sub(_one_url, out)
    out = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", out)
    out = _mask_key_values(out)
    return _TOKEN_SHAPES.sub(MASK, out)


def redact_argv(argv: Sequence[Any], secrets: Iterable[str] = (), hide_values: bool = False) -> List[str]:
    """A command line's words, each redacted (:func:`redact`), and the word after a secret-named option
    (``--token VALUE``) masked. ``hide_values``: also mask every word after the first that is not an option
    name (used when a secret value is known to be in the command but not which word holds it)."""
    secrets = [str(s) for s in secrets]
    shown: List[str] = []
    after_secret_option = False
    for i, word in enumerate(str(w) for w in argv):
        if after_secret_option:
            shown.append(MASK)
            after_secret_option = False
            continue
        is_option = word.startswith("-") and len(word) > 1
        if is_option and "=" not in word and is_secret_name(word.lstrip("-")):
            after_secret_option = True
        if hide_values and i > 0:
            if not is_option:
                shown.append(MASK)
                continue
            name, eq, _ = word.partition("=")
            if eq:
                shown.append(f"{name}={MASK}")
                continue
        shown.append(redact(word, secrets))
    return shown


def redact_command(argv: Sequence[Any], env_names: Sequence[str], environ: Mapping[str, str]) -> str:
    """A command for a log line (``running ...``), one shell-quoted line: the values its config read from
    the environment (``env_names``: the variables ``${oc.env:NAME}`` named for it, from the config's
    ``env_origin``) masked wherever they appear, and token-shaped values (:func:`redact_argv`). When one of
    those variables is not in ``environ`` (or too short to find), which word holds it cannot be told: every
    argument but the option names is masked then."""
    import shlex

    values = [environ.get(name) for name in env_names]
    unknown = any(value is None or len(value) < MIN_SECRET_CHARS for value in values)
    words = redact_argv(argv, secrets=[v for v in values if v], hide_values=unknown)
    return " ".join(word if MASK in word else shlex.quote(word) for word in words)  # a mask shown as is


def redact_record(node: Any, depth: int = 0) -> Any:
    """Every string in a JSON-like record (an audit record) redacted; keys kept. Bounded by depth: a record
    deeper than 32 levels keeps its deeper levels as they are (the audit's own records are a few deep)."""
    if isinstance(node, str):
        return redact(node)
    if depth > 32:
        return node
    if isinstance(node, dict):
        return {key: _redact_field(key, value, depth) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        if node and all(isinstance(item, str) for item in node):  # a command line (train.command): --token VALUE
            return redact_argv(node)
        return [redact_record(item, depth + 1) for item in node]
    return node


def _redact_field(key: Any, value: Any, depth: int) -> Any:
    """A mapping's field: a secret-named key (``webhook_url`` aside, shown as its redacted URL) loses its value."""
    if isinstance(key, str) and isinstance(value, (str, int, float)) and not isinstance(value, bool) \
            and is_secret_name(key):
        return MASK
    return redact_record(value, depth + 1)
