"""The random bot: a uniformly random legal move, reproducible from the game id and seq.

Seeding each choice by (game id, seq) rather than by process makes a selfplay game's
moves a function of its id alone, whichever worker process happens to take the turn and
however often a turn is redelivered.
"""

from __future__ import annotations

import random

from bots.base import TurnContext, register_bot
from engine import State


class RandomBot:
    name = "random"

    def choose(self, state: State, context: TurnContext) -> str:
        actions = state.legal_actions()
        if not actions:
            raise ValueError(f"no legal move in game {context.game_id} at seq {context.seq}")
        rng = random.Random(f"{self.name}:{context.game_id}:{context.seq}")
        return str(state.game.move_of(actions[rng.randrange(len(actions))]))


register_bot("random", RandomBot)
