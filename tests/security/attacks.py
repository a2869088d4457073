"""The security suite's report: one line per attack, held or broken, with its figure.

Each test in `tests/security/` replays one attack (issue 22's reproductions and their kin)
and ends by calling `report(name, held, figure)`; the line is printed in pytest's summary,
so `make attack` (the long forms, `AGON_ATTACK=full`) reads as a table. A test asserts
`held` after reporting, so a broken defence both fails the test and shows its figure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The long forms (thousands of sockets, long out-of-memory spells): `make attack`.
FULL = os.environ.get("AGON_ATTACK") == "full"


def scale(short: int, full: int) -> int:
    """`full` under `make attack`, `short` in the test command."""
    return full if FULL else short


@dataclass(frozen=True)
class AttackLine:
    name: str
    held: bool
    figure: str

    def __str__(self) -> str:
        return f"{'held  ' if self.held else 'BROKEN'}  {self.name}: {self.figure}"


LINES: list[AttackLine] = []


def report(name: str, held: bool, figure: str) -> None:
    """Record the outcome of one attack for the summary (call before asserting `held`)."""
    LINES.append(AttackLine(name, held, figure))
