"""Teeko's rules (RULES.md §4): the placement phase, the switch to movement, wins, the move limit.

Positions are built by playing moves, or from a snapshot drawn top row first.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import IllegalMoveError, InvalidMoveError, Move, load_game
from engine.core import MAX_PLIES
from engine.games.teeko import TeekoState
from services.cli.conformance import FileResult, check_trial

TRIALS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "trials"

#: 16 placements (seeded random) that complete no shape, so the game reaches movement
NO_WIN_PLACEMENTS = "C2 A3 D1 A4 E4 A2 C1 E1 A1 B5 B4 B3 E5 B1 C3 C5"


def play(moves: str, markers: str = "8") -> TeekoState:
    """The state after space-separated moves from the start."""
    state = load_game("teeko", markers=markers).new_initial_state()
    assert isinstance(state, TeekoState)
    for move in moves.split():
        state.apply(move)
    return state


def position(rows: list[str], mover: int, ply: int) -> TeekoState:
    """A state from five rows of `.`, `1`, `2`, top row first."""
    game = load_game("teeko")
    snapshot = game.new_initial_state().to_dict()
    snapshot.update(
        board="".join(row.replace(" ", "") for row in reversed(rows)), mover=mover, ply=ply
    )
    state = game.state_from_dict(snapshot)
    assert isinstance(state, TeekoState)
    return state


def expected_steps(state: TeekoState) -> set[str]:
    """Every own marker to every empty cell at king distance 1, worked out from labels."""
    labels = state.game.board.labels
    board = state.board_string()
    mover = str(state.current_player)

    def rc(label: str) -> tuple[int, int]:
        return int(label[1:]), ord(label[0])

    out = set()
    for f, t in ((f, t) for f in labels for t in labels):
        (fr, fc), (tr, tc) = rc(f), rc(t)
        own, free = board[labels.index(f)] == mover, board[labels.index(t)] == "."
        if own and free and max(abs(fr - tr), abs(fc - tc)) == 1:
            out.add(f"{f}-{t}")
    return out


def test_placement_phase_switches_to_movement_when_p2s_hand_is_empty() -> None:
    placements = NO_WIN_PLACEMENTS.split()
    state = play(" ".join(placements[:15]))
    assert state.placing and state.current_player == 2
    assert (state.hand(1), state.hand(2)) == (0, 1)
    assert all(m.kind == "place" for m in state.legal_moves())
    assert len(state.legal_moves()) == 25 - 15
    state.apply(placements[15])
    assert not state.placing and not state.is_terminal
    assert (state.hand(1), state.hand(2)) == (0, 0)
    assert state.current_player == 1
    moves = {str(m) for m in state.legal_moves()}
    assert moves == expected_steps(state) and len(moves) == 21
    with pytest.raises(IllegalMoveError):
        state.apply("D2")  # no more placing
    state.apply("A1-B2")
    assert state.board_string()[0] == "." and state.board_string()[6] == "1"
    assert {str(m) for m in state.legal_moves()} == expected_steps(state)


def test_scarnes_four_markers_switch_after_eight_placements() -> None:
    state = play("C3 E3 B1 E2 A5 E4 B4", markers="4")
    assert state.placing and len(state.legal_moves()) == 25 - 7
    state.apply("B3")
    assert not state.placing
    assert {str(m) for m in state.legal_moves()} == expected_steps(state)
    assert state.board_string().count("1") == state.board_string().count("2") == 4


@pytest.mark.parametrize(
    ("moves", "reason"),
    [
        ("A1 E5 B1 E3 A2 C5 B2", "square"),
        ("C3 A5 D3 E5 C4 A1 D4", "square"),
        ("A1 A5 B1 C5 C1 E5 D1", "line"),
        ("A1 A5 B2 C5 C3 E5 D4", "line"),
        ("E1 A5 D2 A1 C3 E5 B4", "line"),
    ],
)
def test_a_placement_completing_a_shape_wins(moves: str, reason: str) -> None:
    *before, last = moves.split()
    state = play(" ".join(before))
    assert not state.is_terminal
    state.apply(last)
    outcome = state.outcome()
    assert outcome is not None
    assert (outcome.winner, outcome.scores, outcome.reason) == (1, None, reason)
    assert state.legal_actions() == []


def test_an_almost_square_or_broken_line_does_not_win() -> None:
    state = play("A1 E5 B1 E3 A2 C5 C2 E1 D1")
    assert not state.is_terminal  # A1 B1 A2 + C2, and A1 B1 _ D1: no shape


STEP_POSITION = [
    "2 . 2 . 1",
    "1 2 . 2 .",
    ". 1 . 2 1",
    "1 . 1 . 2",
    "1 1 . 2 2",
]


def test_a_step_completing_a_square_wins() -> None:
    state = position(STEP_POSITION, mover=1, ply=20)
    assert not state.placing and "C2-B2" in {str(m) for m in state.legal_moves()}
    state.apply("C2-B2")
    outcome = state.outcome()
    assert outcome is not None and (outcome.winner, outcome.reason) == (1, "square")


def test_the_global_move_limit_ends_in_a_draw() -> None:
    state = position(STEP_POSITION, mover=1, ply=MAX_PLIES - 2)
    state.apply("E5-E4")
    assert not state.is_terminal
    state.apply("D4-C4")
    outcome = state.outcome()
    assert outcome is not None and (outcome.winner, outcome.reason) == (0, "move-limit")
    assert state.legal_actions() == []


def test_notation_and_action_codes() -> None:
    game = load_game("teeko")
    assert game.action_of(game.move_of(7)) == 7 and str(game.move_of(7)) == "C2"
    step = game.action_of(game.move_of(25 + 6 * 25 + 12))
    assert str(game.move_of(step)) == "B2-C3"
    with pytest.raises(InvalidMoveError):
        game.action_of(Move.parse("A1>N"))
    with pytest.raises(InvalidMoveError):
        load_game("teeko").new_initial_state().apply("swap")
    with pytest.raises(ValueError, match="markers"):
        load_game("teeko", markers=5)


def test_snapshot_round_trip() -> None:
    state = play(NO_WIN_PLACEMENTS)
    again = state.game.state_from_dict(json.loads(json.dumps(state.to_dict())))
    assert again.to_dict() == state.to_dict()
    assert again.legal_actions() == state.legal_actions()
    twin = state.clone()
    twin.apply(twin.legal_moves()[0])
    assert twin.to_dict() != state.to_dict() == again.to_dict()


def test_replays_ludii_trials() -> None:
    path = TRIALS / "teeko.jsonl"
    if not path.is_file():
        pytest.skip("../shared/conformance not present (outside the project)")
    game = load_game("teeko")
    result = FileResult(str(path))
    for line in path.read_text().splitlines()[:30]:
        check_trial(game, json.loads(line), result)
    assert result.failed == 0, result.first_mismatch
    assert result.passed > 0
