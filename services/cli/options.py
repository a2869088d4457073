"""Argument helpers for every `agon` subcommand: a bad input is one line and exit 2.

- `UsageError`: raise it from `run(args)` for a bad input by the user; `services.cli`
  prints `agon <command>: <message>` on stderr and exits 2 (no traceback). The message
  is one line: what is wrong and what to do.
- `positive_int`, `non_negative_int`, `positive_float`, `non_negative_float`,
  `finite_float`, `probability`: argparse `type=` callables, so a bad number is rejected
  while parsing:
  `agon selfplay: error: argument --games: must be a whole number ≥ 1, got '-3'`.
- `parse_options(args.option)`: the `key=value` pairs of a repeated `--option`.
- `game_options_or_usage(name, options)`: `engine.load_game`, with its complaint about
  an unknown game or option as a `UsageError`.

Everything here is cheap to import (the engine is loaded only when a game is).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine import Game

__all__ = [
    "UsageError",
    "finite_float",
    "game_options_or_usage",
    "non_negative_float",
    "non_negative_int",
    "parse_options",
    "positive_float",
    "positive_int",
    "probability",
]


class UsageError(Exception):
    """A bad input by the user; the message is one line saying what is wrong and what to do."""


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise argparse.ArgumentTypeError(f"must be a whole number ≥ {least}, got {text!r}")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _number(text: str, least: float, *, strict: bool) -> float:
    value = _float(text)
    if not math.isfinite(value) or value < least or (strict and value == least):
        bound = f"> {least:g}" if strict else f"≥ {least:g}"
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """`type=` for a count that must be at least 1 (`--games 3`)."""
    return _whole_number(text, 1)


def non_negative_int(text: str) -> int:
    """`type=` for a count or limit where 0 is allowed (`--move-time-ms 0`: none)."""
    return _whole_number(text, 0)


def positive_float(text: str) -> float:
    """`type=` for a finite number above 0 (`--timeout 2.5`); nan and inf are refused."""
    return _number(text, 0.0, strict=True)


def non_negative_float(text: str) -> float:
    """`type=` for a finite number of at least 0; nan and inf are refused."""
    return _number(text, 0.0, strict=False)


def finite_float(text: str) -> float:
    """`type=` for any finite number, negative too (`--elo0 -5`); nan and inf are refused."""
    value = _float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def probability(text: str) -> float:
    """`type=` for a rate strictly between 0 and 1 (`--alpha 0.05`)."""
    value = _float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1, got {text!r}")
    return value


def parse_options(pairs: Iterable[str] | None) -> dict[str, str]:
    """`["board=hex-5", "variant=passing"]` (a repeated `--option`) as a dict; None is `{}`.

    The value is everything after the first `=` and may be empty; the key may not be.
    Giving a key twice is fine only with the same value. Anything else is a UsageError.
    """
    options: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--option wants key=value, e.g. --option board=hex-5; got {pair!r}")
        if options.get(key, value) != value:
            raise UsageError(
                f"--option {key} given twice, as {options[key]!r} and {value!r}; give it once"
            )
        options[key] = value
    return options


def game_options_or_usage(name: str, options: dict[str, str]) -> Game:
    """`engine.load_game(name, **options)`; an unknown game or option is a UsageError.

    The engine's message already names what it accepts (games, option names, values).
    """
    from engine import load_game

    try:
        return load_game(name, **options)
    except ValueError as e:
        raise UsageError(str(e)) from None
