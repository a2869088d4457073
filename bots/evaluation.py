"""How good a position is for one colour, per game: what `greedy` and `alphabeta` maximise.

`evaluate(state, colour)` is positive when `colour` stands better. A finished game is worth
`WIN` (less the plies it took, so that a sooner win counts more) or its negative, with the
score margin added as a tie-break; a draw is the margin alone. Otherwise each game family has
its own measure, built once per game (its tables come from the engine's own boards and shapes):

- Supply Chains and Supplier Sabotage (`chains_value`): warehouses, from the engine's
  `scores()`, less the warehouses each deficit chain must give up, plus a little for each
  chain's surplus (room to build more) and for pieces on the board, from `display()`.
- Overflow (`overflow_value`): house balance (occupied squares of one's house against the
  other's) and mobility: how many of the opponent's occupied squares a legal move could
  empty, against how many of one's own.
- Teeko and Hexade (`ShapeValue`): every winning shape (Teeko's 2x2 squares and lines of 4,
  Hexade's rings, lines of 6 and triangles) that holds stones of one colour only counts for
  that colour, more the fuller it is; a shape one short with its gap fillable next turn is a
  threat, which wins outright for the side to move, or when the other side has two. The
  same tables rank moves before they are played (`move_priorities`, for MCTS): a cell is
  worth what a stone there adds to shapes of either colour, to build them or to block them,
  and in Hexade, before that, what it captures.

All a bot knows of one game is one `Knowledge`, built once per game and option set by
`knowledge_of` from one registry (`_BUILDERS`, keyed by game name): the evaluation and its
`scale` (how many units make a clear edge: MCTS turns `value / scale` into a probability),
where MCTS cuts a playout short (`cutoff`), what a search's leaf counts besides (Hexade's
forks), how to rank moves before they are played, and a cheap key for positions that come
back. The bots look it up once per turn and hand it to their search, which names no game.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial

import numpy as np
from numpy.typing import NDArray

from engine import Game, State
from engine.games.chains import ChainsState
from engine.games.hexade import LINE_LENGTH as HEXADE_LINE
from engine.games.hexade import RING_WALK, TRIANGLE_WALKS, HexadeState
from engine.games.overflow import OverflowState
from engine.games.teeko import LINE_LENGTH as TEEKO_LINE
from engine.games.teeko import SQUARE_WALK, TeekoState
from engine.pattern import compile_lines, compile_pattern, line_masks, pattern_masks

WIN = 1_000_000.0
#: a win next move, as sure as the evaluation can tell without searching
THREAT = WIN / 100
#: a fork for the side to move (`ShapeValue.fork_value`): two threats next move, short of
#: a capture that breaks one
FORK = THREAT / 4

Value = Callable[[State, int], float]
#: per action, how promising it looks before it is played
Priorities = Callable[[State, list[int]], list[float]]
#: a key equal for equal positions
Key = Callable[[State], Hashable]


@dataclass(frozen=True, slots=True, eq=False)
class Knowledge:
    """What the bots know of one game (with its options); `knowledge_of` builds it once.

    A search takes one and asks it, never the game's name or its state's class: so a game
    gets its aids here, in its builder, and a search works for any game (with fewer aids).
    """

    #: the evaluation of a game that goes on, positive when `colour` stands better
    value: Value
    #: evaluation units that make a clear edge (see the module's note)
    scale: float
    #: plies after which an MCTS playout is cut short and evaluated (None: played out);
    #: where playouts are slow or say little
    cutoff: int | None = None
    #: the evaluation at a search's leaf, where it counts more than `value` (`leaf_value`)
    leaf: Value | None = None
    #: per action, how promising it looks before it is played (`move_priorities`)
    priorities: Priorities | None = None
    #: a cheap key for the positions of games where they come back (`position_key`)
    key: Key | None = None

    def evaluate(self, state: State, colour: int) -> float:
        """How good `state` is for `colour` (1 or 2): positive is better."""
        if state.is_terminal:
            return terminal_value(state, colour)
        return self.value(state, colour)

    def leaf_value(self, state: State, colour: int) -> float:
        """`evaluate` as a search's leaf sees it: in Hexade a fork counts too (`fork_value`).

        A search looks a few plies deep at most, and a fork comes a ply before the two
        threats the evaluation sees: a search that only evaluates lets the greedy bot, which
        looks for two threats a ply ahead, set one up on the move after next.
        """
        if state.is_terminal or self.leaf is None:
            return self.evaluate(state, colour)
        return self.leaf(state, colour)

    def position_key(self, state: State) -> Hashable:
        """A key equal for equal positions, for transposition tables.

        Teeko and Hexade have a cheap one (`key`); any other game is keyed by its snapshot,
        which is slower but exact (and, holding the ply, never equal for a repeated position).
        """
        if self.key is not None:
            return self.key(state)
        return repr(sorted(state.to_dict().items()))


def evaluate(state: State, colour: int) -> float:
    """How good `state` is for `colour` (1 or 2): positive is better."""
    return knowledge_of(state.game).evaluate(state, colour)


def leaf_value(state: State, colour: int) -> float:
    """`evaluate` as a search's leaf sees it (`Knowledge.leaf_value`)."""
    return knowledge_of(state.game).leaf_value(state, colour)


def move_priorities(state: State, actions: list[int]) -> list[float] | None:
    """Per action, how promising it looks before it is played, where a game has a measure.

    Teeko and Hexade rank moves by their cell's worth to either colour's shapes (attack
    and defence alike); other games have no such measure and return None.
    """
    priorities = knowledge_of(state.game).priorities
    return priorities(state, actions) if priorities is not None else None


def terminal_value(state: State, colour: int) -> float:
    outcome = state.outcome()
    assert outcome is not None, "terminal_value of a game that goes on"
    margin = 0.0
    if outcome.scores is not None:
        margin = float(outcome.scores[colour - 1] - outcome.scores[2 - colour])
    if outcome.winner == 0:
        return margin
    sign = 1.0 if outcome.winner == colour else -1.0
    return sign * (WIN - state.ply) + margin


def colour_of_seat(state: State, seat: int) -> int:
    """The colour `seat` holds in `state` (they differ only after a Hexade swap)."""
    return 1 if state.seat_of(1) == seat else 2


# -- Supply Chains and Supplier Sabotage ---------------------------------------------------

#: weights: a warehouse kept, a unit of surplus (up to SURPLUS_CAP per chain), a piece
WAREHOUSE, SURPLUS, PIECE = 10.0, 2.0, 1.0
SURPLUS_CAP = 2


def chains_value(state: State, colour: int) -> float:
    assert isinstance(state, ChainsState)
    scores = state.scores()
    value = WAREHOUSE * (scores[colour - 1] - scores[2 - colour])
    for chain in state.display().chains:
        sign = 1.0 if chain.owner == colour else -1.0
        surplus = chain.surplus
        # A chain in deficit loses warehouses until it is out of it: about one per unit.
        kept = WAREHOUSE * surplus if surplus < 0 else SURPLUS * min(surplus, SURPLUS_CAP)
        value += sign * (kept + PIECE * len(chain.cells))
    return value


# -- Overflow ------------------------------------------------------------------------------

#: weights: an occupied square of one's house; a square a legal move could empty
HOUSE, MOBILITY = 10.0, 1.0


def overflow_value(state: State, colour: int) -> float:
    assert isinstance(state, OverflowState)
    scores = state.scores()
    house = state.game.house
    bit = state.game.bit
    # Moves are the same for both players: any stack may be sown by either.
    liftable = 0
    for action in state.legal_actions():
        if action != state.game.pass_action:
            liftable |= bit[action >> 3]
    exposed = (liftable & house[3 - colour]).bit_count() - (liftable & house[colour]).bit_count()
    return HOUSE * (scores[colour - 1] - scores[2 - colour]) + MOBILITY * exposed


# -- Teeko and Hexade ------------------------------------------------------------------------


#: a colour's stones in a shape are counted in one number: colour 1 in the low three bits,
#: colour 2 above them (shapes have at most 7 cells)
_CODE = np.array([0, 1, 8], np.int8)
_CODES = 64


@dataclass(frozen=True, slots=True, eq=False)
class ShapeValue:
    """The winning shapes of a placement game, and what a shape is worth by its stones.

    Moves are ranked with numpy, all shapes at once: per shape one code for the stones of
    both colours in it (`_CODE`), and per code what one more stone there adds.
    """

    #: every winning shape once, as a bitmask over sites
    shapes: tuple[int, ...]
    #: [k, shape]: the k-th site of each shape
    cells: NDArray[np.intp]
    #: by the stones of one colour in a shape the other is absent from, the shape's worth
    #: (the last, a complete shape, is a win)
    weights: tuple[float, ...]
    #: per code, what one more stone adds to a shape held by one colour (completing: WIN)
    gain: NDArray[np.float64]
    #: per site, its adjacent sites as a bitmask (Teeko's steps)
    near: tuple[int, ...]
    #: per site, the share of shapes through it: where an empty board's stones count most
    centrality: NDArray[np.float64]
    #: whether the game has Teeko's step actions (n + from * n + to, after the placements)
    steps: bool

    def __call__(self, state: State, colour: int, forks: bool = False) -> float:
        """The evaluation; with `forks` (placements only), a fork counts too (`fork_value`)."""
        assert isinstance(state, TeekoState | HexadeState)
        score, my_gaps, their_gaps = self.count(state, colour)
        if state.mover == colour:
            if my_gaps:
                return THREAT + score
            if their_gaps.bit_count() >= 2:
                return -THREAT / 2 + score
        else:
            if their_gaps:
                return -THREAT + score
            if my_gaps.bit_count() >= 2:
                return THREAT / 2 + score
        if forks and not (my_gaps or their_gaps):  # a gap to fill or block comes first
            assert isinstance(state, HexadeState)
            score += self.fork_value(state, colour)
        return score

    def fork_value(self, state: HexadeState, colour: int) -> float:
        """`FORK` for `colour` (negated for the other) when the side to move has a fork: a
        cell that leaves two gaps (two shapes one short) at once. With a gap on the board
        that comes first: `__call__` asks only where there is none."""
        mover = state.mover
        short = len(self.weights) - 2
        held = np.flatnonzero(self.codes(state) == (short - 1) * _CODE[mover])
        if held.size < 2:
            return 0.0
        sites = self.cells[:, held].T
        # Each such shape has two empty cells: a stone on either leaves the other a gap.
        pairs = sites[np.array(state.cells, np.int8)[sites] == 0].reshape(-1, 2).tolist()
        partner: dict[int, int] = {}
        for a, b in pairs:
            for cell, other in ((a, b), (b, a)):
                if partner.setdefault(cell, other) != other:
                    return FORK if mover == colour else -FORK
        return 0.0

    def codes(self, state: TeekoState | HexadeState) -> NDArray[np.int8]:
        """Per shape, the code of the stones in it."""
        if isinstance(state, HexadeState):
            cells = state.cells
        else:
            ones, twos = state.bits[1], state.bits[2]
            cells = [(ones >> s & 1) | (twos >> s & 1) << 1 for s in range(state.game.n)]
        at = _CODE[np.array(cells, np.int8)][self.cells]
        codes: NDArray[np.int8] = at.sum(axis=0, dtype=np.int8)
        return codes

    def count(self, state: TeekoState | HexadeState, colour: int) -> tuple[float, int, int]:
        """(shape score of `colour` less the other's, its fillable gaps, the other's).

        A gap is the one empty cell of a shape one stone short. A colour that places fills
        any; a colour that steps (Teeko's movement) needs a marker outside the shape beside it.
        Plain int masks: for Teeko's 44 shapes (alpha-beta's leaves) three times faster than
        numpy; Hexade's 661 take about twice as long as they would there.
        """
        mine, theirs = state.bits[colour], state.bits[3 - colour]
        my_steps = their_steps = False
        if isinstance(state, TeekoState):
            my_steps = state.hand(colour) == 0
            their_steps = state.hand(3 - colour) == 0
        weights = self.weights
        near = self.near
        short = len(weights) - 2
        score = 0.0
        my_gaps = their_gaps = 0
        for shape in self.shapes:
            a = mine & shape
            if a:
                if theirs & shape:
                    continue
                k = a.bit_count()
                score += weights[k]
                if k == short:
                    gap = shape ^ a
                    if not my_steps or mine & ~shape & near[gap.bit_length() - 1]:
                        my_gaps |= gap
            else:
                b = theirs & shape
                if not b:
                    continue
                k = b.bit_count()
                score -= weights[k]
                if k == short:
                    gap = shape ^ b
                    if not their_steps or theirs & ~shape & near[gap.bit_length() - 1]:
                        their_gaps |= gap
        return score, my_gaps, their_gaps

    def priorities(self, state: State, actions: list[int]) -> list[float]:
        """Per action, what its cell adds to shapes of either colour (to build or to block).

        Shapes with no stone yet add only their centrality; each shape held by one colour
        adds to its empty cells what one more stone of that colour would be worth there. A
        Hexade move that captures adds `CAPTURE` per stone it takes. A swap or a pass gets
        nothing.
        """
        assert isinstance(state, TeekoState | HexadeState)
        gain = self.gain[self.codes(state)]
        held = np.flatnonzero(gain)
        added = np.bincount(
            self.cells[:, held].ravel(),
            weights=np.tile(gain[held], self.cells.shape[0]),
            minlength=self.centrality.size,
        )
        values = (self.centrality + added).tolist()
        n = len(values)
        if isinstance(state, HexadeState):
            _add_captures(state, values)
        steps = n * (n + 1) if self.steps else n
        # Placing on s is action s in both games; Teeko's step f->t is n + f * n + t.
        return [values[a % n] if a < steps else 0.0 for a in actions]


#: what a Hexade move is worth first, per enemy stone it captures: more than building any
#: shape short of completing one, so that a search tries captures (its own, and the replies
#: that take a stone it has just placed) before quiet moves
CAPTURE = 1000.0


def _add_captures(state: HexadeState, values: list[float]) -> None:
    """Add `CAPTURE` per stone to each empty cell where the side to move would capture."""
    p = state.mover
    enemy = state.bits[3 - p]
    near = state.game.all_near
    for s in state.empty:
        if enemy & near[s]:
            taken = state.captures(s, p)
            if taken:
                values[s] += CAPTURE * taken.bit_count()


def _shape_value(
    masks_by_site: list[tuple[tuple[int, ...], ...]], game: Game, steps: bool
) -> ShapeValue:
    """The shapes of per-site mask tables (a walk's masks leave out their start site)."""
    shapes: set[int] = set()
    for table in masks_by_site:
        for site, masks in enumerate(table):
            shapes.update(m | 1 << site for m in masks)
    ordered = sorted(shapes)
    n = game.board.num_sites
    cells = np.array([[s for s in range(n) if shape >> s & 1] for shape in ordered], np.intp).T
    size = cells.shape[0]
    assert all(shape.bit_count() == size for shape in ordered), f"{game.name}: uneven shapes"
    # Each stone more is worth three times as much; a complete shape has already won.
    weights = (*(3.0**k - 1 for k in range(size)), WIN)
    gain = np.zeros(_CODES)
    for ones in range(size + 1):
        for twos in range(size + 1 - ones):
            if (ones == 0) != (twos == 0) and ones + twos < size:
                gain[ones + 8 * twos] = weights[ones + twos + 1] - weights[ones + twos]
    near = tuple(sum(1 << t for t in nbrs) for nbrs in game.board.neighbours("adjacent"))
    centrality = np.bincount(cells.ravel(), minlength=n) / len(ordered)
    return ShapeValue(tuple(ordered), cells, weights, gain, near, centrality, steps)


def _teeko_shapes(game: Game) -> ShapeValue:
    board = game.board
    return _shape_value(
        [
            pattern_masks(compile_pattern(board, SQUARE_WALK)),
            line_masks(compile_lines(board), TEEKO_LINE),
        ],
        game,
        steps=True,
    )


def _hexade_shapes(game: Game) -> ShapeValue:
    board = game.board
    walks = (RING_WALK, *TRIANGLE_WALKS)
    return _shape_value(
        [pattern_masks(compile_pattern(board, w)) for w in walks]
        + [line_masks(compile_lines(board), HEXADE_LINE)],
        game,
        steps=False,
    )


def _teeko_key(state: State) -> Hashable:
    """Teeko's bitboards and mover are its whole position (hands follow from the markers on
    the board); markers step to and fro, so positions come back."""
    assert isinstance(state, TeekoState)
    return (state.bits[1], state.bits[2], state.mover)


def _hexade_key(state: State) -> Hashable:
    """Hexade's bitboards and mover, whether the seats swapped and whether the swap is still
    to come (only at ply 1); stones are captured and put back, so positions come back."""
    assert isinstance(state, HexadeState)
    return (state.bits[1], state.bits[2], state.mover, state.swapped, state.ply == 1)


# -- the registry ------------------------------------------------------------------------------


def _chains(game: Game) -> Knowledge:
    return Knowledge(chains_value, scale=2 * WAREHOUSE)


def _overflow(game: Game) -> Knowledge:
    return Knowledge(overflow_value, scale=2 * HOUSE, cutoff=0)


def _teeko(game: Game) -> Knowledge:
    shapes = _teeko_shapes(game)
    return Knowledge(shapes, scale=30.0, cutoff=0, priorities=shapes.priorities, key=_teeko_key)


def _hexade(game: Game) -> Knowledge:
    shapes = _hexade_shapes(game)
    return Knowledge(
        shapes,
        scale=200.0,
        cutoff=0,
        leaf=partial(shapes, forks=True),
        priorities=shapes.priorities,
        key=_hexade_key,
    )


#: per game name, what builds its `Knowledge` from the game (its options chosen)
_BUILDERS: dict[str, Callable[[Game], Knowledge]] = {
    "supply-chains": _chains,
    "supplier-sabotage": _chains,
    "overflow": _overflow,
    "teeko": _teeko,
    "hexade": _hexade,
}

#: by game name and options, each `Knowledge` built so far
_BUILT: dict[tuple[str, tuple[tuple[str, str], ...]], Knowledge] = {}


def knowledge_of(game: Game) -> Knowledge:
    """What the bots know of `game`, for its name and options (built once)."""
    key = (game.name, tuple(sorted(game.options.items())))
    found = _BUILT.get(key)
    if found is None:
        try:
            builder = _BUILDERS[game.name]
        except KeyError:
            known = ", ".join(_BUILDERS)
            raise ValueError(f"no knowledge for game {game.name!r}; known: {known}") from None
        found = _BUILT[key] = builder(game)
    return found


def value_function(game: Game) -> Value:
    """The evaluation of a game that goes on, for `game`'s name and options (built once)."""
    return knowledge_of(game).value
