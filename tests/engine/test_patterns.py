"""Pattern walks and Lines: Ludii's recorded verdicts, and hand-built positions with known answers.

The recorded verdicts (`../shared/conformance/patterns/*.jsonl`) go through
`check_pattern_lines`, which checks the reference walk and the compiled tables together; those
tests skip when the data is absent. The hand-built cases pin the semantics on their own:
rotations but no reflections, matching by the piece at `from`, lines of at least N.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.boards import Board, load_board
from engine.pattern import (
    check_pattern_lines,
    compile_lines,
    compile_pattern,
    is_line,
    is_pattern,
    line_at,
    parse_walk,
    pattern_at,
)

SHARED = Path(__file__).resolve().parents[3] / "shared"
PATTERNS = SHARED / "conformance" / "patterns"
PATTERN_BOARDS = ["square-5", "square-8", "hex-3-5", "hex-8", "tri-4", "tri-hexagon-3"]
WALKS = ["F R F R F", "F R R F R R F", "F F", "F L F", "F R F R F R F R F", "F F R R F F R R F"]


@pytest.mark.parametrize("board", PATTERN_BOARDS)
def test_ludii_verdicts(board: str) -> None:
    path = PATTERNS / f"{board}.jsonl"
    if not path.is_file():
        pytest.skip("../shared/conformance not present (outside the project)")
    with path.open() as f:
        result = check_pattern_lines(f)
    assert result.failed == 0, f"first mismatch: {result.first_mismatch}"
    assert result.passed == sum(1 for line in path.read_text().splitlines() if line.strip())


def _position(board: Board, pieces: dict[str, int]) -> list[int]:
    occupant = [0] * board.num_sites
    for label, what in pieces.items():
        occupant[board.site(label)] = what
    return occupant


def _true_sites(board: Board, walk: str, occupant: Sequence[int]) -> list[str]:
    """Labels where the walk holds, after checking that the compiled table agrees."""
    ref = [s for s in range(board.num_sites) if is_pattern(board, walk, s, occupant)]
    table = compile_pattern(board, walk)
    assert [s for s in range(board.num_sites) if pattern_at(table, s, occupant)] == ref
    return [board.labels[s] for s in ref]


def test_teeko_square_from_each_corner() -> None:
    board = load_board("square-5")
    square = {"B2": 1, "C2": 1, "B3": 1, "C3": 1}
    occupant = _position(board, {**square, "D4": 1, "A1": 2})
    assert _true_sites(board, "F R F R F", occupant) == ["B2", "C2", "B3", "C3"]
    occupant[board.site("C3")] = 2  # one corner taken by the opponent breaks it
    assert _true_sites(board, "F R F R F", occupant) == []


def test_matching_is_by_the_piece_at_from() -> None:
    board = load_board("square-5")
    occupant = _position(board, {"A1": 2, "B1": 2, "A2": 2, "B2": 2})
    assert _true_sites(board, "F R F R F", occupant) == ["A1", "B1", "A2", "B2"]
    assert not is_pattern(board, "F R F R F", board.site("C3"), occupant)  # empty from


def test_chiral_walk_tries_rotations_but_not_reflections() -> None:
    board = load_board("square-5")
    # F F R F: three in a line, then one to the right of the far end.
    rotated = _position(board, {"B3": 1, "C3": 1, "D3": 1, "D2": 1})  # heading E, turns S
    assert "B3" in _true_sites(board, "F F R F", rotated)
    mirrored = _position(board, {"B1": 1, "B2": 1, "B3": 1, "A3": 1})  # turns left instead
    assert _true_sites(board, "F F R F", mirrored) == []
    assert _true_sites(board, "F F L F", mirrored) == ["B1"]


def test_hex_turns_are_sixty_degrees() -> None:
    board = load_board("hex-3")
    centre = board.site("C3")
    ring = board.neighbours("orthogonal")[centre]
    occupant = [0] * board.num_sites
    for s in ring:
        occupant[s] = 1
    # five steps turning 60 degrees each time walk all the way round the centre
    assert set(_true_sites(board, "F R F R F R F R F R F", occupant)) == {
        board.labels[s] for s in ring
    }
    assert _true_sites(board, "F R F", occupant) and not is_pattern(
        board, "F R F", centre, occupant
    )


def test_walk_may_revisit_from() -> None:
    board = load_board("square-5")
    occupant = _position(board, {"C3": 1, "C4": 1})
    # forward, about turn, forward: back on `from`
    assert _true_sites(board, "F R R F", occupant) == ["C3", "C4"]
    table = compile_pattern(board, "F R R F")
    assert (board.site("C4"),) in table[board.site("C3")]


def test_compiled_alternatives_drop_walks_off_the_board() -> None:
    board = load_board("square-5")
    table = compile_pattern(board, "F F")
    assert table[board.site("A1")] == ((board.site("A2"), board.site("A3")), (1, 2))
    assert len(table[board.site("C3")]) == 4


def test_line_of_five_satisfies_line_four() -> None:
    board = load_board("square-8")
    occupant = _position(board, {f"{c}1": 2 for c in "ABCDE"} | {"F1": 1, "C2": 2})
    lines = compile_lines(board)
    for label in "ABCDE":
        s = board.site(f"{label}1")
        assert is_line(board, 4, s, occupant) and is_line(board, 5, s, occupant)
        assert not is_line(board, 6, s, occupant)
        assert line_at(lines, 4, s, occupant) and not line_at(lines, 6, s, occupant)
    assert not is_line(board, 2, board.site("F1"), occupant)
    assert is_line(board, 2, board.site("C2"), occupant)  # C1-C2 vertically
    assert not is_line(board, 3, board.site("C2"), occupant)
    assert not is_line(board, 1, board.site("H8"), occupant)  # empty through


def test_line_counts_contiguous_pieces_only() -> None:
    board = load_board("hex-3-5")
    row = ["A3", "B3", "C3", "D3", "E3", "F3", "G3"]
    occupant = _position(board, {label: 1 for label in row} | {"D3": 2})
    assert is_line(board, 3, board.site("A3"), occupant)
    assert not is_line(board, 4, board.site("A3"), occupant)
    assert not is_line(board, 4, board.site("G3"), occupant)
    assert is_line(board, 1, board.site("D3"), occupant)


def test_hex_line_follows_the_three_axes() -> None:
    board = load_board("hex-8")
    start = board.site("H8")
    lines = compile_lines(board)
    assert len(lines[start]) == 3
    for first, second in lines[start]:
        assert len(first) == len(second) == 7  # the centre of hex 8 sees 7 cells each way


def test_tri_lines_have_six_axes() -> None:
    board = load_board("tri-hexagon-3")
    assert all(len(axes) == 6 for axes in compile_lines(board))


@pytest.mark.parametrize("name", ["square-6", "hex-2-3", "hex-triangle-5", "tri-4", "tri-5"])
def test_compiled_forms_agree_with_the_reference(name: str) -> None:
    board = load_board(name)
    rng = random.Random(name)
    lines = compile_lines(board)
    for _ in range(30):
        occupant = [rng.choice((0, 1, 1, 2)) for _ in range(board.num_sites)]
        for walk in WALKS:
            table = compile_pattern(board, walk)
            for s in range(board.num_sites):
                assert pattern_at(table, s, occupant) == is_pattern(board, walk, s, occupant)
        for n in (3, 4):
            for s in range(board.num_sites):
                assert line_at(lines, n, s, occupant) == is_line(board, n, s, occupant)


def test_parse_walk() -> None:
    assert parse_walk("F R F") == ("F", "R", "F")
    assert parse_walk("{frl}") == ("F", "R", "L")
    with pytest.raises(ValueError, match="F, R and L"):
        parse_walk("F X F")


def test_checker_reports_the_first_mismatch() -> None:
    board = load_board("square-5")
    occupant = _position(board, {"B2": 1, "C2": 1, "B3": 1, "C3": 1})
    position = "".join("." if v == 0 else str(v) for v in occupant)
    good = {"board": "square-5", "walk": "F R F R F", "seed": 1, "position_index": 0}
    good |= {"position": position, "true_sites": [6, 7, 11, 12]}
    bad = good | {"position_index": 1, "true_sites": [6, 7, 11]}
    line = good | {"walk": None, "line": 2, "position_index": 2}
    del line["walk"]
    result = check_pattern_lines([json.dumps(good), json.dumps(line), "", json.dumps(bad)])
    assert (result.passed, result.failed) == (2, 1)
    assert check_pattern_lines([json.dumps(good)]) == (1, 0, "")
    assert "line 4: square-5 walk {F R F R F} seed 1 position 1" in result.first_mismatch
    assert "Agon true at ['C3'] but Ludii false" in result.first_mismatch
