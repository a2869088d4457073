"""The greedy bot: the move whose resulting position evaluates best, one ply deep.

Each legal move is played on a copy and the result judged for the seat that moved
(`bots.evaluation`: warehouses and surplus, house balance and mobility, lines and shapes).
Moves are tried in an order shuffled by a generator seeded from (game id, seq), as the random
bot seeds its choice, and the first of equally good moves wins: ties are broken at random,
yet a game replays identically. Out of time, it answers with the best move seen so far.
"""

from __future__ import annotations

import random

from bots.base import TurnContext, register_bot
from bots.clock import Clock, thinking
from bots.evaluation import colour_of_seat, knowledge_of
from engine import State

#: seconds to think on a turn without a deadline; one ply rarely needs more than a tenth
BUDGET_S = 1.0


class GreedyBot:
    name = "greedy"

    def __init__(self, budget_s: float = BUDGET_S) -> None:
        self.budget_s = budget_s

    def choose(self, state: State, context: TurnContext) -> str:
        clock = Clock(context, self.budget_s)
        actions = state.legal_actions()
        if not actions:
            raise ValueError(f"no legal move in game {context.game_id} at seq {context.seq}")
        random.Random(f"{self.name}:{context.game_id}:{context.seq}").shuffle(actions)
        seat = state.seat_to_move
        evaluate = knowledge_of(state.game).evaluate
        best, best_value = actions[0], float("-inf")
        with thinking():
            for action in actions:
                child = state.clone()
                child.apply_action(action)
                value = evaluate(child, colour_of_seat(child, seat))
                if value > best_value:
                    best, best_value = action, value
                if clock.expired():
                    break
        return str(state.game.move_of(best))


register_bot("greedy", GreedyBot)
