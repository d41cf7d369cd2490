"""Small pieces every `tessera` command module shares: typed arguments and a `main` runner."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from service.common.errors import InvalidArgument, TesseraError

__all__ = ["exit_code_of_errors", "int_at_least", "run_parsed"]

Handler = Callable[[argparse.Namespace], int]


def exit_code_of_errors(fn: Handler) -> Handler:
    """`fn` with errors turned into one stderr line and an exit code: InvalidArgument (a usage
    error) 2, any other TesseraError (refused, unreachable) 1."""

    def handler(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except InvalidArgument as e:
            print(f"tessera: {e.message}", file=sys.stderr)
            return 2
        except TesseraError as e:
            print(f"tessera: {e.message}", file=sys.stderr)
            return 1

    return handler


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
