"""Ludii's `(is Pattern {walk})` and `(is Line N)` on any board, plus compiled forms for hot loops.

`is_pattern` and `is_line` follow Ludii's `IsPattern` / `IsLine` step by step (RULES.md §6, §6b)
and are the reference. `compile_pattern` and `compile_lines` turn a walk or the board's lines
into per-site tuples of sites once (`pattern_at` and `line_at` read them), and `pattern_masks`
and `line_masks` turn those into per-site bitmasks, so a game's end test through one site is a
few `bits & m == m` tests. Occupants are ints per site: 0 empty, otherwise the piece type
(1, 2), which is what both ludemes match on. `check_pattern_lines` replays Ludii's recorded
verdicts (`conformance/patterns/*.jsonl`) through the reference and the compiled tables.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any, NamedTuple

from engine.boards import COMPASS16, Board, load_board

#: per site, the alternatives: sites an `F` visits for one start direction, `from` left out
PatternTable = tuple[tuple[tuple[int, ...], ...], ...]
#: per site, per axis, the two rays of sites going out from it, nearest first
LineTable = tuple[tuple[tuple[tuple[int, ...], tuple[int, ...]], ...], ...]

_STEP_TYPES = frozenset("FRLB")


def parse_walk(walk: str) -> tuple[str, ...]:
    """`"F R F R F"` (or `"FRFRF"`, `"{F R F}"`) as step letters; `ValueError` on anything else."""
    steps = tuple(ch for ch in walk.upper() if not ch.isspace() and ch not in "{}")
    bad = sorted(set(steps) - _STEP_TYPES)
    if bad:
        raise ValueError(f"walk {walk!r} has steps {bad}; a walk uses F, R and L")
    return steps


def _turn(board: Board, direction: str, clockwise: bool) -> str:
    """R/L: the next supported orthogonal direction on the 16-point compass."""
    supported = board.directions("orthogonal")
    i = COMPASS16.index(direction)
    delta = 1 if clockwise else -1
    while True:
        i = (i + delta) % 16
        if COMPASS16[i] in supported:
            return COMPASS16[i]


def headings(board: Board, steps: Sequence[str], start: str) -> list[str]:
    """The direction each `F` of a parsed walk steps in, setting out towards `start`.

    `R`/`L` turn to the next supported orthogonal direction; `B` is accepted and, as in
    Ludii, ignored. Both the site walk here and Supplier Sabotage's bitboard walk use this.
    """
    direction = start
    out: list[str] = []
    for step in steps:
        if step == "F":
            out.append(direction)
        elif step == "R":
            direction = _turn(board, direction, clockwise=True)
        elif step == "L":
            direction = _turn(board, direction, clockwise=False)
    return out


def _walk(board: Board, steps: Sequence[str], site: int, start: str) -> list[int] | None:
    """The sites each `F` reaches from `site` heading `start`, or None if one leaves the board.

    `F` uses the non-strict table, as `IsPattern` takes any cell step in the direction: on
    triangular tilings that can be a corner neighbour.
    """
    cur = site
    visited: list[int] = []
    for direction in headings(board, steps, start):
        cur = board.step("orthogonal", direction)[cur]
        if cur < 0:
            return None
        visited.append(cur)
    return visited


def is_pattern(board: Board, walk: str, site: int, occupant: Sequence[int]) -> bool:
    """Ludii's `(is Pattern {walk} from:site)`: some rotation of the walk from `site` visits
    only pieces of the type at `site`. Reflections are not tried; an empty `site` is False."""
    what = occupant[site]
    if what == 0:
        return False
    steps = parse_walk(walk)
    for start in board.directions("orthogonal"):
        visited = _walk(board, steps, site, start)
        if visited is not None and all(occupant[t] == what for t in visited):
            return True
    return False


@cache
def compile_pattern(board: Board, walk: str) -> PatternTable:
    """Per site, one alternative per start direction whose walk stays on the board.

    An alternative lists the distinct sites visited other than `from` (revisits and `from`
    itself always match); alternatives with the same sites are kept once.
    """
    steps = parse_walk(walk)
    table = []
    for site in range(board.num_sites):
        alternatives: list[tuple[int, ...]] = []
        seen: set[frozenset[int]] = set()
        for start in board.directions("orthogonal"):
            visited = _walk(board, steps, site, start)
            if visited is None:
                continue
            alt = tuple(dict.fromkeys(t for t in visited if t != site))
            if frozenset(alt) not in seen:
                seen.add(frozenset(alt))
                alternatives.append(alt)
        table.append(tuple(alternatives))
    return tuple(table)


def pattern_at(table: PatternTable, site: int, occupant: Sequence[int]) -> bool:
    """`is_pattern` through a compiled table."""
    what = occupant[site]
    if what == 0:
        return False
    return any(all(occupant[t] == what for t in alt) for alt in table[site])


def _opposite(direction: str) -> str:
    return COMPASS16[(COMPASS16.index(direction) + 8) % 16]


def _axes(board: Board) -> list[tuple[str, str]]:
    """The board's adjacent directions paired with their opposites, one pair per axis."""
    dirs = board.directions("adjacent")
    axes = []
    for d in dirs:
        opp = _opposite(d)
        if (opp, d) not in axes:
            axes.append((d, opp))
    return axes


@cache
def compile_lines(board: Board) -> LineTable:
    """Per site, per axis of the adjacent directions, its two rays (nearest site first)."""
    axes = _axes(board)
    return tuple(
        tuple((board.ray("adjacent", d, s), board.ray("adjacent", opp, s)) for d, opp in axes)
        for s in range(board.num_sites)
    )


def _run(ray: tuple[int, ...], occupant: Sequence[int], what: int) -> int:
    """How many sites of `ray`, from its start, hold `what` in a row."""
    n = 0
    for t in ray:
        if occupant[t] != what:
            break
        n += 1
    return n


def line_at(table: LineTable, n: int, site: int, occupant: Sequence[int]) -> bool:
    """`is_line` through a compiled table."""
    what = occupant[site]
    if what == 0:
        return False
    return any(
        1 + _run(ahead, occupant, what) + _run(behind, occupant, what) >= n
        for ahead, behind in table[site]
    )


def is_line(board: Board, n: int, site: int, occupant: Sequence[int]) -> bool:
    """Ludii's `(is Line n through:site)`: along some axis of the adjacent directions, at least
    `n` contiguous pieces of the type at `site`, counting `site`. An empty `site` is False (the
    games only ask through the piece just placed)."""
    what = occupant[site]
    if what == 0:
        return False
    for d, opp in _axes(board):
        count = 1 + _run(board.ray("adjacent", d, site), occupant, what)
        count += _run(board.ray("adjacent", opp, site), occupant, what)
        if count >= n:
            return True
    return False


# -- checking Ludii's recorded verdicts -------------------------------------------------------


class PatternCheck(NamedTuple):
    """How many verdict records agreed with Ludii, and the first that did not ("" if none)."""

    passed: int
    failed: int
    first_mismatch: str


def _problem(record: Mapping[str, Any]) -> str | None:
    """What is wrong with Agon's verdicts on one record, or None if both forms agree with Ludii."""
    board = load_board(record["board"])
    occupant = [0 if ch == "." else int(ch) for ch in record["position"]]
    sites = range(board.num_sites)
    if "walk" in record:
        walk = record["walk"]
        ref = [s for s in sites if is_pattern(board, walk, s, occupant)]
        fast = [s for s in sites if pattern_at(compile_pattern(board, walk), s, occupant)]
    else:
        n = record["line"]
        ref = [s for s in sites if is_line(board, n, s, occupant)]
        fast = [s for s in sites if line_at(compile_lines(board), n, s, occupant)]
    labels = board.labels
    if ref != fast:
        return (
            f"compiled form true at {[labels[s] for s in fast]},"
            f" reference at {[labels[s] for s in ref]}"
        )
    expected = set(record["true_sites"])
    if set(ref) == expected:
        return None
    missing = sorted(expected - set(ref))
    extra = sorted(set(ref) - expected)
    return (
        f"Ludii true at {[labels[s] for s in missing]} but Agon false;"
        f" Agon true at {[labels[s] for s in extra]} but Ludii false"
    )


def check_pattern_lines(lines: Iterable[str]) -> PatternCheck:
    """Replay Ludii's Pattern/Line verdicts (one JSON record per line, patterns/README.md)."""
    passed = failed = 0
    first = ""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        record = json.loads(line)
        problem = _problem(record)
        if problem is None:
            passed += 1
            continue
        failed += 1
        if not first:
            test = f"walk {{{record['walk']}}}" if "walk" in record else f"Line {record['line']}"
            first = (
                f"line {number}: {record['board']} {test} seed {record['seed']} position"
                f" {record['position_index']} {record['position']!r}: {problem}\n"
                + load_board(record["board"]).render(list(record["position"]))
            )
    return PatternCheck(passed, failed, first)


def pattern_masks(table: PatternTable) -> tuple[tuple[int, ...], ...]:
    """Per site, each alternative of a compiled walk as a bitmask over sites.

    With a colour's pieces as a bitmask `bits` holding the site, the walk succeeds from
    the site when `bits & m == m` for some `m`: one int test per alternative.
    """
    return tuple(tuple(sum(1 << t for t in alt) for alt in alts) for alts in table)


def line_masks(table: LineTable, n: int) -> tuple[tuple[int, ...], ...]:
    """Per site, every window of `n` consecutive sites on one axis through it, as a bitmask.

    A contiguous run of at least `n` through the site (Ludii's `is Line n`, not exact)
    always covers one of these windows, and a covered window is such a run.
    """
    out = []
    for s, axes in enumerate(table):
        windows = []
        for ahead, behind in axes:
            line = [*reversed(behind[: n - 1]), s, *ahead[: n - 1]]
            at = min(len(behind), n - 1)  # where s sits in `line`
            for start in range(max(0, at - n + 1), min(at, len(line) - n) + 1):
                windows.append(sum(1 << t for t in line[start : start + n]))
        out.append(tuple(windows))
    return tuple(out)
