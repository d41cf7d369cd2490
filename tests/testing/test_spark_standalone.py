"""The Spark standalone harness's own checks (service/testing/spark_standalone.py), without
Spark: the ports come from what the processes logged, and a status page that is not the
master's JSON is an error that names it (once, a port chosen ahead and taken by another
process served its HTML page, which was parsed as the master's status)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.testing.spark_standalone import _MASTER_PORT, _MASTER_UI_PORT, StandaloneSpark


@pytest.fixture
def html_server() -> Iterator[int]:
    """An HTTP server on a free loopback port that answers every GET with an HTML page."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!DOCTYPE html><html><body>someone else's UI</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_a_status_page_that_is_not_json_is_an_error_naming_it(
    tmp_path: Path, html_server: int
) -> None:
    cluster = StandaloneSpark(tmp_path)
    cluster.ui_port = html_server
    with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{html_server}/json/ is not a Spark"):
        cluster.state()


def test_the_ports_are_the_ones_the_master_logged(tmp_path: Path) -> None:
    cluster = StandaloneSpark(tmp_path)
    (tmp_path / "master.log").write_text(
        "INFO Utils: Successfully started service 'sparkMaster' on port 41234.\n"
        "INFO Utils: Successfully started service 'MasterUI' on port 41235.\n"
    )
    assert cluster._bound_port("master", _MASTER_PORT, timeout=5) == 41234
    assert cluster._bound_port("master", _MASTER_UI_PORT, timeout=5) == 41235
    with pytest.raises(TimeoutError, match="the worker bound no port"):
        cluster._bound_port("worker", _MASTER_PORT, timeout=0.5)
