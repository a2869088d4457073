"""Agon's rules engine: pure, deterministic rules for the five games (see RULES.md).

No I/O, no asyncio, no Redis, no pydantic: everything else builds on this.
"""

from engine.core import (
    Game,
    IllegalMoveError,
    InvalidMoveError,
    Move,
    Outcome,
    State,
    game_names,
    load_game,
)

ENGINE_VERSION = "1"

__all__ = [
    "ENGINE_VERSION",
    "Game",
    "IllegalMoveError",
    "InvalidMoveError",
    "Move",
    "Outcome",
    "State",
    "game_names",
    "load_game",
]
