"""The alpha-beta bot, made for Teeko: iterative deepening negamax with a transposition table.

Each iteration searches one ply deeper than the last, within the turn's clock, and plays the
best move of the deepest iteration that finished; an iteration that could not finish in the
time left is not begun, and one the clock runs out in is abandoned at once. Leaves are
judged by the greedy bot's evaluation (`bots.evaluation`) from the side to move; a won
position is worth more the sooner it is won, so the search plays a win in one rather than a
win in three, and delays a loss.
The transposition table, keyed by position (Teeko's two bitboards and the mover), keeps per
position the depth searched, the value as an exact value or a bound, and the best move,
which is tried first at the next visit; after it, moves that caused cut-offs before (the
history heuristic), then the rest in the engine's order, or at the root in an order shuffled
by a generator seeded from (game id, seq), so equal moves are chosen at random but replayably.

It plays any game: the sign of a child's value flips only when the seat to move changes,
which covers Supply Chains' double turns and Hexade's swap. Teeko is what it is tuned for;
other games fall back to a slower key (their snapshot) and searches a few plies deep.
"""

from __future__ import annotations

import random
import time
from collections.abc import Hashable

from bots.base import TurnContext, register_bot
from bots.clock import Clock, thinking
from bots.evaluation import WIN, Knowledge, knowledge_of
from engine import State

#: seconds to think on a turn without a deadline
BUDGET_S = 1.0
MAX_DEPTH = 64
#: the least a depth is taken to cost over the one before (its branching, after pruning,
#: is well above this in every game)
GROWTH = 2.0

EXACT, LOWER, UPPER = 0, 1, 2


class _OutOfTime(Exception):
    """The clock ran out in the middle of an iteration, which is abandoned."""


class _Search:
    """One turn's search: the game's knowledge, the clock, the transposition table and the
    history counts."""

    def __init__(self, knowledge: Knowledge, clock: Clock) -> None:
        self.knowledge = knowledge
        self.clock = clock
        #: position -> (depth, EXACT/LOWER/UPPER, value, best action)
        self.table: dict[Hashable, tuple[int, int, float, int]] = {}
        self.history: dict[int, int] = {}

    def best_action(self, state: State) -> int | None:
        entry = self.table.get(self.knowledge.position_key(state))
        return entry[3] if entry is not None else None

    def negamax(
        self, state: State, depth: int, alpha: float, beta: float, order: list[int] | None = None
    ) -> float:
        """The value of `state` for the side to move, searched `depth` plies deep."""
        # Reading the clock costs far less than a node (Overflow's take half a millisecond).
        if self.clock.expired():
            raise _OutOfTime
        if depth == 0 or state.is_terminal:
            return self.knowledge.evaluate(state, state.current_player)
        key = self.knowledge.position_key(state)
        entry = self.table.get(key)
        first = -1
        if entry is not None:
            searched, bound, value, first = entry
            if searched >= depth and (
                bound == EXACT
                or (bound == LOWER and value >= beta)
                or (bound == UPPER and value <= alpha)
            ):
                return value
        actions = self._ordered(order if order is not None else state.legal_actions(), first)
        seat = state.seat_of(state.current_player)
        start_alpha = alpha
        best_value, best = float("-inf"), actions[0]
        for action in actions:
            child = state.clone()
            child.apply_action(action)
            # Negate only when the turn passes: a player may move twice in a row.
            if child.seat_of(child.current_player) == seat:
                value = self.negamax(child, depth - 1, alpha, beta)
            else:
                value = -self.negamax(child, depth - 1, -beta, -alpha)
            if value > best_value:
                best_value, best = value, action
            alpha = max(alpha, value)
            if alpha >= beta:
                self.history[action] = self.history.get(action, 0) + depth * depth
                break
        bound = UPPER if best_value <= start_alpha else LOWER if best_value >= beta else EXACT
        self.table[key] = (depth, bound, best_value, best)
        return best_value

    def _ordered(self, actions: list[int], first: int) -> list[int]:
        """The table's best move first, then by history (stable: ties keep their order)."""
        history = self.history
        ordered = sorted(actions, key=lambda a: -history.get(a, 0))
        if first in ordered:
            ordered.remove(first)
            ordered.insert(0, first)
        return ordered


class AlphaBetaBot:
    name = "alphabeta"

    def __init__(self, max_depth: int = MAX_DEPTH, budget_s: float = BUDGET_S) -> None:
        self.max_depth = max_depth
        self.budget_s = budget_s

    def choose(self, state: State, context: TurnContext) -> str:
        actions = state.legal_actions()
        if not actions:
            raise ValueError(f"no legal move in game {context.game_id} at seq {context.seq}")
        random.Random(f"{self.name}:{context.game_id}:{context.seq}").shuffle(actions)
        best = actions[0]
        if len(actions) > 1:
            with thinking():
                clock = Clock(context, self.budget_s)  # a first turn's tables count against it
                search = _Search(knowledge_of(state.game), clock)
                best = self.search(state, actions, search)
        return str(state.game.move_of(best))

    def search(self, state: State, actions: list[int], search: _Search) -> int:
        """The best of `actions` after the deepest search the clock allows.

        A depth is not begun when the last one's time times `GROWTH` is more than the time
        left: it would be cut short, and a depth cut short is thrown away. One begun is
        abandoned the moment the clock runs out (`negamax` reads it at every node).
        """
        best = actions[0]
        clock = search.clock
        last = 0.0
        for depth in range(1, self.max_depth + 1):
            if last * GROWTH > clock.left():
                break
            began = time.monotonic()
            try:
                value = search.negamax(state, depth, float("-inf"), float("inf"), actions)
            except _OutOfTime:
                break
            last = time.monotonic() - began
            found = search.best_action(state)
            assert found is not None
            best = found
            if abs(value) > WIN / 2:
                break  # a forced win or loss: deeper will not change it
        return best


register_bot("alphabeta", AlphaBetaBot)
