"""The status HTTP server, spoken to with a raw asyncio client: routes, errors, /metrics,
escaping, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from service.common.config import ConfigError, MasterConfig, TServerConfig, from_mapping
from service.common.http_status import (
    HTML,
    HttpError,
    Request,
    Response,
    StatusServer,
    esc,
    fmt_age,
    fmt_bytes,
    kv_table,
    link,
    public_address,
    table,
)
from service.common.metrics import MetricsRegistry

pytestmark = pytest.mark.timeout(30)


async def _request(address: str, raw: bytes) -> tuple[int, dict[str, str], str]:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw)
    await writer.drain()
    data = await reader.read()  # Connection: close, so read to EOF
    writer.close()
    await writer.wait_closed()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    assert lines[0].startswith("HTTP/1.1 ")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    assert int(headers["content-length"]) == len(body)
    assert headers["connection"] == "close"
    return status, headers, body.decode("utf-8")


async def _get(address: str, path: str) -> tuple[int, dict[str, str], str]:
    return await _request(address, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def _run(test: Callable[[StatusServer], Awaitable[None]]) -> None:
    async def main() -> None:
        registry = MetricsRegistry()
        registry.counter("demo_requests_total", "Demo.").inc(3)
        http = StatusServer("127.0.0.1:0", registry, title="Test server")
        http.label = "test <server>"

        async def home(request: Request) -> Response:
            return http.page("Home", f"<p>hello {esc(request.arg('name', 'world'))}</p>")

        async def boom(request: Request) -> Response:
            raise RuntimeError("handler bug")

        async def missing(request: Request) -> Response:
            raise HttpError(404, f"no table {request.arg('table')!r}")

        http.route("/", home, nav="Home")
        http.route("/boom", boom)
        http.route("/tables", missing, nav="Tables")
        await http.start()
        try:
            assert http.port > 0 and http.address == f"127.0.0.1:{http.port}"
            await test(http)
        finally:
            await http.aclose()
            await http.aclose()  # idempotent

    asyncio.run(main())


def test_get_a_page_200_with_layout_and_query_escaped() -> None:
    async def check(http: StatusServer) -> None:
        status, headers, body = await _get(http.address, "/?name=%3Cb%3Ebob")
        assert status == 200
        assert headers["content-type"] == HTML
        assert "<p>hello &lt;b&gt;bob</p>" in body
        assert body.startswith("<!DOCTYPE html>")
        assert '<a href="/tables">Tables</a>' in body and '<a href="/metrics">' in body
        assert "test &lt;server&gt;" in body

    _run(check)


def test_unknown_path_404_other_method_405_malformed_400() -> None:
    async def check(http: StatusServer) -> None:
        status, _, body = await _get(http.address, "/nope")
        assert status == 404 and "no page at /nope" in body
        status, _, body = await _get(http.address, "/tables?table=abc")
        assert status == 404 and "no table &#x27;abc&#x27;" in body
        status, headers, _ = await _request(
            http.address, b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        )
        assert status == 405 and headers["allow"] == "GET"
        status, _, _ = await _request(http.address, b"garbage\r\n\r\n")
        assert status == 400

    _run(check)


def test_handler_exception_is_500_and_the_server_keeps_serving() -> None:
    async def check(http: StatusServer) -> None:
        status, _, body = await _get(http.address, "/boom")
        assert status == 500
        assert "RuntimeError: handler bug" in body
        assert http.errors == 1
        status, _, _ = await _get(http.address, "/")
        assert status == 200

    _run(check)


def test_metrics_is_served_in_the_prometheus_text_format() -> None:
    async def check(http: StatusServer) -> None:
        status, headers, body = await _get(http.address, "/metrics")
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=0.0.4")
        assert body == (
            "# HELP demo_requests_total Demo.\n"
            "# TYPE demo_requests_total counter\n"
            "demo_requests_total 3\n"
        )

    _run(check)


def test_concurrent_requests_and_a_silent_client_do_not_block_others() -> None:
    async def check(http: StatusServer) -> None:
        host, _, port = http.address.rpartition(":")
        _, idle = await asyncio.open_connection(host, int(port))  # sends nothing
        results = await asyncio.gather(*(_get(http.address, "/") for _ in range(20)))
        assert all(status == 200 for status, _, _ in results)
        idle.close()

    _run(check)


def test_aclose_cancels_a_connection_in_progress() -> None:
    async def main() -> None:
        http = StatusServer("127.0.0.1:0", MetricsRegistry(), title="t")
        await http.start()
        host, _, port = http.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\n")  # headers never finished
        await writer.drain()
        await asyncio.sleep(0.05)
        await asyncio.wait_for(http.aclose(), 5)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()

    asyncio.run(main())


def test_html_helpers_escape_and_format() -> None:
    assert esc("<a&'\">") == "&lt;a&amp;&#x27;&quot;&gt;"
    assert esc(link("/t?a=1&b=2", "<x>")) == '<a href="/t?a=1&amp;b=2">&lt;x&gt;</a>'
    t = table(["A", "B"], [("<1>", link("/x", "y"))])
    assert "<td>&lt;1&gt;</td>" in t and '<td><a href="/x">y</a></td>' in t
    assert 'colspan="2"' in table(["A", "B"], [], empty="nothing")
    assert "<th>k</th><td>v&amp;</td>" in kv_table([("k", "v&")])
    assert fmt_bytes(512) == "512 B" and fmt_bytes(2048) == "2.0 KiB"
    assert fmt_age(0.0123) == "12 ms" and fmt_age(5) == "5.0 s"


def test_public_address_prefers_the_advertised_host_for_a_wildcard_bind() -> None:
    assert public_address("127.0.0.1:0", 4321) == "127.0.0.1:4321"
    assert public_address("0.0.0.0:8051", 8051, "master-1") == "master-1:8051"
    assert public_address("0.0.0.0:8051", 8051) == "0.0.0.0:8051"
    assert public_address("[::1]:0", 9, None) == "[::1]:9"


def test_http_bind_setting_is_validated_like_rpc_bind() -> None:
    base = {"data_dir": "/tmp/x"}
    for cls in (MasterConfig, TServerConfig):
        assert from_mapping(cls, {**base, "http_bind": ""}).http_bind == ""
        assert from_mapping(cls, {**base, "http_bind": "127.0.0.1:0"}).http_bind == "127.0.0.1:0"
        with pytest.raises(ConfigError, match=r"^http_bind: expected host:port"):
            from_mapping(cls, {**base, "http_bind": "8050"})
        with pytest.raises(ConfigError, match=r"^http_bind: must differ from rpc_bind"):
            from_mapping(cls, {**base, "rpc_bind": "0.0.0.0:9000", "http_bind": "0.0.0.0:9000"})


def test_a_taken_port_is_an_error_naming_the_bind_address() -> None:
    async def main() -> None:
        first = StatusServer("127.0.0.1:0", MetricsRegistry(), title="t")
        await first.start()
        try:
            second = StatusServer(first.address, MetricsRegistry(), title="t")
            with pytest.raises(OSError, match=f"cannot listen on {first.address}"):
                await second.start()
        finally:
            await first.aclose()

    asyncio.run(main())
