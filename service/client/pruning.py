"""Which tablets a scan can skip, from its predicates on key columns (pure).

Kudu's partition pruner, for the shapes that matter in practice:

* **Hash dimensions.** A dimension whose every column has an equality (EQ, or IN with a few
  values) can only hit the buckets of those values (`partition.bucket_for`); every other
  dimension may hit any bucket.
* **The range dimension.** Equalities on the leading range columns fix a prefix P of the encoded
  range key; all matching keys lie in [P, successor(P)). When the next range column is
  integer-like (ints, TIMESTAMP, DATE) and has bounds (<, <=, >, >=, EQ), the interval narrows to
  [P + enc(lo), P + enc(hi)), because fixed-width components encode the same whether or not a
  component follows. Anything else (a range on a string column, predicates on later columns)
  keeps the interval P gives, which is always correct, only less tight.

The tablet server still evaluates every predicate: pruning only skips tablets that cannot hold
a matching row, it never decides which rows match. A predicate set that can match nothing
(x > max int, IN ()) prunes every tablet.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from service.common.keys import encode_key
from service.common.partition import Partition, PartitionSchema, bucket_for
from service.common.predicates import ColumnPredicate
from service.common.schema import Schema

__all__ = ["KeyRange", "allowed_buckets", "prune", "range_interval", "successor"]

MAX_IN_COMBINATIONS = 1024
"""IN lists whose cartesian product over a hash dimension's columns exceeds this prune nothing
in that dimension (computing the buckets would cost more than scanning the tablets)."""


@dataclass(frozen=True)
class KeyRange:
    """[lower, upper) of encoded range keys; None unbounded; `empty` when nothing can match."""

    lower: bytes | None = None
    upper: bytes | None = None
    empty: bool = False


def successor(prefix: bytes) -> bytes | None:
    """The smallest byte string above every string that starts with `prefix` (None: none)."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return None
    b[-1] += 1
    return bytes(b)


def _equalities(preds: Iterable[ColumnPredicate]) -> dict[str, tuple[object, ...]]:
    """Column -> the values it must equal (EQ: one, IN: several; intersected when repeated)."""
    out: dict[str, tuple[object, ...]] = {}
    for p in preds:
        if p.op == "EQ":
            vals: tuple[object, ...] = (p.values[0],)
        elif p.op == "IN":
            vals = tuple(dict.fromkeys(p.values))
        else:
            continue
        if p.column in out:
            vals = tuple(v for v in out[p.column] if v in vals)
        out[p.column] = vals
    return out


def allowed_buckets(
    schema: Schema, ps: PartitionSchema, preds: Sequence[ColumnPredicate]
) -> list[frozenset[int] | None]:
    """Per hash dimension, the buckets a matching row can have (None: any)."""
    eq = _equalities(preds)
    out: list[frozenset[int] | None] = []
    for h in ps.hash:
        if not all(c in eq for c in h.columns):
            out.append(None)
            continue
        choices = [eq[c] for c in h.columns]
        n = 1
        for c in choices:
            n *= len(c)
        if n > MAX_IN_COMBINATIONS:
            out.append(None)
            continue
        out.append(
            frozenset(bucket_for(schema, h, list(combo)) for combo in itertools.product(*choices))
        )
    return out


def range_interval(
    schema: Schema, ps: PartitionSchema, preds: Sequence[ColumnPredicate]
) -> KeyRange:
    """The interval of encoded range keys a matching row can have (module docstring)."""
    cols = [schema.column(c) for c in ps.range_columns(schema)]
    if not cols:
        return KeyRange()
    eq = _equalities(preds)
    if any(len(v) == 0 for v in eq.values()):
        return KeyRange(empty=True)
    prefix_vals: list[object] = []
    for c in cols:
        vals = eq.get(c.name)
        if vals is None or len(vals) != 1:
            break
        prefix_vals.append(vals[0])
    if len(prefix_vals) == len(cols):
        exact = encode_key(cols, prefix_vals)
        return KeyRange(exact, exact + b"\x00")
    prefix = encode_key(cols, prefix_vals, allow_prefix=True) if prefix_vals else b""
    lower: bytes | None = prefix or None
    upper = successor(prefix) if prefix else None
    nxt = cols[len(prefix_vals)]
    bounds = nxt.type.int_range
    if bounds is None:
        return KeyRange(lower, upper)
    lo, hi = bounds  # inclusive
    for p in preds:
        if p.column != nxt.name or not p.values:
            continue
        v = p.values[0]
        if not isinstance(v, int):
            continue
        if p.op in ("GE", "EQ"):
            lo = max(lo, v)
        elif p.op == "GT":
            lo = max(lo, v + 1)
        if p.op in ("LE", "EQ"):
            hi = min(hi, v)
        elif p.op == "LT":
            hi = min(hi, v - 1)
    if lo > hi:
        return KeyRange(empty=True)
    sub = cols[: len(prefix_vals) + 1]
    if lo > bounds[0]:
        lower = encode_key(sub, [*prefix_vals, lo], allow_prefix=True)
    if hi < bounds[1]:
        upper = encode_key(sub, [*prefix_vals, hi + 1], allow_prefix=True)
    return KeyRange(lower, upper)


def prune(
    schema: Schema,
    ps: PartitionSchema,
    preds: Sequence[ColumnPredicate],
    partitions: Iterable[Partition],
) -> list[Partition]:
    """The partitions a scan with `preds` (canonical values) may find rows in."""
    rng = range_interval(schema, ps, preds)
    if rng.empty:
        return []
    buckets = allowed_buckets(schema, ps, preds)
    out = []
    for p in partitions:
        if any(a is not None and b not in a for a, b in zip(buckets, p.hash_buckets, strict=False)):
            continue
        if p.range_overlaps(rng.lower, rng.upper):
            out.append(p)
    return out
