"""Printing for the admin commands: aligned plain-text tables and JSON of any cell value.

Every command that prints data offers `--format plain|json`. Plain output is for people: one
aligned table per result, numbers right-aligned so columns of figures can be compared at a
glance, a header underlined so the table reads without borders. JSON output is for scripts: the
same facts, with every value turned into something `json` can write by `jsonable` (the value
types of Tessera's columns, dataclasses and enums of the tools), so no command needs its own
encoder.

Binary values are written as lowercase hex in both forms (`0x...` in plain text, bare hex in
JSON): they are mostly keys and ids, which people compare and paste, and hex is what the rest of
the tooling shows for encoded keys.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["cell_text", "dumps", "format_table", "jsonable"]


def cell_text(value: object, null: str = "-") -> str:
    """`value` as one table cell: `null` for None, hex for bytes, ISO 8601 for times."""
    if value is None:
        return null
    if isinstance(value, enum.Enum):
        return str(value.name)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | bytearray | memoryview):
        return "0x" + bytes(value).hex()
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return str(value)


def _numeric(value: object) -> bool:
    return isinstance(value, int | float | decimal.Decimal) and not isinstance(
        value, bool | enum.Enum
    )


def format_table(
    rows: Sequence[Sequence[object]] | Sequence[Mapping[str, object]],
    columns: Sequence[str],
    *,
    null: str = "-",
) -> str:
    """An aligned text table: the header, a rule under it, one line per row.

    `rows` are sequences of cells in `columns` order, or mappings from column name to cell
    (a missing key is a null). A column whose non-null cells are all numbers is right-aligned.
    Lines carry no trailing blanks. With no rows, the header and rule alone say what would have
    been listed.
    """
    cells: list[list[object]] = []
    for row in rows:
        if isinstance(row, Mapping):
            cells.append([row.get(c) for c in columns])
        else:
            if len(row) != len(columns):
                raise ValueError(f"row has {len(row)} cells, expected {len(columns)}: {row!r}")
            cells.append(list(row))
    texts = [[cell_text(v, null) for v in r] for r in cells]
    right = [
        bool(cells)
        and all(r[i] is None or _numeric(r[i]) for r in cells)
        and any(r[i] is not None for r in cells)
        for i in range(len(columns))
    ]
    widths = [max([len(c), *(len(t[i]) for t in texts)]) for i, c in enumerate(columns)]

    def line(parts: Sequence[str]) -> str:
        out = [
            p.rjust(w) if r else p.ljust(w) for p, w, r in zip(parts, widths, right, strict=True)
        ]
        return "  ".join(out).rstrip()

    lines = [line(list(columns)), line(["-" * w for w in widths])]
    lines.extend(line(t) for t in texts)
    return "\n".join(lines)


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data (for `json.dumps(default=...)` or directly).

    Decimals become strings (exact: a float would round them), bytes hex, dates and times
    ISO 8601, enums their name, dataclasses dicts, sets and tuples lists.
    """
    if isinstance(value, enum.Enum):  # before int: an IntEnum is an int
        return value.name
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [jsonable(v) for v in items]
    return str(value)


def dumps(value: Any, *, lines: bool = False) -> str:
    """JSON text of `value`: indented for one document, compact for JSON lines."""
    data = jsonable(value)
    if lines:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(data, indent=2, ensure_ascii=False)
