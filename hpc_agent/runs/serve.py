"""``review --serve`` beyond this machine: a token-checking proxy in front of TensorBoard.

TensorBoard has no authentication, and a login node is shared. So TensorBoard only ever listens on
127.0.0.1; ``review --serve`` binds there by default. Any other address (``--host 0.0.0.0``, a hostname,
a routable IP) needs a token (``--token-file PATH`` or ``$HPC_AGENT_REVIEW_TOKEN``, at least
:data:`MIN_TOKEN_CHARS` characters; never on the command line, which ``ps`` shows to every user of the login
node: :func:`token_from`): a small stdlib HTTP proxy listens on that address and forwards to
TensorBoard only requests that carry the token, as ``Authorization: Bearer <token>``, as ``?token=<token>``
(which also sets a cookie, so the browser's later requests pass) or as that cookie. Anything else gets
401. Tokens are compared with ``hmac.compare_digest`` (no timing leak).

The pure half (:func:`bind_problem`, :func:`given_token`, :func:`authorized`) is table-tested; the proxy
itself is exercised end to end in ``tests/unit/test_review_serve.py``.
"""
from __future__ import annotations

import hmac
import http.client
import ipaddress
import re
import threading
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping, Optional
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

TOKEN_ENV = "HPC_AGENT_REVIEW_TOKEN"
COOKIE = "hpc_agent_review_token"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_FILE_BYTES = 4096
TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
UPSTREAM_TIMEOUT_S = 60.0
"""How long the proxy waits for TensorBoard's answer (a request that takes longer gets 504)."""
CLIENT_TIMEOUT_S = 60.0
"""How long a client connection may sit idle (a slow or stuck client never holds a thread for good)."""
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
               "transfer-encoding", "upgrade", "content-length"}


# --- where the token comes from -----------------------------------------------------------------------------
ARGV_TOKEN_GONE = ("review --serve: --token is gone: a token on the command line is shown by ps to every user "
                   "of the login node. Put it in a file only you can read (--token-file PATH, e.g. `umask 077; "
                   "python -c 'import secrets; print(secrets.token_urlsafe(24))' > ~/.review-token`) or in "
                   f"${TOKEN_ENV}")


def token_from(argv_token: Optional[str], token_file: Optional[str],
               environ: Mapping[str, str]) -> "tuple[Optional[str], Optional[str]]":
    """(the token, None) or (None, why not: a usage error). From ``--token-file`` (a regular file, not a link,
    at most 4 KiB, not readable or writable by others; its first line, stripped), else from
    ``$HPC_AGENT_REVIEW_TOKEN``; None when neither is given. ``--token`` on the command line is refused."""
    if argv_token is not None:
        return None, ARGV_TOKEN_GONE
    if token_file is None:
        return environ.get(TOKEN_ENV) or None, None
    import os
    import stat

    from hpc_agent.core.rundir import read_bounded

    try:
        data = read_bounded(token_file, MAX_TOKEN_FILE_BYTES)  # regular file only, no link followed, bounded
        mode = os.stat(token_file, follow_symlinks=False).st_mode
    except OSError as exc:
        return None, f"review --serve: cannot read the token file {token_file}: {exc.strerror or exc}"
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        return None, (f"review --serve: the token file {token_file} is readable or writable by every user "
                      f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    lines = data.decode("utf-8", "replace").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        return None, f"review --serve: the token file {token_file} is empty"
    return token, None


# --- the rules (pure) -------------------------------------------------------------------------------------
def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to anything routable


def bind_problem(host: str, token: Optional[str]) -> Optional[str]:
    """Why ``review --serve`` must not listen on ``host`` with this token, or None when it may."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        return (f"review --serve: the token is {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))' > FILE, then --token-file FILE)")
    if token is not None and not TOKEN_CHARS.fullmatch(token):
        return ("review --serve: the token may hold only letters, digits and . _ ~ + / = - "
                "(it travels in URLs, headers and a cookie)")
    if token is None and not is_loopback(host):
        return (f"review --serve: refusing to serve TensorBoard on {host} without a token: TensorBoard has no "
                f"authentication, so anyone who can reach {host} could read the runs. Pass --token-file PATH (or "
                f"set ${TOKEN_ENV}), or leave --host at its default 127.0.0.1 and use an SSH tunnel")
    return None


def given_token(headers: Mapping[str, str], path: str) -> Optional[str]:
    """The token a request carries: ``Authorization: Bearer``, ``?token=``, or the cookie (in that order)."""
    auth = headers.get("Authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    for key, value in parse_qsl(urlsplit(path).query, keep_blank_values=True):
        if key == "token":
            return value
    cookie = SimpleCookie()
    try:
        cookie.load(headers.get("Cookie") or "")
    except Exception:  # noqa: BLE001 - a malformed cookie header is just no token
        return None
    return cookie[COOKIE].value if COOKIE in cookie else None


def authorized(given: Optional[str], token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


def without_token(path: str) -> str:
    """The request path with any ``token=`` query parameter removed (TensorBoard never sees the token)."""
    parts = urlsplit(path)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "token"]
    return urlunsplit(("", "", parts.path or "/", urlencode(query), parts.fragment))


# --- the proxy (I/O) --------------------------------------------------------------------------------------
def _handler(upstream_port: int, token: str) -> type:
    class Proxy(BaseHTTPRequestHandler):
        timeout = CLIENT_TIMEOUT_S
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's name
            pass  # no access log on the terminal (and never the token in a URL)

        def _forward(self) -> None:
            given = given_token(self.headers, self.path)
            if not authorized(given, token):
                body = b"401: a token is required (Authorization: Bearer, ?token= or the cookie)\n"
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer realm="hpc_agent review"')
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length > 0 else None
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in _HOP_BY_HOP | {"authorization", "cookie", "host"}}
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=UPSTREAM_TIMEOUT_S)
            try:
                conn.request(self.command, without_token(self.path), body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except OSError as exc:
                self.send_error(504 if isinstance(exc, TimeoutError) else 502, f"TensorBoard: {exc}")
                return
            finally:
                conn.close()
            self.send_response(resp.status, resp.reason)
            for key, value in resp.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            if "token=" in urlsplit(self.path).query:  # let the browser's next requests through
                self.send_header("Set-Cookie", f"{COOKIE}={given}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = _forward

    return Proxy


class TokenProxy:
    """The proxy listening on ``(host, port)`` in a daemon thread; :meth:`close` stops it."""

    def __init__(self, host: str, port: int, upstream_port: int, token: str):
        self.server = ThreadingHTTPServer((host, port), _handler(upstream_port, token))
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="hpc-agent-review-proxy",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)
