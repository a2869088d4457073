"""The winning shape found again on a finished game's board (`engine.winning`), no Redis."""

from __future__ import annotations

from engine import EndRule, State, load_game
from engine.games.hexade import HexadeState
from engine.winning import winning_cells


def play(game: str, moves: list[str], **options: str) -> State:
    state = load_game(game, **options).new_initial_state()
    for move in moves:
        state.apply(move)
    return state


def test_teeko_line_and_square_are_the_winners_cells() -> None:
    line = play("teeko", ["A1", "A5", "B1", "B5", "C1", "C5", "D1"])
    assert line.outcome().reason == EndRule.LINE  # type: ignore[union-attr]
    assert winning_cells(line) == ["A1", "B1", "C1", "D1"]
    square = play("teeko", ["A1", "E5", "B1", "E4", "A2", "E2", "B2"])
    assert square.outcome().reason == EndRule.SQUARE  # type: ignore[union-attr]
    assert sorted(winning_cells(square)) == ["A1", "A2", "B1", "B2"]


def test_three_cells_of_a_square_are_no_square() -> None:
    # Blue's A1, A2, B1 lack B2: only the line of four won.
    line = play("teeko", ["A1", "A5", "A2", "B5", "B1", "C5", "C1", "E5", "D1"])
    assert line.outcome().reason == EndRule.LINE  # type: ignore[union-attr]
    assert winning_cells(line) == ["A1", "B1", "C1", "D1"]


def test_a_run_of_five_shows_both_lines_of_four() -> None:
    # Blue's fifth marker joins A1-B1 and D1-E1 into a run of five.
    run = play("teeko", ["A1", "A5", "B1", "B5", "D1", "D5", "E1", "A3", "C1"])
    assert winning_cells(run) == ["A1", "B1", "C1", "D1", "E1"]


def test_hexade_line_of_six() -> None:
    game = load_game("hexade")
    state = game.new_initial_state()
    assert isinstance(state, HexadeState)
    line = game.lines[0][0]
    sites = [s for s in range(game.n) if line >> s & 1]
    labels = game.board.labels
    far = iter(s for s in range(game.n - 1, 0, -2) if not state.game.all_near[s] & line)
    for site in sites:
        state.apply(labels[site])
        if not state.is_terminal:
            state.apply(labels[next(far)])
    assert state.outcome().reason == EndRule.LINE  # type: ignore[union-attr]
    assert winning_cells(state) == [labels[s] for s in sites]


def test_games_without_a_shape_show_none() -> None:
    assert winning_cells(play("teeko", ["A1"])) == []
    assert winning_cells(load_game("supply-chains").new_initial_state()) == []
    resigned_like = play("teeko", ["A1", "A5", "B1"])
    assert winning_cells(resigned_like) == []
