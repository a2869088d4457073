"""The batched playout engines agree with the single-game engines move for move.

Every batched game is replayed through the single-game `State`: each recorded action must be
among its legal actions, and the winner, ply count and final board must match. For the first
games of a batch, the legal sets the batch drew from are compared with the single engine's at
every ply, and the draws are checked to be uniform over those sets. The move limit is tested by
lowering `MAX_PLIES` in both engines' modules, and Hexade's swap by a test-only swap chance.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import engine.batch.hexade
import engine.batch.teeko
import engine.games.hexade
import engine.games.teeko
from engine import Game, State, load_game
from engine.batch import (
    BATCHED_GAMES,
    BatchResult,
    batched_playouts_per_sec,
    playout_batch,
)
from engine.batch.common import NO_ACTION, popcount, select_bits

#: games per batch whose legal sets are recorded and compared at every ply
TRACED = 12


def replay(game: Game, result: BatchResult) -> list[State]:
    """Replay every game of `result` through the single engine, checking each step; the finals."""
    finals = []
    for i in range(result.n_games):
        state = game.new_initial_state()
        for ply, action in enumerate(result.actions(i)):
            legal = state.legal_actions()
            assert action in legal, (
                f"game {i} ply {ply}: {game.move_of(action)} is not legal in"
                f" {state.board_string()!r}"
            )
            if i < len(result.legal):
                assert result.legal[i][ply] == tuple(legal), f"game {i} ply {ply}: legal sets"
            state.apply_action(action)
        outcome = state.outcome()
        assert outcome is not None, f"game {i} is not over after {state.ply} plies"
        assert outcome.winner == result.winners[i], f"game {i}: {outcome}"
        assert state.ply == result.plies[i]
        assert state.board_string() == "".join(".12"[c] for c in result.boards[i]), f"game {i}"
        assert (result.moves[i, result.plies[i] :] == NO_ACTION).all()
        if i < len(result.legal):
            assert len(result.legal[i]) == state.ply
        finals.append(state)
    return finals


def draws_look_uniform(result: BatchResult) -> None:
    """Each traced choice's place in its legal set, scaled to (0, 1), averages about one half:
    a batch that favoured low or high actions (or one direction) would drift."""
    places = [
        (legal.index(action) + 0.5) / len(legal)
        for i, plies in enumerate(result.legal)
        for action, legal in zip(result.actions(i), plies, strict=True)
        if len(legal) > 1
    ]
    assert len(places) > 300
    assert abs(float(np.mean(places)) - 0.5) < 6 * 0.29 / len(places) ** 0.5


@pytest.mark.parametrize(("markers", "n_games"), [("8", 400), ("4", 120)])
def test_teeko_batch_agrees_with_the_single_engine(markers: str, n_games: int) -> None:
    game = load_game("teeko", markers=markers)
    assert isinstance(game, engine.games.teeko.Teeko)
    result = engine.batch.teeko.playout_batch(
        game, n_games, np.random.default_rng(11), trace=TRACED
    )
    finals = replay(game, result)
    assert {s.to_dict()["reason"] for s in finals} >= {"square", "line"}
    assert set(result.winners.tolist()) >= {1, 2}
    draws_look_uniform(result)


def test_hexade_batch_agrees_with_the_single_engine() -> None:
    game = load_game("hexade")
    assert isinstance(game, engine.games.hexade.Hexade)
    result = engine.batch.hexade.playout_batch(game, 300, np.random.default_rng(12), trace=TRACED)
    finals = replay(game, result)
    assert {s.to_dict()["reason"] for s in finals} == {"ring", "line", "triangle"}
    placed = (result.moves < game.n).sum(axis=1) - (result.moves == NO_ACTION).sum(axis=1)
    stones = (result.boards > 0).sum(axis=1)
    assert (stones < placed).mean() > 0.5, "most games should see captures"
    draws_look_uniform(result)


def test_hexade_swap_agrees_with_the_single_engine() -> None:
    game = load_game("hexade")
    assert isinstance(game, engine.games.hexade.Hexade)
    result = engine.batch.hexade.playout_batch(
        game, 200, np.random.default_rng(13), trace=TRACED, swap_chance=0.5
    )
    finals = replay(game, result)
    swapped = [s for s in finals if s.swapped]
    assert 60 < len(swapped) < 140
    assert all(result.actions(i)[1] == game.swap_action for i, s in enumerate(finals) if s.swapped)
    # After a swap colour 2 moves twice in a row: both colours must still win some games.
    assert {s.to_dict()["winner"] for s in swapped} == {1, 2}
    assert any(legal[1][-1] == game.swap_action for legal in result.legal)


def test_uniform_hexade_play_swaps_about_once_in_169_games() -> None:
    game = load_game("hexade")
    result = playout_batch(game, 2048, np.random.default_rng(14))
    swaps = int((result.moves[:, 1] == game.n).sum())  # the swap is action n (Hexade.swap_action)
    assert 3 <= swaps <= 30, f"{swaps} swaps in 2048 games, about 12 expected"


@pytest.mark.parametrize(
    ("name", "options", "limit"),
    [("teeko", {"markers": "4"}, 40), ("hexade", {}, 30)],
)
def test_the_move_limit_draws_in_both_engines(
    monkeypatch: pytest.MonkeyPatch, name: str, options: dict[str, str], limit: int
) -> None:
    for module in (
        engine.batch.teeko,
        engine.games.teeko,
        engine.batch.hexade,
        engine.games.hexade,
    ):
        monkeypatch.setattr(module, "MAX_PLIES", limit)
    game = load_game(name, **options)
    result = playout_batch(game, 150, np.random.default_rng(15))
    finals = replay(game, result)
    limited = [s for s in finals if s.to_dict()["reason"] == "move-limit"]
    assert limited, "some games should reach the lowered limit"
    assert all(s.ply == limit for s in limited)
    assert result.plies.max() == limit
    assert (result.winners[result.plies == limit] == 0).sum() == len(limited)


def test_select_bits_and_popcount_match_python() -> None:
    rng = np.random.default_rng(16)
    values = rng.integers(1, 1 << 62, 500, dtype=np.int64)
    values[:50] &= 0xFFFF  # sparse values too
    values[50] = 1
    counts = popcount(values)
    assert counts.tolist() == [bin(int(v)).count("1") for v in values]
    k = (rng.random(values.size) * counts).astype(np.int64)
    expected = [
        [b for b in range(64) if int(v) >> b & 1][int(j)] for v, j in zip(values, k, strict=True)
    ]
    assert select_bits(values, k).tolist() == expected


def test_batched_rates_are_measured_and_other_games_refused() -> None:
    playouts, plies = batched_playouts_per_sec("teeko", {}, 0.01)
    assert playouts > 0
    assert 7 < plies / playouts < 100, "Teeko playouts last 7 plies at least, about 24 on average"
    assert BATCHED_GAMES == ("teeko", "hexade")
    with pytest.raises(ValueError, match="teeko, hexade"):
        playout_batch(load_game("overflow"), 4, np.random.default_rng(0))


def test_teeko_first_moves_cover_the_board() -> None:
    game = load_game("teeko")
    result = playout_batch(game, 200, np.random.default_rng(17))
    first_moves = Counter(result.moves[:, 0].tolist())
    assert set(first_moves) == set(range(game.board.num_sites)), "every cell is a first move"
