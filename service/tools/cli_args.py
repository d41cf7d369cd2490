"""Small pieces every `tessera` command module shares: typed arguments and a `main` runner."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

__all__ = ["int_at_least", "run_parsed"]


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse `type` for integers >= `minimum`, with a message naming the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


def run_parsed(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    """Parse `argv` and run the chosen action's `handler`; --help is 0, a usage error 2."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    code: int = args.handler(args)
    return code
