"""`dualpath bench` names what went wrong (issue 20 row 4): "no server answers" only when none does; a
server that answered and then dropped a request is said to have stopped answering during the run."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dualpath.cli.main import main
from dualpath.runtime.launcher import free_port


class _DropsGenerations(BaseHTTPRequestHandler):
    """Answers GET (health, models, metrics) and drops every POST without an answer, as a server whose
    process died mid-request would."""

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
        metrics = self.path.startswith("/metrics")
        body = b"" if metrics else json.dumps({"status": "ok", "data": [{"id": "tiny-llama"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "text/plain" if metrics else "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        self.close_connection = True
        self.connection.close()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _DropsGenerations)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_server_that_drops_a_request_is_not_called_absent(capsys: pytest.CaptureFixture[str]) -> None:
    with _server() as url:
        assert main(["bench", "--url", url, "--agents", "1", "--rounds", "1", "--json"]) != 0
    err = capsys.readouterr().err
    assert "stopped answering during the run" in err and "no server answers" not in err


def test_no_server_at_all_is_said_so(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", "--url", url, "--agents", "1", "--rounds", "1"]) != 0
    assert "no server answers" in capsys.readouterr().err
