"""``review --serve`` (issue 16, must-show 7): 127.0.0.1 by default; any other address needs a token,
which the proxy in front of TensorBoard then enforces (401 without it)."""
from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request

import pytest

from hpc_agent.review import free_port, main
from hpc_agent.runs.serve import COOKIE, TOKEN_ENV, authorized, bind_problem, given_token, is_loopback, without_token

TOKEN = "s3cret-token-0123456789"


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("10.1.2.3", False), ("login1.cluster", False), ("", False),
])
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize("host, token, refused_for", [
    ("127.0.0.1", None, None),
    ("0.0.0.0", None, "--token"),
    ("login1", None, TOKEN_ENV),
    ("0.0.0.0", TOKEN, None),
    ("127.0.0.1", "short", "at least 16"),
    ("0.0.0.0", "a" * 20 + "\r\nSet-Cookie: x", "only letters"),
])
def test_bind_problem(host, token, refused_for):
    problem = bind_problem(host, token)
    assert (problem is None) is (refused_for is None)
    if refused_for:
        assert refused_for in problem


@pytest.mark.parametrize("headers, path, found", [
    ({"Authorization": f"Bearer {TOKEN}"}, "/", TOKEN),
    ({"Authorization": f"bearer {TOKEN}"}, "/", TOKEN),
    ({}, f"/data/x?a=1&token={TOKEN}", TOKEN),
    ({"Cookie": f"other=1; {COOKIE}={TOKEN}"}, "/", TOKEN),
    ({"Cookie": "\x00;;=="}, "/", None),
    ({"Authorization": "Basic abc"}, "/", None),
    ({}, "/", None),
])
def test_given_token(headers, path, found):
    assert given_token(headers, path) == found


def test_authorized_and_the_token_never_reaches_tensorboard():
    assert authorized(TOKEN, TOKEN) and not authorized(TOKEN[:-1], TOKEN) and not authorized(None, TOKEN)
    assert not authorized("", TOKEN) and not authorized("é", TOKEN)
    assert without_token(f"/data/plugin?run=a&token={TOKEN}") == "/data/plugin?run=a"
    assert without_token(f"/?token={TOKEN}") == "/"


@pytest.fixture
def tb_run(tmp_path):
    from tests.unit.test_review import _write_attempt

    run_dir = tmp_path / "run-1"
    (run_dir / "tb").mkdir(parents=True)
    _write_attempt(run_dir / "tb", 0, list(range(1, 11)), time.time() - 600, 1.0)
    return run_dir


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.1", "login1.example.org"])
def test_a_non_loopback_bind_without_a_token_is_refused(tb_run, monkeypatch, capsys, host):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    began = time.monotonic()
    assert main([str(tb_run), "--serve", "--host", host, "--serve-seconds", "30"]) == 2
    err = capsys.readouterr().err
    assert "--token" in err and TOKEN_ENV in err and "Traceback" not in err
    assert time.monotonic() - began < 5, "refused before starting TensorBoard"


def _serve_in_thread(argv):
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", main(argv)), daemon=True)
    thread.start()
    return thread, result


def _get(url, headers=None, timeout=5):
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def _wait_for(url, headers=None, deadline_s=60):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            status, body, _ = _get(url, headers)
            if status in (200, 401):
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"nothing answered at {url}")


def test_the_default_loopback_serve_works(tb_run, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    port = free_port()
    thread, result = _serve_in_thread([str(tb_run), "--serve", "--port", str(port), "--serve-seconds", "8"])
    url = f"http://127.0.0.1:{port}/data/plugin/scalars/tags"
    _wait_for(url)
    status, body, _ = _get(url)
    assert status == 200 and "train/loss" in body.decode()
    thread.join(timeout=60)
    assert result.get("code") == 0


def test_with_a_token_only_requests_that_carry_it_are_proxied(tb_run, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)  # the env var is the token when --token is not given
    port = free_port()
    thread, result = _serve_in_thread([str(tb_run), "--serve", "--host", "0.0.0.0", "--port", str(port),
                                       "--serve-seconds", "15"])
    url = f"http://127.0.0.1:{port}/data/plugin/scalars/tags"
    _wait_for(url, {"Authorization": f"Bearer {TOKEN}"})
    assert _get(url)[0] == 401
    assert _get(url, {"Authorization": "Bearer wrong-token-wrong-token"})[0] == 401
    assert _get(url + "?token=nope")[0] == 401
    status, body, _ = _get(url, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and "train/loss" in body.decode()
    status, body, headers = _get(url + f"?token={TOKEN}")
    assert status == 200 and f"{COOKIE}={TOKEN}" in headers.get("Set-Cookie", "")
    assert "HttpOnly" in headers["Set-Cookie"]
    assert _get(url, {"Cookie": f"{COOKIE}={TOKEN}"})[0] == 200
    thread.join(timeout=60)
    assert result.get("code") == 0


def test_a_linked_tb_folder_is_not_served(tmp_path, tb_run, monkeypatch, capsys):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    linked = tmp_path / "run-2"
    linked.mkdir()
    (linked / "config.yaml").write_text("")  # a run directory marker
    (linked / "tb").symlink_to(tb_run / "tb")
    assert main([str(linked), "--serve", "--serve-seconds", "1"]) == 2
    assert "symbolic link" in capsys.readouterr().err
