"""A local webhook receiver for notification tests: http.server in a thread on 127.0.0.1, a random port."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List


class Receiver:
    """Collects every POST body (parsed JSON) sent to ``url``; ``delay_s`` makes it slow, ``status`` sets the
    answer. Use as a context manager."""

    def __init__(self, delay_s: float = 0.0, status: int = 200):
        self.received: List[Dict[str, Any]] = []
        self.paths: List[str] = []
        self.delay_s, self.status = delay_s, status
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                time.sleep(receiver.delay_s)
                receiver.paths.append(self.path)
                receiver.received.append(json.loads(body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:  # keep the test output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T000/SECRET-TOKEN"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 whose port nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hooks/SECRET-TOKEN"
