"""A minimal HTTP/1.1 server for status pages and `/metrics`, on asyncio streams.

Theory of operation
-------------------
Every master and tablet server serves a few read-only pages (Kudu's webserver: the master on
8051, the tablet server on 8050) and Prometheus metrics. The needs are small: GET only, one
request per connection, a few KB of HTML, scraped every few seconds. So this is
`asyncio.start_server` and about a page of HTTP rather than a web framework dependency:

* a request is the request line and headers (at most `MAX_HEADER_BYTES`, within
  `READ_TIMEOUT_S`: a client that trickles bytes cannot hold a connection forever); any body
  is ignored; the answer always carries `Content-Length` and `Connection: close`;
* routes map an exact path to `async def handler(request) -> (content_type, body)`; the query
  string arrives parsed (`Request.query`); a handler raises `HttpError` for a 4xx answer;
* 400 for a malformed request, 404 for an unknown path, 405 (with `Allow: GET`) for another
  method, 500 when a handler raises anything else: the exception is logged with its traceback,
  the client gets a short page, and the server goes on serving;
* `/metrics` is registered on every server: the owner's `MetricsRegistry.render()` in the text
  exposition format 0.0.4.

Pages share one layout (`StatusServer.page`): a title, a navigation bar with the server's
routes and a little CSS. Every value put into HTML goes through `esc` (or is `Markup` built by
the helpers here), so a table name like ``<script>`` renders as text.

Lifecycle: `start()` binds (`bind` is "host:port"; port 0 picks a free one; `address` is then
the bound "host:port"), `aclose()` stops listening and cancels connections in progress.
The pages read the live in-memory state of their server on the event loop, between its awaits:
nothing here locks or copies that state.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.common.config import split_host_port
from service.common.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from service.common.metrics import MetricsRegistry

__all__ = [
    "HTML",
    "HttpError",
    "Markup",
    "Request",
    "StatusServer",
    "esc",
    "fmt_age",
    "fmt_bytes",
    "kv_table",
    "link",
    "public_address",
    "table",
]

log = logging.getLogger(__name__)

HTML = "text/html; charset=utf-8"
MAX_HEADER_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}

Response = tuple[str, str | bytes]
"""(content type, body): what a handler returns."""


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    """The query string's parameters; the first value of a repeated one."""

    def arg(self, name: str, default: str = "") -> str:
        return self.query.get(name, default)


Handler = Callable[[Request], Awaitable[Response]]


class HttpError(Exception):
    """Raised by a handler to answer with `status` (4xx) and a short message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# --- HTML helpers ----------------------------------------------------------------------------


class Markup(str):
    """Text that is already HTML (built by the helpers below); `esc` leaves it alone."""

    __slots__ = ()


def esc(value: object) -> Markup:
    """`value` as HTML text: escaped, unless it is `Markup` already."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def link(href: str, text: object) -> Markup:
    return Markup(f'<a href="{esc(href)}">{esc(text)}</a>')


def table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, empty: str = "none"
) -> Markup:
    """An HTML table; cells are escaped unless they are `Markup`."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = ["<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows]
    if not body:
        body = [f'<tr><td colspan="{len(headers)}" class="empty">{esc(empty)}</td></tr>']
    return Markup(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def kv_table(pairs: Iterable[tuple[str, object]]) -> Markup:
    """A two-column table of settings or facts (name, value)."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in pairs)
    return Markup(f'<table class="kv"><tbody>{rows}</tbody></table>')


def fmt_bytes(n: int | float) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"  # pragma: no cover - the loop always returns


def fmt_age(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 0; color: #222; }
header { background: #2d3e50; color: #fff; padding: 0.5em 1em; }
header .server { font-size: 0.85em; opacity: 0.8; }
nav { background: #eef1f4; padding: 0.4em 1em; border-bottom: 1px solid #ccd; }
nav a { margin-right: 1.2em; color: #1a4f8b; text-decoration: none; }
main { padding: 0.5em 1em 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
thead th, table.kv th { background: #f4f6f8; }
td.empty { color: #888; font-style: italic; }
.LEADER, .live { color: #17702f; font-weight: bold; }
.dead, .FAILED { color: #b00020; font-weight: bold; }
"""


def render_page(title: str, body: str, nav: Sequence[tuple[str, str]], server: str) -> str:
    """The shared layout: header, navigation bar, body."""
    links = "".join(f'<a href="{esc(href)}">{esc(label)}</a>' for href, label in nav)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)} - {esc(server)}</title><style>{_CSS}</style></head>"
        f'<body><header><h1>{esc(title)}</h1><div class="server">{esc(server)}</div></header>'
        f"<nav>{links}</nav><main>{body}</main></body></html>\n"
    )


def public_address(bind: str, port: int, advertised_host: str | None = None) -> str:
    """The host:port a browser should use for a server bound at `bind` (port `port`): the bind
    host, or for a wildcard bind `advertised_host` (the host the RPC address advertises)."""
    host, _ = split_host_port(bind)
    if host in ("0.0.0.0", "::", "") and advertised_host:
        host = advertised_host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- the server ------------------------------------------------------------------------------


class StatusServer:
    """Routes, layout and the listening socket of one server's status pages (module docstring).

    `title` names the server kind in every page ("Tessera master"), `label` the instance (its
    uuid and address); `nav` lists (path, text) for the navigation bar.
    """

    def __init__(self, bind: str, metrics: MetricsRegistry, *, title: str) -> None:
        self.bind = bind
        self.metrics = metrics
        self.title = title
        self.label = ""
        self.nav: list[tuple[str, str]] = []
        self.address = ""
        self.port = 0
        self._routes: dict[str, Handler] = {}
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.requests = 0
        self.errors = 0
        self.route("/metrics", self._metrics)

    def route(self, path: str, handler: Handler, nav: str | None = None) -> None:
        """Serve `handler` at `path`; `nav` adds it to the navigation bar under that text."""
        if path in self._routes:
            raise ValueError(f"route {path!r} registered twice")
        self._routes[path] = handler
        if nav is not None:
            self.nav.append((path, nav))

    def page(self, title: str, body: str) -> Response:
        """An HTML response in the shared layout."""
        return HTML, render_page(title, body, [*self.nav, ("/metrics", "Metrics")], self.label)

    async def _metrics(self, request: Request) -> Response:
        return METRICS_CONTENT_TYPE, self.metrics.render()

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        host, port = split_host_port(self.bind)
        try:
            server = await asyncio.start_server(
                self._serve_connection, host or None, port, limit=MAX_HEADER_BYTES
            )
        except OSError as e:
            raise OSError(e.errno, f"status pages: cannot listen on {self.bind}: {e}") from e
        self._server = server
        sockname = server.sockets[0].getsockname()
        self.port = int(sockname[1])
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    async def aclose(self) -> None:
        """Stop listening; connections still being served are cancelled. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._conns):
            task.cancel()
        for task in list(self._conns):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await server.wait_closed()

    # --- one connection ----------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            status, headers, body = await self._answer(reader)
            reason = _REASONS.get(status, "")
            head = [f"HTTP/1.1 {status} {reason}"]
            head += [f"{k}: {v}" for k, v in headers]
            head += [
                f"Content-Length: {len(body)}",
                "Connection: close",
                "Cache-Control: no-store",
                "",
                "",
            ]
            writer.write("\r\n".join(head).encode("latin-1") + body)
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await writer.drain()
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._conns.discard(task)

    async def _answer(
        self, reader: asyncio.StreamReader
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            return self._error(431, "request headers too large")
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise ConnectionError("client closed without a request") from None
            return self._error(400, "incomplete request")
        line = raw.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._error(400, f"malformed request line {line[:80]!r}")
        method, target, _ = parts
        self.requests += 1
        if method != "GET":
            status, headers, body = self._error(405, f"method {method} not allowed; use GET")
            return status, [*headers, ("Allow", "GET")], body
        split = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(split.path) or "/"
        query = dict(reversed(urllib.parse.parse_qsl(split.query)))  # first value wins
        handler = self._routes.get(path)
        if handler is None:
            return self._error(404, f"no page at {path}")
        t0 = time.perf_counter()
        try:
            content_type, content = await handler(Request(method, path, query))
        except HttpError as e:
            return self._error(e.status, e.message)
        except Exception as e:
            self.errors += 1
            log.exception("status page %s failed", path)
            return self._error(500, f"the page failed: {type(e).__name__}: {e}")
        log.debug("GET %s in %.1f ms", target, (time.perf_counter() - t0) * 1000)
        data = content.encode("utf-8") if isinstance(content, str) else content
        return 200, [("Content-Type", content_type)], data

    def _error(self, status: int, message: str) -> tuple[int, list[tuple[str, str]], bytes]:
        title = f"{status} {_REASONS.get(status, 'Error')}"
        _, page = self.page(title, f"<p>{esc(message)}</p>")
        body = page.encode("utf-8") if isinstance(page, str) else page
        return status, [("Content-Type", HTML)], body
