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

Who may read (docs/design/security.md#R13). The pages name tables, tablets and servers, so
off loopback they are the cluster's to read, not the network's. `http_auth` decides
(`requires_client_certificates`, a pure function of the bind address and the setting): with
TLS the server answers HTTPS with its own certificate (the one its RPC port serves, read again
from `tls()` before each handshake, so a renewed certificate is served at once) and *asks* for
a client certificate, verified against the cluster CA (`CERT_OPTIONAL`): a certificate from
another CA fails the handshake; a client with none gets through the handshake, but every path
except `PUBLIC_PATHS` (`/healthz`, for load balancers and orchestrators) answers 403 with a
bare page that names nothing. Any role may read (admin, user, servers): a page shows no more
than a user's metadata RPCs do. Without TLS (loopback, or "none") every page is open, as
before.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import logging
import os
import ssl
import tempfile
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from service.common.config import HTTP_AUTH_MODES, split_host_port
from service.common.errors import InvalidArgument
from service.common.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from service.common.metrics import MetricsRegistry
from service.common.pki import Identity, identity_of
from service.common.private_files import write_private_file

if TYPE_CHECKING:
    from service.common.tls import Credentials

__all__ = [
    "HTML",
    "PUBLIC_PATHS",
    "HttpError",
    "Markup",
    "Request",
    "StatusServer",
    "esc",
    "fmt_age",
    "fmt_bytes",
    "is_loopback_bind",
    "kv_table",
    "link",
    "public_address",
    "requires_client_certificates",
    "status_server",
    "table",
]

log = logging.getLogger(__name__)

HTML = "text/html; charset=utf-8"
MAX_HEADER_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
PUBLIC_PATHS = frozenset({"/healthz"})
"""Paths served without a client certificate when the pages need one: they name nothing."""

_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
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
    peer: Identity | None = None
    """Who asked: the identity of the client certificate the TLS handshake verified (None over
    plain HTTP, or over TLS without a certificate)."""

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


# --- who may read (module docstring; docs/design/security.md#R13) -----------------------------


def is_loopback_bind(bind: str) -> bool:
    """Whether the status pages bound at `bind` ("host:port") are reachable from this machine
    only: a loopback address or `localhost`. Wildcards (0.0.0.0, ::) and any other name or
    address are not (a name may resolve to anything)."""
    host, _ = split_host_port(bind)
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def requires_client_certificates(bind: str, http_auth: str) -> bool:
    """Whether the status pages at `bind` serve TLS and admit only clients holding a certificate
    of the cluster CA: always for "tls", never for "none", and for "auto" when `bind` is not a
    loopback address (docs/design/security.md#R13)."""
    if http_auth not in HTTP_AUTH_MODES:
        raise InvalidArgument(
            f"http_auth: expected one of {', '.join(repr(m) for m in HTTP_AUTH_MODES)},"
            f" got {http_auth!r}"
        )
    if http_auth == "auto":
        return not is_loopback_bind(bind)
    return http_auth == "tls"


def status_server(
    bind: str,
    http_auth: str,
    metrics: MetricsRegistry,
    *,
    title: str,
    credentials: Callable[[], Credentials] | None,
) -> StatusServer:
    """The status server of a master or tablet server: TLS with client certificates when
    `requires_client_certificates(bind, http_auth)`, from `credentials` (the server's current
    ones; None in insecure mode, which then serves plain HTTP with a warning, like every other
    port of an insecure server)."""
    need_tls = requires_client_certificates(bind, http_auth)
    if need_tls and credentials is None:
        log.warning(
            "status pages on %s are served without authentication: security.mode is 'insecure'",
            bind,
        )
    elif not need_tls and not is_loopback_bind(bind):
        log.warning(
            "status pages on %s are served without authentication (http_auth = %r): anyone who "
            "can connect reads the names of tables, tablets and servers",
            bind,
            http_auth,
        )
    return StatusServer(bind, metrics, title=title, tls=credentials if need_tls else None)


def _load_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a certificate and its key into `ctx` from memory. `ssl` reads them only from a
    path: an anonymous in-memory file where there is one (Linux), else an owner-only file in an
    owner-only temporary directory, removed at once."""
    data = cert_pem.rstrip(b"\n") + b"\n" + key_pem
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd("tessera-status-tls", getattr(os, "MFD_CLOEXEC", 0))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            ctx.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="tessera-status-tls-") as tmp:  # created 0700
        path = Path(tmp) / "chain.pem"
        write_private_file(path, data)
        ctx.load_cert_chain(path)


def _server_context(creds: Credentials) -> ssl.SSLContext:
    """TLS for the status pages: this server's certificate, and a client certificate asked for
    and, when one is sent, verified against the cluster CA (module docstring)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = ssl.CERT_OPTIONAL
    ctx.load_verify_locations(cadata=creds.ca_pem.decode("ascii"))
    _load_chain(ctx, creds.cert_pem, creds.key_pem)
    return ctx


def _peer_identity(writer: asyncio.StreamWriter) -> Identity | None:
    """The identity of the client certificate the handshake verified, if any."""
    sslobj = writer.get_extra_info("ssl_object")
    if sslobj is None:
        return None
    der = sslobj.getpeercert(binary_form=True)
    if not der:
        return None
    try:
        return identity_of(ssl.DER_cert_to_PEM_cert(der).encode("ascii"))
    except InvalidArgument:
        return None  # chains to the cluster CA but binds no identity: admits no one


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
    uuid and address); `nav` lists (path, text) for the navigation bar. With `tls` (a function
    returning the server's current credentials) it serves HTTPS and admits only clients with a
    certificate of the cluster CA, except to `PUBLIC_PATHS`.
    """

    def __init__(
        self,
        bind: str,
        metrics: MetricsRegistry,
        *,
        title: str,
        tls: Callable[[], Credentials] | None = None,
    ) -> None:
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
        self._tls = tls
        self._ssl: ssl.SSLContext | None = None
        self._ssl_cert = b""
        self._ssl_refused = b""
        self.requests = 0
        self.errors = 0
        self.refused = 0
        """Requests answered 403 for want of a client certificate."""
        self.route("/metrics", self._metrics)
        self.route("/healthz", self._healthz)

    @property
    def scheme(self) -> str:
        """The pages' URL scheme: https when they need a client certificate, else http."""
        return "https" if self._tls is not None else "http"

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

    async def _healthz(self, request: Request) -> Response:
        """The process serves: for load balancers and orchestrators, open to anyone."""
        return "text/plain; charset=utf-8", "ok\n"

    # --- lifecycle ---------------------------------------------------------------------------

    def _refresh_tls(self) -> None:
        """Serve the server's current certificate (renewals replace it) from the next
        handshake on; connections already open keep theirs."""
        if self._tls is None:
            return
        creds = self._tls()
        if self._ssl is None:
            self._ssl = _server_context(creds)
        elif creds.cert_pem not in (self._ssl_cert, self._ssl_refused):
            # The listening socket keeps its context: load the new pair into it, once a scratch
            # context took it (a key that does not fit must not half-replace the served one).
            try:
                _server_context(creds)
            except (ssl.SSLError, OSError, ValueError):
                self._ssl_refused = creds.cert_pem  # warned once, not on every connection
                raise
            _load_chain(self._ssl, creds.cert_pem, creds.key_pem)
        self._ssl_cert = creds.cert_pem

    def _protocol(self) -> asyncio.StreamReaderProtocol:
        """What `asyncio.start_server` makes per connection; made before the TLS handshake, so
        the certificate is checked for renewal first."""
        try:
            self._refresh_tls()
        except (ssl.SSLError, OSError, ValueError) as e:  # keep serving the previous one
            log.warning("status pages: cannot serve the renewed certificate: %s", e)
        reader = asyncio.StreamReader(limit=MAX_HEADER_BYTES)
        return asyncio.StreamReaderProtocol(reader, self._serve_connection)

    async def start(self) -> None:
        host, port = split_host_port(self.bind)
        self._refresh_tls()
        try:
            server = await asyncio.get_running_loop().create_server(
                self._protocol,
                host or None,
                port,
                ssl=self._ssl,
                ssl_handshake_timeout=READ_TIMEOUT_S if self._ssl is not None else None,
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
            status, headers, body = await self._answer(reader, _peer_identity(writer))
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
        self, reader: asyncio.StreamReader, peer: Identity | None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        # Without a certificate where one is needed, even an error names nothing: a bare page
        # without the layout's server label (docs/design/security.md#R13).
        bare = self._tls is not None and peer is None
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            return self._error(431, "request headers too large", bare=bare)
        except asyncio.IncompleteReadError as e:
            if not e.partial:
                raise ConnectionError("client closed without a request") from None
            return self._error(400, "incomplete request", bare=bare)
        line = raw.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return self._error(400, f"malformed request line {line[:80]!r}", bare=bare)
        method, target, _ = parts
        self.requests += 1
        split = urllib.parse.urlsplit(target)
        path = urllib.parse.unquote(split.path) or "/"
        if bare and path not in PUBLIC_PATHS:
            # Before routing: not even which pages exist.
            self.refused += 1
            return self._error(
                403,
                "these pages need a client certificate from the cluster's CA (any role); "
                "/healthz is open",
                bare=True,
            )
        if method != "GET":
            status, headers, body = self._error(
                405, f"method {method} not allowed; use GET", bare=bare
            )
            return status, [*headers, ("Allow", "GET")], body
        query = dict(reversed(urllib.parse.parse_qsl(split.query)))  # first value wins
        handler = self._routes.get(path)
        if handler is None:
            return self._error(404, f"no page at {path}")
        t0 = time.perf_counter()
        try:
            content_type, content = await handler(Request(method, path, query, peer))
        except HttpError as e:
            return self._error(e.status, e.message, bare=bare)
        except Exception as e:
            self.errors += 1
            log.exception("status page %s failed", path)
            return self._error(500, f"the page failed: {type(e).__name__}: {e}", bare=bare)
        log.debug("GET %s in %.1f ms", target, (time.perf_counter() - t0) * 1000)
        data = content.encode("utf-8") if isinstance(content, str) else content
        return 200, [("Content-Type", content_type)], data

    def _error(
        self, status: int, message: str, *, bare: bool = False
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """An error page in the shared layout, or `bare`: plain text naming nothing else."""
        title = f"{status} {_REASONS.get(status, 'Error')}"
        if bare:
            text = f"{title}: {message}\n"
            return status, [("Content-Type", "text/plain; charset=utf-8")], text.encode()
        _, page = self.page(title, f"<p>{esc(message)}</p>")
        body = page.encode("utf-8") if isinstance(page, str) else page
        return status, [("Content-Type", HTML)], body
