"""One log format for every Tessera process, and a way to say which node a line is about.

A line reads

    2024-05-01T12:00:00.123Z INFO  [master-1] service.master.catalog_manager: created table t1

UTC with milliseconds, so lines from several processes of a local cluster merge by sorting; the
level; the node; the logger name (the module, by the `logging.getLogger(__name__)` convention).

The node is the process's (`setup_logging(node=...)`) unless the record names one: several nodes
share one process in the mini cluster and the simulator, so components that belong to a node log
through `node_logger(__name__, node_id)`, which stamps its lines with that node.

`setup_logging` configures the root logger and is idempotent: calling it again replaces the
handlers it installed before (so level, node or file may change) and never duplicates them.
Handlers installed by others (pytest's capture, for one) are left alone.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from service.common.errors import InvalidArgument

__all__ = ["LOG_DATEFMT", "LOG_FORMAT", "node_logger", "setup_logging"]

LOG_FORMAT = "%(asctime)s.%(msecs)03dZ %(levelname)-5s [%(node)s] %(name)s: %(message)s"
LOG_DATEFMT = "%Y-%m-%dT%H:%M:%S"

_MARK = "_tessera_handler"
"""Attribute set on the handlers setup_logging installs, so a later call can find them."""

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _NodeFilter(logging.Filter):
    """Give every record a `node` attribute: its own (from node_logger) or the process's."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "node", None):
            record.node = self.node
        return True


def _level(level: str) -> int:
    name = level.upper() if isinstance(level, str) else ""
    if name not in _LEVELS:
        raise InvalidArgument(f"log level must be one of {', '.join(_LEVELS)}, got {level!r}")
    return logging.getLevelNamesMapping()[name]


def setup_logging(
    level: str = "INFO", *, node: str | None = None, file: Path | None = None
) -> None:
    """Configure the root logger: stderr (and `file`, appended to, if given) in LOG_FORMAT.

    `node` names this process in every line ("-" if unset). Idempotent (see module doc).
    """
    root = logging.getLogger()
    numeric = _level(level)
    for handler in list(root.handlers):
        if getattr(handler, _MARK, False):
            root.removeHandler(handler)
            handler.close()

    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        file = Path(file)
        file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(file, encoding="utf-8"))

    formatter = logging.Formatter(LOG_FORMAT, datefmt=LOG_DATEFMT)
    formatter.converter = time.gmtime
    node_filter = _NodeFilter(node or "-")
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(node_filter)
        setattr(handler, _MARK, True)
        root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)


class _NodeAdapter(logging.LoggerAdapter[logging.Logger]):
    """Adds `node` to every record's extra, keeping any extra the call passes."""

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def node_logger(name: str, node: str) -> logging.LoggerAdapter[logging.Logger]:
    """A logger whose lines are stamped with `node` (for components of one node in a process
    that hosts several)."""
    return _NodeAdapter(logging.getLogger(name), {"node": node})
