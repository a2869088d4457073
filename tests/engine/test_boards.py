"""Boards against Ludii's topology dumps, field by field, and the geometry facts of RULES.md §0.

The dumps live in `../shared/conformance/boards/` beside the checkout; those tests skip when it
is absent. The rest (cell counts, numbering, labels, symmetry, rendering) stand on their own and
also cover sizes Ludii's dumps do not have, since the generators must work for any n.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.boards import COMPASS16, RELATIONS, Board, column_letters, load_board

SHARED = Path(__file__).resolve().parents[3] / "shared"
BOARD_DUMPS = SHARED / "conformance" / "boards"

#: every board Ludii uses for the five games, plus the Pattern article's triangular tilings
LUDII_BOARDS = [
    *(f"square-{n}" for n in range(3, 10)),
    *("hex-2-3", "hex-3", "hex-3-4", "hex-3-5", "hex-4-5", "hex-5-6", "hex-6-7", "hex-6-8"),
    *("hex-8", "hex-triangle-5", "tri-4", "tri-hexagon-3"),
]

#: the dumps' per-direction tables and the (relation, strict) step each one is
STEP_FIELDS = {
    "ortho_by_dir": ("orthogonal", False),
    "diag_by_dir": ("diagonal", False),
    "adj_by_dir": ("adjacent", False),
    "ortho_by_dir_strict": ("orthogonal", True),
    "diag_by_dir_strict": ("diagonal", True),
}

#: a spread of shapes and sizes beyond Ludii's, for the shape-independent invariants
MORE_BOARDS = ["square-1", "square-12", "hex-2", "hex-10", "hex-2-7", "hex-5-3"]
MORE_BOARDS += ["hex-triangle-8", "tri-1", "tri-7", "tri-hexagon-1", "tri-hexagon-5"]
ALL_BOARDS = LUDII_BOARDS + MORE_BOARDS


def _dump(name: str) -> dict[str, Any]:
    if not BOARD_DUMPS.is_dir():
        pytest.skip("../shared/conformance not present (outside the project)")
    data: dict[str, Any] = json.loads((BOARD_DUMPS / f"{name}.json").read_text())
    return data


def _cell_mismatches(board: Board, cell: dict[str, Any]) -> list[str]:
    """Every field of one dumped cell that the generated board gets wrong."""
    i = cell["index"]
    ours = board.cells[i]
    wrong = [
        f"{field}: {getattr(ours, field)!r} != Ludii {cell[field]!r}"
        for field in ("index", "label", "row", "col", "phase", "x", "y")
        if getattr(ours, field) != cell[field]
    ]
    for relation in RELATIONS:
        if list(board.neighbours(relation)[i]) != cell[relation]:
            wrong.append(f"{relation}: {board.neighbours(relation)[i]} != Ludii {cell[relation]}")
    for field, (relation, strict) in STEP_FIELDS.items():
        expected = cell[field]
        if list(expected) != list(board.directions(relation)):
            wrong.append(f"{field} directions {list(expected)} != {board.directions(relation)}")
        got = {d: board.step(relation, d, strict)[i] for d in expected}
        if got != expected:
            wrong.append(f"{field}: {got} != Ludii {expected}")
    return [f"site {i} ({cell['label']}) {w}" for w in wrong]


@pytest.mark.parametrize("name", LUDII_BOARDS)
def test_board_matches_ludii_dump(name: str) -> None:
    dump = _dump(name)
    board = load_board(name)
    assert board.num_sites == dump["num_cells"] == len(dump["cells"])
    for relation in RELATIONS:
        listed = dump[f"supported_{relation}_directions"]
        assert f"[{', '.join(board.directions(relation))}]" == listed, relation
    wrong = [w for cell in dump["cells"] for w in _cell_mismatches(board, cell)]
    assert not wrong, f"{len(wrong)} mismatches, first: " + "\n".join(wrong[:10])


def test_every_dump_is_covered() -> None:
    if not BOARD_DUMPS.is_dir():
        pytest.skip("../shared/conformance not present (outside the project)")
    assert sorted(p.stem for p in BOARD_DUMPS.glob("*.json")) == sorted(LUDII_BOARDS)


def _row_lengths(board: Board) -> list[int]:
    rows: dict[int, int] = {}
    for cell in board.cells:
        rows[cell.row] = rows.get(cell.row, 0) + 1
    return [rows[r] for r in sorted(rows)]


@pytest.mark.parametrize(
    ("name", "rows"),
    [
        ("hex-3-5", [5, 6, 7, 6, 5, 4, 3]),
        ("hex-3-4", [4, 5, 6, 5, 4, 3]),
        ("hex-2-3", [3, 4, 3, 2]),
        ("hex-3", [3, 4, 5, 4, 3]),
        ("hex-8", [8, 9, 10, 11, 12, 13, 14, 15, 14, 13, 12, 11, 10, 9, 8]),
        ("hex-triangle-5", [5, 4, 3, 2, 1]),
        ("tri-4", [4, 3, 3, 2, 2, 1, 1]),
    ],
)
def test_row_lengths_from_rules(name: str, rows: list[int]) -> None:
    assert _row_lengths(load_board(name)) == rows


@pytest.mark.parametrize(
    ("name", "cells"),
    [
        *[("hex-3-5", 36), ("hex-3-4", 27), ("hex-4-5", 48), ("hex-5-6", 75), ("hex-6-7", 108)],
        *[("hex-6-8", 126), ("hex-2-3", 12), ("hex-3", 19), ("hex-8", 169)],
        *[("hex-triangle-5", 15), ("tri-4", 16), ("tri-hexagon-3", 54), ("square-8", 64)],
        *[("hex-10", 3 * 10 * 9 + 1), ("tri-7", 49), ("tri-hexagon-5", 150), ("square-1", 1)],
    ],
)
def test_cell_counts(name: str, cells: int) -> None:
    assert load_board(name).num_sites == cells


@pytest.mark.parametrize("n", [3, 5, 8, 12])
def test_square_numbering(n: int) -> None:
    board = load_board(f"square-{n}")
    for cell in board.cells:
        assert cell.index == cell.row * n + cell.col
        assert cell.label == f"{'ABCDEFGHIJKL'[cell.col]}{cell.row + 1}"
        assert cell.phase == (cell.row + cell.col) % 2
    assert board.site("A1") == 0 and board.cells[0].phase == 0
    assert board.step("orthogonal", "N")[0] == n and board.step("orthogonal", "E")[0] == 1
    assert board.step("diagonal", "NE")[0] == n + 1 and board.step("orthogonal", "S")[0] == -1


@pytest.mark.parametrize("name", ALL_BOARDS)
def test_numbering_is_lexicographic_and_labels_round_trip(name: str) -> None:
    board = load_board(name)
    keys = [(c.row, c.col) for c in board.cells]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert [c.index for c in board.cells] == list(range(board.num_sites))
    assert board.labels == tuple(c.label for c in board.cells)
    assert len(set(board.labels)) == board.num_sites
    for cell in board.cells:
        assert cell.label == f"{column_letters(cell.col)}{cell.row + 1}"
        assert board.site(cell.label) == cell.index
        assert board.site(cell.label.lower()) == cell.index


@pytest.mark.parametrize("name", ALL_BOARDS)
def test_neighbours_are_symmetric_and_match_the_strict_steps(name: str) -> None:
    board = load_board(name)
    for relation in RELATIONS:
        lists = board.neighbours(relation)
        assert len(lists) == board.num_sites
        for s, nbrs in enumerate(lists):
            assert list(nbrs) == sorted(set(nbrs)) and s not in nbrs
            assert all(s in lists[t] for t in nbrs), (relation, s)
            stepped = {board.step(relation, d, strict=True)[s] for d in board.directions(relation)}
            assert stepped - {-1} == set(nbrs), (relation, s)


@pytest.mark.parametrize("name", ALL_BOARDS)
def test_adjacent_steps_reverse(name: str) -> None:
    board = load_board(name)
    for d in board.directions("adjacent"):
        back = COMPASS16[(COMPASS16.index(d) + 8) % 16]
        there, home = board.step("adjacent", d), board.step("adjacent", back)
        for s, t in enumerate(there):
            if t >= 0:
                assert home[t] == s, (d, s, t)


@pytest.mark.parametrize("name", ALL_BOARDS)
def test_adjacent_is_orthogonal_plus_corner_neighbours(name: str) -> None:
    board = load_board(name)
    for s in range(board.num_sites):
        ortho = set(board.neighbours("orthogonal")[s])
        diag = set(board.neighbours("diagonal")[s])
        adj = set(board.neighbours("adjacent")[s])
        assert ortho <= adj
        if board.kind == "hex":
            # hex diagonals are two cells away, not touching
            assert adj == ortho and not diag & adj
        elif board.kind == "square":
            assert adj == ortho | diag
        else:
            assert diag <= adj and len(ortho) <= 3 and len(adj) <= 12


def test_board_directions_in_ludii_order() -> None:
    square, hexa, tri = load_board("square-5"), load_board("hex-3"), load_board("tri-4")
    assert square.directions("orthogonal") == ("N", "E", "S", "W")
    assert square.directions("adjacent") == ("N", "NE", "E", "SE", "S", "SW", "W", "NW")
    assert hexa.directions("orthogonal") == ("NNE", "E", "SSE", "SSW", "W", "NNW")
    assert hexa.directions("diagonal") == ("N", "ENE", "ESE", "S", "WSW", "WNW")
    assert hexa.directions("adjacent") == hexa.directions("orthogonal")
    assert tri.directions("orthogonal") == ("N", "ENE", "ESE", "S", "WSW", "WNW")
    assert len(tri.directions("adjacent")) == 12


def test_hex_axial_steps() -> None:
    board = load_board("hex-3-5")
    c3 = board.site("C3")
    assert board.labels[board.step("orthogonal", "NNE")[c3]] == "D4"
    assert board.labels[board.step("orthogonal", "NNW")[c3]] == "C4"
    assert board.labels[board.step("orthogonal", "SSW")[c3]] == "B2"
    assert board.labels[board.step("diagonal", "ENE")[c3]] == "E4"


def test_tri_non_strict_orthogonal_step_lands_on_a_corner_neighbour() -> None:
    # RULES.md §6: on (tri 4), cell 1 going N lands on cell 10, which shares only a corner.
    board = load_board("tri-4")
    assert board.step("orthogonal", "N")[1] == 10
    assert board.step("orthogonal", "N", strict=True)[1] == -1
    assert 10 not in board.neighbours("orthogonal")[1]
    assert 10 in board.neighbours("diagonal")[1]
    up, down = board.cells[0], board.cells[4]
    assert (up.phase, down.phase) == (0, 1)


def test_unknown_names_and_labels() -> None:
    with pytest.raises(ValueError, match="accepted shapes"):
        load_board("octagon-3")
    with pytest.raises(ValueError):
        load_board("square-0")
    with pytest.raises(KeyError):
        load_board("square-5").site("F1")
    with pytest.raises(KeyError, match="supported"):
        load_board("square-5").step("orthogonal", "NE")
    assert load_board("hex-3-3") is load_board("hex-3")
    assert load_board("square-8") is load_board("square-8")


def test_column_letters_go_past_z() -> None:
    assert [column_letters(c) for c in (0, 25, 26, 27, 51, 52)] == [
        "A",
        "Z",
        "AA",
        "AB",
        "AZ",
        "BA",
    ]


def test_render_square_top_row_first() -> None:
    board = load_board("square-3")
    assert board.render([str(i) for i in range(9)]) == "6 7 8\n3 4 5\n0 1 2"


def test_render_hex_offsets_rows_by_half_a_cell() -> None:
    board = load_board("hex-2")
    assert board.render(list("abcdefg")) == " f g\nc d e\n a b"
    wide = board.render(["10", "2", ".", ".", ".", ".", "7"])
    assert wide.splitlines() == ["   .   7", " .   .   .", "  10   2"]


def test_render_tri_one_strip_per_line() -> None:
    board = load_board("tri-2")
    assert board.render([str(i) for i in range(4)]) == "  3\n0 2 1"


def test_render_rejects_wrong_length() -> None:
    with pytest.raises(ValueError, match="9 sites"):
        load_board("square-3").render(["."] * 8)
