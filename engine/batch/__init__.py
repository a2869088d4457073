"""Batched random playouts: many games of Teeko or Hexade at once, vectorised with numpy.

The single-game engines (`engine.games`) stay the one source of truth: these engines build
their tables from the single-game tables and are tested to agree with them move for move
(every recorded action is legal there, and the result and final board match). They exist for
speed: a uniformly random playout costs one numpy step per ply for the whole batch instead of
one Python call per game and ply. `playout_batch` picks the engine for a game;
`batched_playouts_per_sec` is what the playout benchmark reports beside the single engines.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from engine.batch import hexade, teeko
from engine.batch.common import BatchResult
from engine.core import Game, load_game
from engine.games.hexade import Hexade
from engine.games.teeko import Teeko

__all__ = [
    "BATCHED_GAMES",
    "DEFAULT_GAMES",
    "BatchResult",
    "batched_playouts_per_sec",
    "playout_batch",
]

#: how many games one batch plays by default: enough that the per-step numpy overhead is
#: spread thin, few enough that a batch's arrays stay a few MB. Measured over 256..16384 on
#: one core: Teeko gains up to 8192 (short games, so the overhead of the long tail of steps
#: dominates smaller batches), Hexade levels off from 2048 to 4096.
DEFAULT_GAMES: Mapping[str, int] = {"teeko": 8192, "hexade": 4096}
BATCHED_GAMES = tuple(DEFAULT_GAMES)


def playout_batch(game: Game, n_games: int, rng: np.random.Generator) -> BatchResult:
    """Play `n_games` uniformly random games of `game` side by side."""
    if isinstance(game, Teeko):
        return teeko.playout_batch(game, n_games, rng)
    if isinstance(game, Hexade):
        return hexade.playout_batch(game, n_games, rng)
    raise ValueError(
        f"no batched engine for {game.name}; batched games: {', '.join(BATCHED_GAMES)}"
    )


def batched_playouts_per_sec(
    game_name: str, options: Mapping[str, object], seconds: float, seed: int = 1
) -> tuple[float, float]:
    """Random playouts of default-sized batches for about `seconds`: (playouts/s, plies/s).

    One small batch first builds the tables, so the figure is the steady state, as for Ludii.
    """
    game = load_game(game_name, **options)
    rng = np.random.default_rng(seed)
    n_games = DEFAULT_GAMES.get(game_name, 0)
    playout_batch(game, 16, rng)
    playouts = plies = 0
    start = time.perf_counter()
    while True:
        result = playout_batch(game, n_games, rng)
        playouts += result.n_games
        plies += result.total_plies
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return playouts / elapsed, plies / elapsed
