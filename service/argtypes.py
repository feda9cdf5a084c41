"""argparse types shared by the commands: a bad value is a usage error (exit 2) that names the rule."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def count_at_least(minimum: int) -> Callable[[str], int]:
    """An integer option that must be `minimum` or more (e.g. 1 for a number of repeats)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is less than {minimum}")
        return value

    parse.__name__ = "count"  # argparse names the type in its messages
    return parse


def non_negative_number(text: str) -> float:
    """A finite number, 0 or more (e.g. a noise scale)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number >= 0")
    return value
