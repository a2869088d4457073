"""Agon's rules engine: pure, deterministic rules for the five games (see RULES.md).

No I/O, no asyncio, no Redis, no pydantic: everything else builds on this.

Importing the package registers the built-in games (`engine.games`) in the registry that
`engine.core` keeps, before any of its modules can be used: `engine.core` itself imports
no game, so no engine module imports one that imports it back.
"""

from engine import games
from engine.core import (
    MAX_PLIES,
    Display,
    EndRule,
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
    "MAX_PLIES",
    "Display",
    "EndRule",
    "Game",
    "IllegalMoveError",
    "InvalidMoveError",
    "Move",
    "Outcome",
    "State",
    "game_names",
    "games",
    "load_game",
]
