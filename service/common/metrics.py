"""Prometheus metrics: a small per-server registry rendered in the text exposition format 0.0.4.

Theory of operation
-------------------
Each server object (a `MasterServer`, a `TabletServer`) owns one `MetricsRegistry` and serves
`render()` at `/metrics` (`http_status`). There is deliberately no process-global registry: tests
run several servers in one process, and each must report only its own numbers.

Three kinds of family, each with optional label names fixed at creation:

* `Counter` (monotonic, `inc`), `Gauge` (`set`/`inc`/`dec`) and `Histogram` (`observe`, fixed
  upper bounds, cumulative `_bucket{le=...}`, `_sum`, `_count`) hold values pushed by the code
  that sees the event (an RPC finished, a WAL fsync took 0.3 ms);
* callback families (`gauge_callback`, `counter_callback`) hold nothing: their function runs at
  scrape time and returns the current value(s). State that already lives in a component (a
  Raft node's term, a tablet's commit index, the number of live tablet servers) is read where it
  lives rather than pushed into a copy that could go stale or outlive the component.

Values of labelled families are kept per tuple of label values; `labels(*values)` returns a
cached child bound to that tuple. Rendering sorts children by label values, so the output is
deterministic (the golden tests of tests/common/test_metrics.py rely on it).

Thread safety: every family guards its values with a lock. Almost all updates happen on the event
loop, but WAL fsyncs run in worker threads (`asyncio.to_thread`) and several tablets can report a
sync into the same histogram at once; `+=` on a Python number is not atomic across threads.

Why not `prometheus_client`: it is not a dependency today, its default registry is process-global
(every metric must be built with `registry=` to avoid collisions between servers in one test
process), and callback metrics need a custom Collector class. The exposition format is a page of
code; owning it keeps `/metrics` free of `_created` samples and of a new dependency.

Format reference: https://prometheus.io/docs/instrumenting/exposition_formats/ (text 0.0.4):
HELP text escapes backslash and newline; label values escape backslash, double quote and newline;
values are Go-style floats (`+Inf`, `-Inf`, `NaN`).
"""

from __future__ import annotations

import bisect
import logging
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias

__all__ = [
    "CONTENT_TYPE",
    "FSYNC_BUCKETS",
    "RPC_BUCKETS",
    "Counter",
    "Gauge",
    "Histogram",
    "MetricsRegistry",
    "RpcMetrics",
    "format_value",
    "wal_sync_histogram",
]

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Content-Type Prometheus expects for the text exposition format."""

RPC_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (seconds) for RPC latencies: sub-millisecond pings to multi-second DDL."""

FSYNC_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
)  # fmt: skip
"""Upper bounds (seconds) for WAL fdatasync: about 0.3 ms on these machines (bench/wal_fsync.py),
so the low buckets are fine-grained; anything past 0.1 s is a sick disk."""

LabelValues: TypeAlias = tuple[str, ...]
CallbackResult: TypeAlias = float | int | Iterable[tuple[Sequence[str], float | int]]
"""What a callback returns: one number (unlabelled family) or (label values, number) pairs."""

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: integers without a fraction, Go's infinities."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels_text(pairs: Sequence[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in pairs) + "}"


# --- families --------------------------------------------------------------------------------


class _Family:
    """A metric family: name, help, type and label names; subclasses hold or compute values."""

    kind: str = "untyped"

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        for label in labelnames:
            if not _LABEL.match(label) or label.startswith("__") or label == "le":
                raise ValueError(f"{name}: invalid label name {label!r}")
        if len(set(labelnames)) != len(labelnames):
            raise ValueError(f"{name}: duplicate label names {list(labelnames)}")
        self.name = name
        self.help = help
        self.labelnames: tuple[str, ...] = tuple(labelnames)
        self._lock = threading.Lock()

    def _key(self, values: Sequence[object]) -> LabelValues:
        if len(values) != len(self.labelnames):
            raise ValueError(
                f"{self.name}: expected {len(self.labelnames)} label values "
                f"{list(self.labelnames)}, got {len(values)}"
            )
        return tuple(str(v) for v in values)

    def samples(self) -> list[tuple[str, list[tuple[str, str]], float]]:
        """(sample name, label pairs, value) in output order."""
        raise NotImplementedError

    def render(self, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {_escape_help(self.help)}")
        out.append(f"# TYPE {self.name} {self.kind}")
        for name, pairs, value in self.samples():
            out.append(f"{name}{_labels_text(pairs)} {format_value(value)}")


class _Scalar(_Family):
    """Counter and Gauge: one number per tuple of label values."""

    def __init__(self, name: str, help: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help, labelnames)
        self._values: dict[LabelValues, float] = {}
        self._children: dict[LabelValues, _Child] = {}
        if not labelnames:
            self._values[()] = 0.0

    def labels(self, *values: object) -> _Child:
        """The child for these label values (created at zero on first use)."""
        key = self._key(values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                self._values.setdefault(key, 0.0)
                child = self._children.setdefault(key, _Child(self, key))
        return child

    def _add(self, key: LabelValues, amount: float) -> None:
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def _set(self, key: LabelValues, value: float) -> None:
        with self._lock:
            self._values[key] = value

    def get(self, *values: object) -> float:
        """The current value for these label values (0 if never touched)."""
        with self._lock:
            return self._values.get(self._key(values), 0.0)

    def samples(self) -> list[tuple[str, list[tuple[str, str]], float]]:
        with self._lock:
            items = sorted(self._values.items())
        return [(self.name, list(zip(self.labelnames, k, strict=True)), v) for k, v in items]


class _Child:
    """A Counter's or Gauge's value for one tuple of label values."""

    __slots__ = ("_family", "_key")

    def __init__(self, family: _Scalar, key: LabelValues) -> None:
        self._family = family
        self._key = key

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0 and isinstance(self._family, Counter):
            raise ValueError(f"{self._family.name}: a counter cannot decrease")
        self._family._add(self._key, amount)

    def dec(self, amount: float = 1.0) -> None:
        if isinstance(self._family, Counter):
            raise ValueError(f"{self._family.name}: a counter cannot decrease")
        self._family._add(self._key, -amount)

    def set(self, value: float) -> None:
        if isinstance(self._family, Counter):
            raise ValueError(f"{self._family.name}: a counter cannot be set")
        self._family._set(self._key, value)


class Counter(_Scalar):
    """A monotonic count. Unlabelled: `c.inc()`; labelled: `c.labels("a", "b").inc()`."""

    kind = "counter"

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)


class Gauge(_Scalar):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float) -> None:
        self.labels().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self.labels().dec(amount)


class _HistogramValue:
    __slots__ = ("counts", "sum")

    def __init__(self, n: int) -> None:
        self.counts = [0] * n  # per bucket, not cumulative; the last one is +Inf
        self.sum = 0.0


class Histogram(_Family):
    """Observations counted into fixed buckets (upper bounds, `+Inf` added), with sum and count."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labelnames: Sequence[str] = (), buckets: Sequence[float] = ()
    ) -> None:
        super().__init__(name, help, labelnames)
        bounds = [float(b) for b in buckets or RPC_BUCKETS]
        if bounds != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets must be strictly increasing, got {list(buckets)}")
        if bounds[-1] != math.inf:
            bounds.append(math.inf)
        self.buckets: tuple[float, ...] = tuple(bounds)
        self._values: dict[LabelValues, _HistogramValue] = {}
        self._children: dict[LabelValues, _HistogramChild] = {}
        if not labelnames:
            self._values[()] = _HistogramValue(len(self.buckets))

    def labels(self, *values: object) -> _HistogramChild:
        key = self._key(values)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                self._values.setdefault(key, _HistogramValue(len(self.buckets)))
                child = self._children.setdefault(key, _HistogramChild(self, key))
        return child

    def observe(self, value: float) -> None:
        self._observe((), value)

    def _observe(self, key: LabelValues, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)  # le: a value equal to a bound counts in it
        with self._lock:
            v = self._values.get(key)
            if v is None:
                v = self._values[key] = _HistogramValue(len(self.buckets))
            v.counts[min(i, len(self.buckets) - 1)] += 1
            v.sum += value

    def count(self, *values: object) -> int:
        with self._lock:
            v = self._values.get(self._key(values))
            return sum(v.counts) if v is not None else 0

    def samples(self) -> list[tuple[str, list[tuple[str, str]], float]]:
        with self._lock:
            items = sorted((k, list(v.counts), v.sum) for k, v in self._values.items())
        out: list[tuple[str, list[tuple[str, str]], float]] = []
        for key, counts, total in items:
            pairs = list(zip(self.labelnames, key, strict=True))
            cumulative = 0
            for bound, n in zip(self.buckets, counts, strict=True):
                cumulative += n
                le = ("le", format_value(bound))
                out.append((f"{self.name}_bucket", [*pairs, le], cumulative))
            out.append((f"{self.name}_sum", pairs, total))
            out.append((f"{self.name}_count", pairs, cumulative))
        return out


class _HistogramChild:
    __slots__ = ("_family", "_key")

    def __init__(self, family: Histogram, key: LabelValues) -> None:
        self._family = family
        self._key = key

    def observe(self, value: float) -> None:
        self._family._observe(self._key, value)


class _Callback(_Family):
    """A gauge or counter whose values a function returns at scrape time."""

    def __init__(
        self,
        name: str,
        help: str,
        kind: str,
        fn: Callable[[], CallbackResult],
        labelnames: Sequence[str] = (),
    ) -> None:
        super().__init__(name, help, labelnames)
        self.kind = kind  # per instance: "gauge" or "counter"
        self._fn = fn

    def samples(self) -> list[tuple[str, list[tuple[str, str]], float]]:
        try:
            result = self._fn()
            if isinstance(result, int | float):
                if self.labelnames:
                    raise ValueError("a labelled callback must return (labels, value) pairs")
                return [(self.name, [], float(result))]
            rows = sorted((self._key(tuple(k)), float(v)) for k, v in result)
        except Exception:
            # One broken callback must not take the whole scrape down with it.
            log.exception("metrics: callback of %s failed", self.name)
            return []
        return [(self.name, list(zip(self.labelnames, k, strict=True)), v) for k, v in rows]


# --- the registry ----------------------------------------------------------------------------


class MetricsRegistry:
    """The metric families of one server, in registration order (module docstring)."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()

    def _add(self, family: _Family) -> None:
        with self._lock:
            if family.name in self._families:
                raise ValueError(f"metric {family.name!r} is already registered")
            self._families[family.name] = family

    def counter(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Counter:
        c = Counter(name, help, labelnames)
        self._add(c)
        return c

    def gauge(self, name: str, help: str, labelnames: Sequence[str] = ()) -> Gauge:
        g = Gauge(name, help, labelnames)
        self._add(g)
        return g

    def histogram(
        self,
        name: str,
        help: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = RPC_BUCKETS,
    ) -> Histogram:
        h = Histogram(name, help, labelnames, buckets)
        self._add(h)
        return h

    def gauge_callback(
        self,
        name: str,
        help: str,
        fn: Callable[[], CallbackResult],
        labelnames: Sequence[str] = (),
    ) -> None:
        """A gauge read from `fn()` at every scrape."""
        self._add(_Callback(name, help, "gauge", fn, labelnames))

    def counter_callback(
        self,
        name: str,
        help: str,
        fn: Callable[[], CallbackResult],
        labelnames: Sequence[str] = (),
    ) -> None:
        """A counter read from `fn()` at every scrape; `fn` must never go down (it reads a count
        that lives as long as the server)."""
        self._add(_Callback(name, help, "counter", fn, labelnames))

    def get(self, name: str) -> _Family | None:
        return self._families.get(name)

    def names(self) -> list[str]:
        return list(self._families)

    def render(self) -> str:
        """Every family in the text exposition format 0.0.4 (ends with a newline)."""
        with self._lock:
            families = list(self._families.values())
        out: list[str] = []
        for family in families:
            family.render(out)
        return "\n".join(out) + "\n" if out else ""


class RpcMetrics:
    """RPC counts and latencies; an `errors.RpcObserver` attached to servicers.

    `tessera_rpc_requests_total{service, method, code}` counts finished calls by outcome: "OK" or
    the Tessera error code the call was aborted with (NOT_THE_LEADER, INTERNAL, ...; CANCELLED
    when the client went away). `tessera_rpc_duration_seconds{service, method}` is the handler's
    wall time, errors included.
    """

    def __init__(self, registry: MetricsRegistry) -> None:
        self.requests = registry.counter(
            "tessera_rpc_requests_total",
            "RPCs handled, by service, method and outcome code (OK or the Tessera error code).",
            ("service", "method", "code"),
        )
        self.latency = registry.histogram(
            "tessera_rpc_duration_seconds",
            "Time spent handling an RPC, by service and method.",
            ("service", "method"),
            RPC_BUCKETS,
        )

        self._children: dict[tuple[str, str, str], tuple[_Child, _HistogramChild]] = {}
        """The two series of each (service, method, code) seen: every RPC reports here, and
        resolving labels per call was a visible share of a cheap RPC's time."""

    def rpc_done(self, service: str, method: str, code: str, seconds: float) -> None:
        children = self._children.get((service, method, code))
        if children is None:
            children = self._children[(service, method, code)] = (
                self.requests.labels(service, method, code),
                self.latency.labels(service, method),
            )
        children[0].inc()
        children[1].observe(seconds)


def wal_sync_histogram(registry: MetricsRegistry) -> Histogram:
    """`tessera_wal_sync_seconds`: the WAL fdatasync latency of every Raft group of a server
    (sys.catalog on a master, every tablet replica on a tablet server); `Wal.on_sync` feeds it
    from the worker thread the sync runs in."""
    return registry.histogram(
        "tessera_wal_sync_seconds",
        "Duration of WAL fdatasync calls (one per group commit), all Raft groups of this server.",
        (),
        FSYNC_BUCKETS,
    )
