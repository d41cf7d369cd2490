"""The status pages rendered by a real headless browser (Debian's `chromium --dump-dom`).

A small real cluster (one master, one tablet server, a table of two single-replica tablets);
every page of the master and of the tablet server is loaded by chromium, and the DOM it built
is checked: the page parsed into the shared layout (title, navigation, tables with header and
body rows), its table cells name the real table, table id, tablet ids and server uuids, and
nothing reads like an error. urllib checks of the same pages are in test_status_pages.py; this
one proves that a browser renders what we send.

Skipped when chromium is not installed. On Debian/Ubuntu CI: `apt-get install -y chromium`
(on Ubuntu the `chromium` deb is a snap shim: install Google's `chrome` or run in a Debian image).
"""

from __future__ import annotations

import concurrent.futures
import html.parser
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from service.testing.mini_cluster import MiniCluster
from tests.helpers.status_pages import create_table

CHROMIUM = shutil.which("chromium")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.browser,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="Debian's chromium is not installed (apt-get install -y chromium); the status "
        "pages are still checked over HTTP by test_status_pages.py",
    ),
]

TABLE = "browser_events"
ERROR_TEXTS = ("Internal Server Error", "Traceback", "Not Found", "the page failed", "Error 404")


@dataclass
class Dom:
    """What the browser built, as this parser sees its serialized DOM."""

    title: str = ""
    headings: list[str] = field(default_factory=list)
    nav: list[str] = field(default_factory=list)
    header_cells: list[str] = field(default_factory=list)
    cells: list[str] = field(default_factory=list)
    text: str = ""


class _DomParser(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.dom = Dom()
        self._stack: list[str] = []
        self._buf: list[str] = []
        self._all: list[str] = []
        self._in_nav = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "nav":
            self._in_nav = True
        if tag in ("title", "h1", "h2", "th", "td") or (tag == "a" and self._in_nav):
            self._stack.append(tag)
            self._buf = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav":
            self._in_nav = False
        if not self._stack or self._stack[-1] != tag:
            return
        self._stack.pop()
        text = "".join(self._buf).strip()
        d = self.dom
        if tag == "title":
            d.title = text
        elif tag in ("h1", "h2"):
            d.headings.append(text)
        elif tag == "th":
            d.header_cells.append(text)
        elif tag == "td":
            d.cells.append(text)
        elif tag == "a":
            d.nav.append(text)

    def handle_data(self, data: str) -> None:
        self._buf.append(data)
        self._all.append(data)


def parse_dom(dom: str) -> Dom:
    p = _DomParser()
    p.feed(dom)
    p.dom.text = " ".join(p._all)
    return p.dom


def dump_dom(url: str, profile: Path) -> str:
    """The DOM chromium built for `url`, serialized (`--dump-dom`)."""
    assert CHROMIUM is not None
    profile.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "<html" in out.stdout, (url, out.stdout[:500], out.stderr[-2000:])
    return out.stdout


@dataclass
class Rendered:
    cluster: MiniCluster
    table_id: str
    tablet_ids: list[str]
    pages: dict[str, Dom]
    """By "master:/path" or "tserver:/path"."""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rendered]:
    base = tmp_path_factory.mktemp("browser")
    with MiniCluster(base, num_masters=1, num_tservers=1) as cluster:
        _, table_id, locs = create_table(cluster, TABLE, buckets=2, replicas=1)
        master = next(iter(cluster.masters.masters.values()))
        ts = next(iter(cluster.tservers.values()))
        urls = {
            f"master:{p}": f"http://{master.http_address}{p}"
            for p in ("/", "/tables", "/tablets", f"/tablets?table={table_id}", "/tservers")
        }
        urls["master:/tasks"] = f"http://{master.http_address}/tasks"
        urls.update(
            {
                f"tserver:{p}": f"http://{ts.http_address}{p}"
                for p in ("/", "/tablets", "/tablet-copies", "/scans")
            }
        )
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = {
                key: pool.submit(dump_dom, url, base / f"profile-{i}")
                for i, (key, url) in enumerate(urls.items())
            }
            pages = {key: parse_dom(f.result()) for key, f in futures.items()}
        tablet_ids = [t.tablet_id for t in locs.tablet_locations]
        yield Rendered(cluster, table_id, tablet_ids, pages)


def test_every_page_renders_in_the_shared_layout_without_errors(rendered: Rendered) -> None:
    assert len(rendered.pages) == 10
    for key, dom in rendered.pages.items():
        assert dom.title, key
        assert dom.headings and dom.headings[0] in dom.title, (key, dom.title, dom.headings)
        for error in ERROR_TEXTS:
            assert error not in dom.text, (key, error)
        assert dom.cells, f"{key}: no table cells rendered"
        assert "Metrics" in dom.nav and "Tablets" in dom.nav, (key, dom.nav)


def test_master_pages_list_the_real_table_tablets_and_server(rendered: Rendered) -> None:
    pages = rendered.pages
    master = next(iter(rendered.cluster.masters.masters.values()))
    ts = next(iter(rendered.cluster.tservers.values()))
    assert master.uuid in pages["master:/"].cells
    assert "LEADER" in pages["master:/"].cells
    tables = pages["master:/tables"]
    assert {"Name", "Table id", "State", "Tablets"} <= set(tables.header_cells)
    assert TABLE in tables.cells and rendered.table_id in tables.cells
    assert "RUNNING" in tables.cells
    for key in ("master:/tablets", f"master:/tablets?table={rendered.table_id}"):
        for tablet_id in rendered.tablet_ids:
            assert tablet_id in pages[key].cells, key
        assert ts.uuid in pages[key].cells
        assert any(TABLE in h for h in pages[key].headings)
    servers = pages["master:/tservers"]
    assert ts.uuid in servers.cells and ts.address in servers.cells
    assert ts.http_address in servers.cells  # the link to its own pages
    assert "live" in servers.cells


def test_tablet_server_pages_list_its_replicas_and_masters(rendered: Rendered) -> None:
    pages = rendered.pages
    ts = next(iter(rendered.cluster.tservers.values()))
    home = pages["tserver:/"]
    assert ts.uuid in home.cells
    assert rendered.cluster.master_addresses[0] in home.cells
    tablets = pages["tserver:/tablets"]
    for tablet_id in rendered.tablet_ids:
        assert tablet_id in tablets.cells
    assert TABLE in tablets.cells and rendered.table_id in tablets.cells
    assert tablets.cells.count("RUNNING") == 2 and tablets.cells.count("LEADER") == 2
    assert (
        "no tablet copies to this server since it started" in pages["tserver:/tablet-copies"].cells
    )
    assert "no open scanners" in pages["tserver:/scans"].cells
