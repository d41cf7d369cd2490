"""Every document the code, tests and docs cite is in this repository.

Design rules are cited as `docs/design/<page>.md#R<n>` (docs/design/README.md). This test fails
when a file cites something a reader of the repository cannot open:

* an outside design document by number: a design "seed" followed by three digits, an issue by
  number ("issue" and a number, with or without '#'), `ARCHITECTURE` + `.md`, or a numbered
  rule of the old style guide;
* a `docs/...` path that does not exist, or an anchor (`#R3`) that its page does not define
  (as `<a id="R3"></a>` or as a heading);
* a relative link in a markdown page (`[text](catalog.md#R5)`) whose target or anchor is missing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCANNED_DIRS = ("service", "spark_jobs", "tests", "bench", "protos", "conf", "docs", ".ci")
SCANNED_ROOT_FILES = (
    "README.md",
    "pyproject.toml",
    "Makefile",
    "Dockerfile",
    "docker-compose.yml",
)
SUFFIXES = {".py", ".pyi", ".md", ".toml", ".proto", ".yml", ".yaml", ".cfg", ".txt", ".sh"}
SKIPPED_PARTS = {"__pycache__", ".venv", "node_modules", "results", "bin"}

FORBIDDEN = {
    "a numbered design seed": re.compile(r"(?<![\w-])[Ss]eeds?\s+\d{3}\b"),
    "a numbered issue": re.compile(r"\b[Ii]ssues?\s+#?\d+\b"),
    "the old architecture document": re.compile(r"\bARCHITECTURE\.md\b"),
    # Pattern pieces joined so that this file itself cites nothing.
    "a numbered style-guide rule": re.compile(r"\b[Ss]tyle" + r"\s+rules?\s+\d"),
}

# Citations in files this change could not edit (their owners are changing them), each TO BE
# REMOVED by them: (path, the text matched). Nothing may be added here.
KNOWN_ELSEWHERE: set[tuple[str, str]] = set()

DOCS_PATH = re.compile(r"(?<![\w/.$-])(docs/[\w./-]*[\w/])(?:#([A-Za-z][\w-]*))?")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
HTML_ID = re.compile(r"""\bid=["']([^"']+)["']""")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _scanned_files() -> list[Path]:
    files = [ROOT / name for name in SCANNED_ROOT_FILES if (ROOT / name).is_file()]
    for top in SCANNED_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or SKIPPED_PARTS & set(path.relative_to(ROOT).parts):
                continue
            if path.suffix in SUFFIXES or path.name in ("run", "Makefile", "Dockerfile"):
                files.append(path)
    return files


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    heading = re.sub(r"<[^>]+>", "", heading).strip().lower()
    heading = re.sub(r"[^\w\- ]", "", heading)
    return heading.replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    text = page.read_text(errors="replace")
    return set(HTML_ID.findall(text)) | {_slug(h) for h in HEADING.findall(text)}


def forbidden_citations(path: Path, text: str) -> list[str]:
    out = []
    for what, pattern in FORBIDDEN.items():
        for m in pattern.finditer(text):
            cited = " ".join(m.group(0).split())
            if (_rel(path), cited) in KNOWN_ELSEWHERE:
                continue
            out.append(f"{_rel(path)}:{_line_of(text, m.start())} cites {what}: {cited!r}")
    return out


def _check_target(source: Path, line: int, target: Path, anchor: str | None, shown: str) -> str:
    if not target.exists():
        return f"{_rel(source)}:{line} cites {shown}, which does not exist"
    if anchor and (target.is_dir() or anchor not in anchors_of(target)):
        return f"{_rel(source)}:{line} cites {shown}, whose page has no anchor #{anchor}"
    return ""


def broken_references(path: Path, text: str, root: Path = ROOT) -> list[str]:
    out = []
    for m in DOCS_PATH.finditer(text):
        target = root / m.group(1)
        problem = _check_target(path, _line_of(text, m.start()), target, m.group(2), m.group(0))
        if problem:
            out.append(problem)
    if path.suffix == ".md":
        for m in MD_LINK.finditer(text):
            link = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("docs/"):
                continue  # a URL, or a docs/ path already checked above
            where, _, anchor = link.partition("#")
            target = (path.parent / where) if where else path
            problem = _check_target(path, _line_of(text, m.start()), target, anchor or None, link)
            if problem:
                out.append(problem)
    return out


@pytest.fixture(scope="module")
def scanned() -> list[tuple[Path, str]]:
    return [(p, p.read_text(errors="replace")) for p in _scanned_files()]


def test_design_pages_exist() -> None:
    pages = sorted(p.name for p in (ROOT / "docs" / "design").glob("*.md"))
    assert {"README.md", "catalog.md", "consensus.md", "layers.md"} <= set(pages), pages


def test_no_citation_of_documents_outside_the_repository(scanned: list[tuple[Path, str]]) -> None:
    found = [v for path, text in scanned for v in forbidden_citations(path, text)]
    assert found == [], "\n".join(found)


def test_known_exceptions_are_still_there(scanned: list[tuple[Path, str]]) -> None:
    """An exception that was fixed must leave KNOWN_ELSEWHERE, so the list only shrinks."""
    texts = {_rel(p): " ".join(t.split()) for p, t in scanned}
    stale = [(f, c) for f, c in sorted(KNOWN_ELSEWHERE) if c not in texts.get(f, "")]
    assert stale == [], f"remove from KNOWN_ELSEWHERE: {stale}"


def test_every_docs_path_and_anchor_exists(scanned: list[tuple[Path, str]]) -> None:
    found = [v for path, text in scanned for v in broken_references(path, text)]
    assert found == [], "\n".join(found)


def test_checker_catches_violations(tmp_path: Path) -> None:
    (tmp_path / "docs" / "design").mkdir(parents=True)
    (tmp_path / "docs" / "design" / "page.md").write_text('<a id="R1"></a>\n### R1. A rule\n')
    # Written in pieces so that this file itself cites nothing.
    numbered = "se" + "ed 001's contract; " + "Iss" + "ue #12; " + "iss" + "ue 3; "
    page = "docs" + "/design/page.md"
    bad = tmp_path / "bad.py"
    bad.write_text(
        f'"""{numbered}ARCHITECTURE' + ".md, style " + "rule 6.\n"
        "Fine: an issue, --se" + "eds 200, se" + f"ed 1234, {page}#R1, {page}#r1-a-rule\n"
        f"Broken: {page}#R2, docs" + "/design/missing.md, docs" + '/nothing/"""\n'
    )
    text = bad.read_text()
    assert len(forbidden_citations(bad, text)) == 5, forbidden_citations(bad, text)
    broken = broken_references(bad, text, root=tmp_path)
    assert len(broken) == 3, broken
    md = tmp_path / "docs" / "design" / "other.md"
    md.write_text("[ok](page.md#R1) [heading](page.md#r1-a-rule) [no](page.md#R9) [x](gone.md)\n")
    assert len(broken_references(md, md.read_text(), root=tmp_path)) == 2
