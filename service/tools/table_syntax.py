"""How tables, values and conditions are written on the command line, and shown back.

The admin commands (`admin_cmd`) take columns, partitioning, split rows and scan conditions as
text; this module is their grammar, and the inverse for output (keys and partitions in the
same notation). Pure: it turns text into the schema's values and predicates and back, and
raises `InvalidArgument` naming the column or the argument when the text does not parse,
which the commands report as usage errors (exit 2).

Values are parsed per column type and then checked by `schema.coerce_value` (ranges,
decimal digits):

=============  ==============================================================================
bool           true/false (also t/f, yes/no, 1/0)
int8..int64    decimal integers
float, double  Python float syntax (inf, nan included)
string         bare text, or quoted: 'it''s' (a doubled quote) or "a \"b\"" (backslash)
binary         quoted text (its UTF-8 bytes) or 0xHEX
decimal(p,s)   exact decimal text; more than `s` digits after the point is refused, not rounded
timestamp      ISO 8601 (UTC when no offset is given) or microseconds since the epoch
date           ISO date or days since the epoch
=============  ==============================================================================

Quote a value that holds a comma, a parenthesis or surrounding blanks. Bare `null` is refused
as a value (use `COL is null`). A column is `NAME:TYPE[?][=DEFAULT]`: `?` makes it nullable,
without it the column is NOT NULL (a NOT NULL column added by an alter needs a default).

A condition (`--where`) is `COL OP VALUE` with OP one of = == != <> < <= > >=, or
`COL in (V1, V2, ...)`, `COL is null`, `COL is not null`, `COL startswith VALUE`, or
`COL like PATTERN` (SQL LIKE on a string column: `%` any run, `_` one character, `\\` escapes).
Each becomes a `ColumnPredicate`. A LIKE pattern that is a plain prefix (`'abc%'`) becomes
"PREFIX", which tablet servers evaluate; `!=` becomes op "NE" and any other LIKE op "LIKE",
which they do not offer: the scan command applies those to the returned rows with
`filter_local` (SQL semantics: a null never matches).
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from service.common.errors import InvalidArgument
from service.common.keys import decode_key
from service.common.partition import HashBucketSchema, Partition, PartitionSchema
from service.common.predicates import ColumnPredicate
from service.common.schema import AddColumn, ColumnSchema, ColumnType, Schema, coerce_value
from service.tools.output import cell_text

__all__ = [
    "LOCAL_OPS",
    "TYPE_NAMES",
    "bound_text",
    "filter_local",
    "key_text",
    "parse_column",
    "parse_hash",
    "parse_type",
    "parse_value",
    "parse_where",
    "partition_text",
    "schema_of",
    "split_list",
]


# --- parsing values, types, columns ----------------------------------------------------------


def split_list(text: str) -> list[str]:
    """Split on commas outside quotes and parentheses ("a,decimal(9,2),'x,y'" -> 3 items)."""
    out: list[str] = []
    depth, quote, start = 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return out


def _literal(text: str) -> tuple[str, bool]:
    """(the text of a value, whether it was quoted): 'it''s' and "a\\"b" unquote."""
    s = text.strip()
    if len(s) >= 2 and s[0] == s[-1] == "'":
        return s[1:-1].replace("''", "'"), True
    if len(s) >= 2 and s[0] == s[-1] == '"':
        return re.sub(r"\\(.)", r"\1", s[1:-1]), True
    return s, False


_TRUE = {"true", "t", "yes", "y", "1"}
_FALSE = {"false", "f", "no", "n", "0"}


def _parse_raw(t: ColumnType, s: str, quoted: bool) -> object:
    if t is ColumnType.BOOL:
        if s.lower() in _TRUE | _FALSE:
            return s.lower() in _TRUE
        raise ValueError
    if t.int_range is not None and t not in (ColumnType.TIMESTAMP, ColumnType.DATE):
        return int(s)
    if t in (ColumnType.FLOAT, ColumnType.DOUBLE):
        return float(s)
    if t is ColumnType.STRING:
        return s
    if t is ColumnType.BINARY:
        return bytes.fromhex(s[2:]) if not quoted and s.lower().startswith("0x") else s.encode()
    if t is ColumnType.DECIMAL:
        try:
            return decimal.Decimal(s)
        except decimal.InvalidOperation:
            raise ValueError from None
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)  # TIMESTAMP microseconds, DATE days
    if t is ColumnType.DATE:
        return dt.date.fromisoformat(s)
    ts = dt.datetime.fromisoformat(s)
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=dt.UTC)


def parse_value(column: ColumnSchema, text: str) -> object:
    """`text` as a canonical value of `column`'s type (module docstring); InvalidArgument."""
    s, quoted = _literal(text)
    if not quoted and s.lower() == "null":
        raise InvalidArgument(
            f"column {column.name!r}: null is not a value here (use `{column.name} is null`)"
        )
    try:
        raw = _parse_raw(column.type, s, quoted)
    except ValueError:
        raise InvalidArgument(
            f"column {column.name!r}: {text.strip()!r} is not a valid {column.type_name} value"
        ) from None
    return coerce_value(column, raw)


TYPE_NAMES = [t.value for t in ColumnType if t is not ColumnType.DECIMAL] + ["decimal(p,s)"]
_COLUMN = re.compile(
    r"\s*(?P<name>[^:]+?)\s*:\s*(?P<type>[A-Za-z0-9_]+(?:\s*\([^)]*\))?)\s*(?P<null>\?)?"
    r"\s*(?:=(?P<default>.*))?",
    re.S,
)


def parse_type(text: str, column: str) -> tuple[ColumnType, int | None, int | None]:
    m = re.fullmatch(r"\s*decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*", text, re.I)
    if m:
        return ColumnType.DECIMAL, int(m.group(1)), int(m.group(2))
    try:
        t = ColumnType(text.strip().lower())
    except ValueError:
        t = None
    if t is None or t is ColumnType.DECIMAL:
        raise InvalidArgument(
            f"column {column!r}: unknown type {text.strip()!r}; expected one of "
            + ", ".join(TYPE_NAMES)
        )
    return t, None, None


def parse_column(text: str) -> AddColumn:
    """NAME:TYPE[?][=DEFAULT] as a column; `?` makes it nullable (NOT NULL otherwise)."""
    m = _COLUMN.fullmatch(text)
    if m is None:
        raise InvalidArgument(f"column {text.strip()!r}: expected NAME:TYPE[?][=DEFAULT]")
    name = m.group("name")
    ctype, precision, scale = parse_type(m.group("type"), name)
    col = AddColumn(name, ctype, m.group("null") is not None, None, precision, scale)
    if m.group("default") is not None:
        probe = col.to_column(0)
        col = AddColumn(
            name, ctype, col.nullable, parse_value(probe, m.group("default")), precision, scale
        )
    return col


def parse_hash(text: str) -> HashBucketSchema:
    """COL[,COL]:BUCKETS[:SEED] as a hash dimension."""
    m = re.fullmatch(r"\s*([^:]+):\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if m is None:
        raise InvalidArgument(f"--hash {text!r}: expected COL[,COL...]:BUCKETS[:SEED]")
    cols = tuple(c.strip() for c in m.group(1).split(",") if c.strip())
    return HashBucketSchema(cols, int(m.group(2)), int(m.group(3) or 0))


def schema_of(columns: Sequence[AddColumn], key: Sequence[str]) -> Schema:
    """Key columns first in key order (the schema's rule), the others as given."""
    by_name = {c.name: c for c in columns}
    for k in key:
        if k not in by_name:
            raise InvalidArgument(f"key column {k!r} is not among --columns")
        if by_name[k].nullable:
            raise InvalidArgument(f"key column {k!r} cannot be nullable (drop the '?')")
    ordered = [by_name[k] for k in key] + [c for c in columns if c.name not in key]
    return Schema.build(ordered, tuple(key))


# --- --where ---------------------------------------------------------------------------------

_CMP = re.compile(r"\s*(?P<col>[^\s=<>!()'\"]+)\s*(?P<op><=|>=|!=|<>|==|=|<|>)\s*(?P<val>.*?)\s*")
_OPS = {"=": "EQ", "==": "EQ", "<": "LT", "<=": "LE", ">": "GT", ">=": "GE", "!=": "NE", "<>": "NE"}
_KEYWORDS = [
    (re.compile(r"\s*(?P<col>\S+)\s+is\s+not\s+null\s*", re.I), "IS_NOT_NULL"),
    (re.compile(r"\s*(?P<col>\S+)\s+is\s+null\s*", re.I), "IS_NULL"),
    (re.compile(r"\s*(?P<col>\S+)\s+in\s*\((?P<val>.*)\)\s*", re.I | re.S), "IN"),
    (re.compile(r"\s*(?P<col>\S+)\s+startswith\s+(?P<val>.+?)\s*", re.I | re.S), "PREFIX"),
    (re.compile(r"\s*(?P<col>\S+)\s+like\s+(?P<val>.+?)\s*", re.I | re.S), "LIKE"),
]
LOCAL_OPS = frozenset({"NE", "LIKE"})
"""Predicate ops tablet servers do not evaluate: the scan command filters returned rows."""


def parse_where(schema: Schema, text: str) -> ColumnPredicate:
    """One --where condition as a predicate; op "NE" is evaluated client side (docstring)."""
    m = _CMP.fullmatch(text)
    op = _OPS[m.group("op")] if m else ""
    if m is not None and m.group("val")[:1] in ("<", ">", "=", "!"):
        # `qty >>= 5`: an operator that is none of ours, not the value ">= 5".
        given = m.group("op") + re.match(r"[<>=!]*", m.group("val")).group(0)  # type: ignore[union-attr]
        raise InvalidArgument(
            f"--where {text!r}: unknown operator {given!r}; OP is one of = != < <= > >="
        )
    if m is None:
        for rx, kw in _KEYWORDS:
            m = rx.fullmatch(text)
            if m:
                op = kw
                break
    if m is None:
        raise InvalidArgument(
            f"--where {text!r}: expected COL OP VALUE (OP: = != < <= > >=), COL in (V, ...), "
            "COL is [not] null, COL startswith VALUE or COL like PATTERN"
        )
    name = m.group("col")
    if not schema.has_column(name):
        raise InvalidArgument(
            f"--where {text!r}: unknown column {name!r}; columns: {', '.join(schema.column_names)}"
        )
    col = schema.column(name)
    if op in ("IS_NULL", "IS_NOT_NULL"):
        return ColumnPredicate(name, op)
    raw = m.group("val")
    items = split_list(raw) if op == "IN" else [raw]
    if any(not i for i in items):
        raise InvalidArgument(f"--where {text!r}: a value is missing")
    if op == "PREFIX" and col.type not in (ColumnType.STRING, ColumnType.BINARY):
        raise InvalidArgument(f"--where {text!r}: startswith needs a string or binary column")
    if op == "LIKE":
        if col.type is not ColumnType.STRING:
            raise InvalidArgument(f"--where {text!r}: like needs a string column")
        pattern = parse_value(col, raw)
        assert isinstance(pattern, str)
        head = pattern[:-1]
        if pattern.endswith("%") and not any(ch in head for ch in "%_\\"):
            return ColumnPredicate(name, "PREFIX", (head,))  # tablet servers evaluate it
        return ColumnPredicate(name, "LIKE", (pattern,))
    return ColumnPredicate(name, op, tuple(parse_value(col, i) for i in items))


def filter_local(table: pa.Table, schema: Schema, p: ColumnPredicate) -> pa.Table:
    """Rows of `table` that satisfy `p`, an op of LOCAL_OPS (a null never matches)."""
    if p.op == "LIKE":
        mask = pc.match_like(table[p.column], str(p.values[0]))
    else:
        col = schema.column(p.column)
        value = pa.scalar(p.values[0], type=col.arrow_type())
        mask = pc.not_equal(table[p.column], value)
    return table.filter(pc.fill_null(mask, False))


# --- showing keys and partitions -------------------------------------------------------------


def key_text(columns: Sequence[ColumnSchema], values: Sequence[object]) -> str:
    """Key values for people: one value bare, several as a tuple; times as ISO 8601."""
    shown = []
    for c, v in zip(columns, values, strict=False):
        if c.type is ColumnType.TIMESTAMP and isinstance(v, int):
            v = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=v)
        elif c.type is ColumnType.DATE and isinstance(v, int):
            v = dt.date(1970, 1, 1) + dt.timedelta(days=v)
        shown.append(repr(v) if isinstance(v, str) else cell_text(v))
    return shown[0] if len(shown) == 1 else "(" + ", ".join(shown) + ")"


def bound_text(cols: Sequence[ColumnSchema], key: bytes | None, unbounded: str) -> str:
    if not key:
        return unbounded
    try:
        return key_text(cols, decode_key(cols, key, allow_prefix=True))
    except InvalidArgument:
        return "0x" + key.hex()


def partition_text(schema: Schema, ps: PartitionSchema, p: Partition) -> str:
    """`hash 1 range [10, 20)`: the buckets, then the range (unbounded ends as -inf/+inf)."""
    parts = []
    if p.hash_buckets:
        b = p.hash_buckets
        parts.append(f"hash {b[0]}" if len(b) == 1 else f"hash ({', '.join(map(str, b))})")
    cols = [schema.column(c) for c in ps.range_columns(schema)]
    if cols:
        lo, hi = bound_text(cols, p.range_lower, "-inf"), bound_text(cols, p.range_upper, "+inf")
        parts.append(f"range [{lo}, {hi})")
    return " ".join(parts) or "all"
