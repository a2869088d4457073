"""Hexade's rules (RULES.md §5): the swap, captures along the 12 radials, the three winning shapes.

Positions are snapshots with stones on cells named by walking the board's direction tables
from the centre, so every shape below is stated in directions, not in site numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import IllegalMoveError, load_game
from engine.core import MAX_PLIES
from engine.games.hexade import HexadeState
from services.cli.conformance import FileResult, check_trial

TRIALS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "trials"
GAME = load_game("hexade")
BOARD = GAME.board
CENTRE = "H8"


def go(label: str, *path: str) -> str:
    """The cell reached from `label` by single steps in the given directions."""
    site = BOARD.site(label)
    for d in path:
        relation = "orthogonal" if d in BOARD.directions("orthogonal") else "diagonal"
        site = BOARD.step(relation, d)[site]
        assert site >= 0, f"{label} {path} leaves the board"
    return BOARD.labels[site]


def room_for(direction: str, steps: int) -> str:
    """The first cell (in site order) from which `steps` steps in `direction` stay on the board."""
    for label in BOARD.labels:
        try:
            go(label, *[direction] * steps)
        except AssertionError:
            continue
        return label
    raise AssertionError(f"no room for {steps} x {direction}")


def position(stones: dict[str, int], mover: int = 1, ply: int = 20) -> HexadeState:
    board = ["."] * BOARD.num_sites
    for label, colour in stones.items():
        board[BOARD.site(label)] = str(colour)
    snapshot = GAME.new_initial_state().to_dict()
    snapshot.update(board="".join(board), mover=mover, ply=ply)
    state = GAME.state_from_dict(snapshot)
    assert isinstance(state, HexadeState)
    return state


def stone(state: HexadeState, label: str) -> str:
    return state.board_string()[BOARD.site(label)]


def test_swap_is_offered_once_and_exchanges_the_seats() -> None:
    state = GAME.new_initial_state()
    assert "swap" not in {str(m) for m in state.legal_moves()}
    state.apply("H8")
    moves = [str(m) for m in state.legal_moves()]
    assert moves[-1] == "swap" and len(moves) == 169 - 1 + 1
    before = state.board_string()
    state.apply("swap")
    assert state.board_string() == before
    assert state.swapped and state.current_player == 2, "colour 2 moves again after the swap"
    assert (state.seat_of(1), state.seat_of(2)) == (2, 1)
    assert state.seat_colours() == [2, 1] and state.seat_to_move == 1, "seat 1 now holds colour 2"
    assert "swap" not in {str(m) for m in state.legal_moves()}
    with pytest.raises(IllegalMoveError):
        state.apply("swap")
    state.apply("A1")
    assert state.current_player == 1 and stone(state, "A1") == "2"
    again = GAME.state_from_dict(json.loads(json.dumps(state.to_dict())))
    assert again.seat_of(1) == 2 and again.to_dict() == state.to_dict()


def test_without_a_swap_seats_are_colours() -> None:
    state = GAME.new_initial_state()
    state.apply("H8")
    state.apply("A1")
    assert not state.swapped and state.seat_of(1) == 1
    assert state.seat_colours() == [1, 2] and state.seat_to_move == 1
    assert "swap" not in {str(m) for m in state.legal_moves()}


@pytest.mark.parametrize("direction", ["E", "NNW", "SSW"])
@pytest.mark.parametrize(("run", "captured"), [(1, True), (2, True), (3, True), (4, False)])
def test_orthogonal_runs_of_one_to_three_are_captured(
    direction: str, run: int, captured: bool
) -> None:
    cells = [go(CENTRE, *[direction] * k) for k in range(1, run + 2)]
    state = position({**{c: 2 for c in cells[:-1]}, cells[-1]: 1})
    state.apply(CENTRE)
    assert [stone(state, c) for c in cells[:-1]] == ["." if captured else "2"] * run
    assert stone(state, cells[-1]) == "1" and stone(state, CENTRE) == "1"


@pytest.mark.parametrize("direction", ["ENE", "S", "WNW"])
@pytest.mark.parametrize(("run", "captured"), [(1, True), (2, True), (3, False)])
def test_diagonal_runs_of_one_or_two_are_captured(direction: str, run: int, captured: bool) -> None:
    start = room_for(direction, run + 1)
    cells = [go(start, *[direction] * k) for k in range(1, run + 2)]
    state = position({**{c: 2 for c in cells[:-1]}, cells[-1]: 1})
    state.apply(start)
    assert [stone(state, c) for c in cells[:-1]] == ["." if captured else "2"] * run


def test_no_capture_without_a_closing_friend_and_several_radials_at_once() -> None:
    east = [go(CENTRE, *["E"] * k) for k in (1, 2, 3)]
    west = [go(CENTRE, *["W"] * k) for k in (1, 2)]
    north = [go(CENTRE, *["N"] * k) for k in (1, 2)]
    stones = {east[0]: 2, east[1]: 2}  # east: closed by an empty cell, so it stays
    stones |= {west[0]: 2, west[1]: 1, north[0]: 2, north[1]: 1}
    state = position(stones)
    state.apply(CENTRE)
    assert [stone(state, c) for c in (*east[:2], west[0], north[0])] == ["2", "2", ".", "."]
    assert BOARD.site(west[0]) in state.legal_actions(), "a captured cell is empty again"


def ring_around(centre: str) -> list[str]:
    return [go(centre, d) for d in BOARD.directions("orthogonal")]


@pytest.mark.parametrize("centre_stone", [0, 1, 2])
def test_a_ring_of_six_wins_whatever_its_centre(centre_stone: int) -> None:
    ring = ring_around("F6")
    stones = {c: 1 for c in ring[:-1]} | ({"F6": centre_stone} if centre_stone else {})
    state = position(stones)
    state.apply(ring[-1])
    outcome = state.outcome()
    assert outcome is not None and (outcome.winner, outcome.reason) == (1, "ring")


def test_five_of_a_ring_and_its_centre_do_not_win() -> None:
    ring = ring_around("F6")
    state = position({c: 1 for c in ring[:-2]})
    state.apply("F6")
    assert not state.is_terminal


@pytest.mark.parametrize("last", [0, 2, 5])
def test_a_line_of_six_wins(last: int) -> None:
    line = [go("B5", *["NNE"] * k) for k in range(6)]
    state = position({c: 2 for i, c in enumerate(line) if i != last}, mover=2)
    assert not state.is_terminal
    state.apply(line[last])
    outcome = state.outcome()
    assert outcome is not None and (outcome.winner, outcome.reason) == (2, "line")


def test_five_in_a_line_do_not_win() -> None:
    line = [go("B5", *["NNE"] * k) for k in range(5)]
    state = position({c: 1 for c in line[:-1]})
    state.apply(line[-1])
    assert not state.is_terminal


TRIANGLES = {
    # corners at a, a+2E and a+2NNE, with the three middles
    "up": [(), ("E",), ("E", "E"), ("NNE",), ("NNE", "NNE"), ("E", "NNE")],
    # corners at a, a+2E and a+2SSE
    "down": [(), ("E",), ("E", "E"), ("SSE",), ("SSE", "SSE"), ("E", "SSE")],
}


@pytest.mark.parametrize("shape", sorted(TRIANGLES))
@pytest.mark.parametrize("last", range(6))
def test_a_side_three_triangle_wins_from_any_of_its_cells(shape: str, last: int) -> None:
    cells = [go("G7", *path) for path in TRIANGLES[shape]]
    state = position({c: 1 for i, c in enumerate(cells) if i != last})
    assert not state.is_terminal
    state.apply(cells[last])
    outcome = state.outcome()
    assert outcome is not None and (outcome.winner, outcome.reason) == (1, "triangle")


def test_a_capture_that_completes_nothing_does_not_win_and_the_game_goes_on() -> None:
    state = position({go(CENTRE, "E"): 2, go(CENTRE, "E", "E"): 1})
    state.apply(CENTRE)
    assert not state.is_terminal and state.current_player == 2


def test_a_full_board_forces_a_pass_until_the_move_limit() -> None:
    # Synthetic: a full board (its shapes are irrelevant) near Ludii's global move limit.
    stones = {label: 1 + i % 2 for i, label in enumerate(BOARD.labels)}
    state = position(stones, mover=2, ply=MAX_PLIES - 2)
    assert [str(m) for m in state.legal_moves()] == ["pass"]
    state.apply("pass")
    assert state.current_player == 1 and not state.is_terminal
    state.apply("pass")
    outcome = state.outcome()
    assert outcome is not None and (outcome.winner, outcome.reason) == (0, "move-limit")


@pytest.mark.parametrize("name", ["hexade.jsonl", "hexade_swap-ply1.jsonl"])
def test_replays_ludii_trials(name: str) -> None:
    path = TRIALS / name
    if not path.is_file():
        pytest.skip("../shared/conformance not present (outside the project)")
    result = FileResult(str(path))
    for line in path.read_text().splitlines()[:3]:
        check_trial(GAME, json.loads(line), result)
    assert result.failed == 0, result.first_mismatch
    assert result.passed > 0
