"""The MCTS bot: UCT search over the engine's unchecked path, anytime within the turn's clock.

Each iteration walks down the tree by UCB1, adds one child for an untried move, plays the
game out from there with uniformly random moves and credits every node on the path with the
result for the seat that moved into it: 1 for a win, 1/2 for a draw, 0 for a loss (seats, not
colours, so a Hexade swap is credited to the player who made it; and a player moving twice
in a row, as in Supply Chains, is simply credited twice). Three exact rules help it:

- A move that wins at once is *decisive*: once found, its node's player is taken to play
  it, so a win in one is played and a move that allows one is refuted at the first visit.
- A pass is tried first among a node's moves: in Supplier Sabotage (and Supply Chains'
  passing variant) it can end the game at once, which a search must not overlook.
- A position that repeats one on its own path is a draw and is not searched further: the
  rules let Teeko's markers step to and fro and Hexade's stones be captured and put back
  for ever, which ends, if at all, at the move limit (a draw).

And game-specific aids, where plain UCT cannot keep up: the search is handed the game's
`Knowledge` (`bots.evaluation`) and names no game itself, as OpenSpiel's MCTS is handed an
evaluator.

- Where playouts are slow or say little (`Knowledge.cutoff`: Overflow, Teeko, Hexade), a
  playout stops after that many plies (for these three: at once) and the position is judged
  by the greedy bot's evaluation instead, squashed into (0, 1) by a logistic of
  `value / scale`. In short matches against greedy this did better than full playouts.
  In Hexade the leaf also counts a fork for the side to move (`leaf_value`): greedy, one
  ply deep, sets up two threats at once, and a search that sees threats only once they
  stand lost a fifth of its games to it.
- Where moves can be ranked before they are played (Teeko, Hexade: `priorities`), a node
  tries its moves best first and only as many as its visits allow (progressive widening:
  about 1 + sqrt(visits)), so that 169 Hexade cells do not each cost an iteration before
  the search can look at a reply.

It is seeded from (game id, seq) like the other built-in bots: untried moves are shuffled
(or ranked with ties broken) by the generator the playouts use, so a given number of
iterations (`iterations`, for tests) always gives the same move. Without a cap it stops when
the clock does (`bots.clock`) and plays the most visited move. It searches with the garbage
collector paused (`bots.clock.thinking`; its nodes keep no parent link, so the tree makes no
cycles) and frees the tree on a thread of its own once the move is on its way (`_dispose`):
either, at the stop, would cost up to a few hundred milliseconds after a long turn.
Positions are copied with `clone` and played with `apply_action`; the batched numpy engines
(`engine.batch`) play only from the initial position, so they cannot serve the playouts from
a tree's leaves.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Hashable

from bots.base import TurnContext, register_bot
from bots.clock import Clock, pause_collector, resume_collector, thinking
from bots.evaluation import Knowledge, colour_of_seat, knowledge_of
from engine import State

#: seconds to think on a turn without a deadline
BUDGET_S = 1.0
#: UCB1's exploration constant for rewards in [0, 1]
EXPLORATION = 1.0
#: how long a finished tree is kept before it is freed, so that the move goes out first
DISPOSE_AFTER_S = 0.02


class _Node:
    """A position in the tree, reached by `action` from its parent (played by `seat`).

    `untried` holds the moves not yet expanded, the next one last; `widen` limits how many
    may be expanded by the node's visits. `key` is the position's cheap key
    (`Knowledge.key`; None where the game has none); a node whose position repeats one on
    its path is a `repetition`, scored as a draw and never grown. `decisive` is a child that
    wins the game at once for the seat to move here, which that seat will surely play. A
    node holds no link to its parent (an iteration keeps its path): without cycles a tree is
    freed the moment it is dropped, not by the cyclic collector at some later turn's
    expense.
    """

    __slots__ = (
        "action",
        "children",
        "decisive",
        "key",
        "repetition",
        "reward",
        "seat",
        "untried",
        "visits",
        "widen",
    )

    def __init__(self, action: int, seat: int, untried: list[int], widen: bool) -> None:
        self.action = action
        self.seat = seat
        self.untried = untried
        self.widen = widen
        self.children: list[_Node] = []
        self.visits = 0
        #: the sum of the results for `seat`
        self.reward = 0.0
        self.key: Hashable | None = None
        self.repetition = False
        self.decisive: _Node | None = None

    def may_expand(self) -> bool:
        """Whether to add a child now rather than descend (a decisive child ends the choice)."""
        if not self.untried or self.decisive is not None:
            return False
        return not self.widen or len(self.children) <= math.sqrt(self.visits)


class MctsBot:
    name = "mcts"

    def __init__(
        self,
        iterations: int | None = None,
        budget_s: float = BUDGET_S,
        exploration: float = EXPLORATION,
        cutoff: int | None = None,
    ) -> None:
        """`cutoff`, when given, replaces the game's own (`Knowledge.cutoff`)."""
        self.iterations = iterations
        self.budget_s = budget_s
        self.exploration = exploration
        self.cutoff = cutoff

    def choose(self, state: State, context: TurnContext) -> str:
        actions = state.legal_actions()
        if not actions:
            raise ValueError(f"no legal move in game {context.game_id} at seq {context.seq}")
        if len(actions) == 1:
            return str(state.game.move_of(actions[0]))
        rng = random.Random(f"{self.name}:{context.game_id}:{context.seq}")
        with thinking():
            clock = Clock(context, self.budget_s)  # a first turn's tables count against it
            root = self.search(state, knowledge_of(state.game), rng, clock)
            best = root.decisive or max(
                root.children, key=lambda c: (c.visits, c.reward), default=None
            )
            # Out of time before a single iteration: the move the root would have tried first.
            action = best.action if best is not None else root.untried[-1]
            del best
            _dispose(root)
            del root
        return str(state.game.move_of(action))

    def search(self, state: State, knowledge: Knowledge, rng: random.Random, clock: Clock) -> _Node:
        """Grow a tree from `state` until the clock or the iteration cap stops it, with the
        game's `knowledge` for its aids.

        The clock is read before every iteration: one iteration costs well under a
        millisecond, a Hexade expansion (ranking its moves) a few.
        """
        root = self._node([], -1, 0, state, knowledge, rng)
        cutoff = self.cutoff if self.cutoff is not None else knowledge.cutoff
        c = self.exploration
        done = 0
        while self.iterations is None or done < self.iterations:
            if clock.expired():
                break
            node = root
            path = [root]
            position = state.clone()
            # Selection: UCB1 down to a node that may grow (or a finished game).
            while not node.may_expand() and node.children:
                if node.decisive is not None:
                    node = node.decisive
                else:
                    explore = c * math.sqrt(math.log(node.visits))
                    node = max(
                        node.children,
                        key=lambda ch: ch.reward / ch.visits + explore / math.sqrt(ch.visits),
                    )
                path.append(node)
                position.apply_action(node.action)
            # Expansion: one untried move.
            if node.untried and node.decisive is None:
                action = node.untried.pop()
                seat = position.seat_to_move
                position.apply_action(action)
                child = self._node(path, action, seat, position, knowledge, rng)
                node.children.append(child)
                outcome = position.outcome()
                winner = outcome.winner if outcome is not None else 0
                if winner and position.seat_of(winner) == seat:
                    node.decisive = child
                node = child
                path.append(child)
            # Playout and backpropagation: the result for seat 1; seat 2 gets the rest.
            first = 0.5 if node.repetition else self._playout(position, knowledge, rng, cutoff)
            for walk in path:
                walk.visits += 1
                walk.reward += first if walk.seat == 1 else 1.0 - first
            done += 1
        return root

    @staticmethod
    def _node(
        path: list[_Node],
        action: int,
        seat: int,
        state: State,
        knowledge: Knowledge,
        rng: random.Random,
    ) -> _Node:
        """A new node for `state`, below the nodes of `path` (root first): its moves, ranked
        where the game can rank them.

        A position that repeats one on the node's path is scored as a draw and not grown:
        the rules have nothing against repetition, so going round ends, if ever, at the
        move limit, which is a draw (unless a player turns aside, which the search sees).
        """
        key = knowledge.key(state) if knowledge.key is not None else None
        if key is not None and any(walk.key == key for walk in path):
            node = _Node(action, seat, [], widen=False)
            node.repetition = True
            return node
        actions = state.legal_actions()
        rank = knowledge.priorities
        priorities = rank(state, actions) if rank is not None and len(actions) > 1 else None
        if priorities is None:
            # A pass, which can end the game at once (all passed), is tried first.
            passing = bool(actions) and state.game.move_of(actions[-1]).kind == "pass"
            last = actions.pop() if passing else None
            rng.shuffle(actions)
            if last is not None:
                actions.append(last)
            node = _Node(action, seat, actions, widen=False)
        else:
            draw = rng.random
            ranked = sorted(zip(priorities, [draw() for _ in actions], actions, strict=True))
            node = _Node(action, seat, [a for _, _, a in ranked], widen=True)
        node.key = key
        return node

    @staticmethod
    def _playout(
        state: State, knowledge: Knowledge, rng: random.Random, cutoff: int | None
    ) -> float:
        """Random moves to the end (or `cutoff` plies): the result for seat 1 in [0, 1]."""
        draw = rng.random
        plies = 0
        while cutoff is None or plies < cutoff:  # moves are listed only when one is played
            actions = state.legal_actions()
            if not actions:
                break
            state.apply_action(actions[int(draw() * len(actions))])
            plies += 1
        if not state.is_terminal:
            value = knowledge.leaf_value(state, colour_of_seat(state, 1)) / knowledge.scale
            return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, value))))
        outcome = state.outcome()
        assert outcome is not None
        if outcome.winner == 0:
            return 0.5
        return 1.0 if state.seat_of(outcome.winner) == 1 else 0.0


def _dispose(root: _Node) -> None:
    """Free a finished tree on a thread of its own, once the move has had time to go out.

    Dropped at once, a tree of 100,000 nodes would hold the interpreter for 0.1 s in one
    piece before the move could be sent; freed node by node, the freeing lets other threads
    run between its pieces. The collector stays paused until the tree is gone, so that no
    pass of it has to walk the tree meanwhile.
    """
    paused = pause_collector()
    thread = threading.Thread(
        target=_dismantle, args=([root], paused), name="mcts-free", daemon=True
    )
    thread.start()


def _dismantle(stack: list[_Node], paused: bool) -> None:
    try:
        time.sleep(DISPOSE_AFTER_S)
        while stack:
            node = stack.pop()
            stack.extend(node.children)
            node.children = []
            node.decisive = None
    finally:
        resume_collector(paused)


register_bot("mcts", MctsBot)
