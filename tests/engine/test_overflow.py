"""Overflow's rules on hand-built positions (RULES.md §3), plus a replay of Ludii's trials.

Positions are drawn top row first, one stack height per square, so a test reads like
the board; `position` turns them into a snapshot in Ludii's site order (A1 first).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import InvalidMoveError, Move, load_game
from engine.games.overflow import OverflowState
from services.cli.conformance import FileResult, check_trial

TRIALS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "trials"


def position(rows: list[str], mover: int = 1, ply: int = 10) -> OverflowState:
    """A state from rows of heights, top row first (the square board's size is their count)."""
    size = len(rows)
    heights = [int(h) for row in reversed(rows) for h in row.split()]
    game = load_game("overflow", size=size)
    snapshot = game.new_initial_state().to_dict()
    snapshot.update(heights=heights, mover=mover, ply=ply)
    state = game.state_from_dict(snapshot)
    assert isinstance(state, OverflowState)
    return state


def legal(state: OverflowState, frm: str | None = None) -> set[str]:
    moves = {str(m) for m in state.legal_moves()}
    return {m for m in moves if frm is None or m.startswith(f"{frm}>")}


def test_initial_position_and_scores() -> None:
    state = load_game("overflow").new_initial_state()
    assert state.board_string() == ",".join(["1"] * 36)
    assert state.scores() == (18, 18)
    # Every stack of one can merge onto any neighbour: reach 1 everywhere.
    assert len(state.legal_moves()) == sum(
        len(state.game.board.neighbours("adjacent")[s]) for s in range(36)
    )
    odd = load_game("overflow", size=5).new_initial_state()
    assert odd.scores() == (12, 13), "P2's house (even phase, with A1) has the extra square"


def test_contained_move_piles_the_remainder_on_the_last_occupied_square() -> None:
    state = position(
        [
            "0 0 0 0",
            "0 0 0 0",
            "1 0 0 0",
            "3 1 1 0",
        ]
    )
    # East reaches 2 squares, north only 1, so only east is "as far as possible".
    assert legal(state, "A1") == {"A1>E"}
    state.apply("A1>E")
    assert state.board_string() == "0,2,3,0,1,0,0,0,0,0,0,0,0,0,0,0"
    assert sum(int(h) for h in state.board_string().split(",")) == 6, "no disc left the board"


def test_reach_is_capped_by_the_stack() -> None:
    state = position(
        [
            "0 0 0 0",
            "0 0 0 0",
            "0 0 0 0",
            "2 1 1 1",
        ]
    )
    assert legal(state, "A1") == {"A1>E"}
    state.apply("A1>E")
    assert state.board_string().startswith("0,2,2,1,")


def test_overflow_moves_compete_with_nothing_and_discs_leave_the_board() -> None:
    state = position(
        [
            "0 0 0 0",
            "0 0 0 0",
            "0 0 1 0",
            "1 1 3 0",
        ]
    )
    # W is contained (the short ray is full) with reach 2, which beats N's reach 1; NW, NE
    # and E are overflows (ray shorter than 3 with an empty square) and are not compared.
    assert legal(state, "C1") == {"C1>W", "C1>NW", "C1>NE", "C1>E"}
    state.apply("C1>E")
    assert state.board_string() == "1,1,0,1,0,0,1,0,0,0,0,0,0,0,0,0"
    assert state.scores() == (3, 1)  # B1, D1, C2 are odd squares (P1), A1 even (P2)


def test_one_group_rule_filters_overflows() -> None:
    state = position(
        [
            "0 0 0 0",
            "0 0 0 0",
            "0 0 0 0",
            "1 1 3 0",
        ]
    )
    # C1>E and C1>NE would leave D1 / D2 apart from A1-B1; C1>NW keeps one group.
    assert legal(state, "C1") == {"C1>W", "C1>NW"}
    state.apply("C1>NW")
    assert state.board_string() == "1,1,0,0,0,1,0,0,1,0,0,0,0,0,0,0"


def test_one_group_rule_forbids_lifting_a_cut_stack() -> None:
    state = position(
        [
            "0 0 0 0",
            "0 0 0 0",
            "0 0 0 0",
            "1 2 1 0",
        ]
    )
    # B1 could go W (full short ray) or E (reach 1), but lifting it splits A1 from C1.
    assert legal(state) == {"A1>E", "C1>W"}
    state.apply("A1>E")
    assert state.board_string().startswith("0,3,1,0,")


def test_emptying_a_house_ends_the_game() -> None:
    state = position(
        [
            "0 0 0",
            "0 0 0",
            "1 1 0",
        ]
    )
    assert state.scores() == (1, 1)
    state.apply("A1>E")  # A1 is P2's only occupied square
    assert state.is_terminal and state.legal_actions() == []
    outcome = state.outcome()
    assert outcome is not None
    assert (outcome.winner, outcome.scores, outcome.reason) == (1, (1, 0), "house-emptied")


def test_notation_and_action_codes() -> None:
    game = load_game("overflow")
    assert game.action_of(Move.parse("A1>N")) == 0
    assert game.action_of(Move.parse("b1>nw")) == 1 * 8 + 7
    assert str(game.move_of(8 * 7 + 2)) == "B2>E"
    assert str(game.move_of(game.action_of(Move("pass")))) == "pass"
    with pytest.raises(InvalidMoveError):
        game.action_of(Move.parse("A1"))
    with pytest.raises(InvalidMoveError):
        game.action_of(Move.parse("G1>N"))


def test_snapshot_round_trip_and_clone() -> None:
    state = position(["0 0 0", "0 2 0", "1 1 0"], mover=2, ply=7)
    again = state.game.state_from_dict(json.loads(json.dumps(state.to_dict())))
    assert again.to_dict() == state.to_dict()
    twin = state.clone()
    twin.apply(twin.legal_moves()[0])
    assert state.to_dict() != twin.to_dict()
    assert again.to_dict() == state.to_dict(), "a clone shares nothing with its original"
    with pytest.raises(ValueError, match="overflow"):
        load_game("teeko").state_from_dict(state.to_dict())


@pytest.mark.parametrize("size", ["4", "6"])
def test_replays_ludii_trials(size: str) -> None:
    path = TRIALS / f"overflow_{size}.jsonl"
    if not path.is_file():
        pytest.skip("../shared/conformance not present (outside the project)")
    game = load_game("overflow", size=size)
    result = FileResult(str(path))
    for line in path.read_text().splitlines()[:5]:
        check_trial(game, json.loads(line), result)
    assert result.failed == 0, result.first_mismatch
    assert result.passed > 0
