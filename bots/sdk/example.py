"""An example bot: a move that wins at once if there is one, else a random legal move.

It reads what its turn carries (the legal moves, the seat) and uses the position only to look
one move ahead. Run it against a gateway (`--register` prints the new bot's key, once):

    agon-bot --url http://localhost:8080 --register my-bot bots.sdk.example:choose
    agon-bot --url http://localhost:8080 --key KEY bots.sdk.example:choose
"""

from __future__ import annotations

import random

from engine import State
from schemas.api import TurnMessage


def choose(state: State, seconds_left: float | None, turn: TurnMessage | None = None) -> str:
    """An immediate win when one exists; otherwise random, seeded by the position. Called
    without a turn (from Python), it asks the position for the legal moves."""
    moves = turn.legal_moves if turn is not None else [str(m) for m in state.legal_moves()]
    for move in moves:
        after = state.clone()
        after.apply(move)
        outcome = after.outcome()
        if outcome is not None and outcome.winner == state.current_player:
            return move
    return random.Random(f"{state.ply}:{state.board_string()}").choice(moves)
