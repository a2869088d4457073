"""Teeko (RULES.md §4): place markers from the hand on a 5x5 board, then step them; 2x2 or 4 wins.

Each player holds 8 markers, as in Ludii (or 4 with `markers=4`, Scarne's standard game).
While P2's hand is not empty the mover places a marker on any empty cell; then both step one
marker to an 8-adjacent empty cell. The mover wins when the marker just placed or moved
completes a 2x2 square (`{F R F R F}`) or a line of at least 4 (`Line 4`); nothing else ends
the game but Ludii's global move limit (a draw). The hot path keeps per-colour bitboards:
a colour's markers come from two table lookups, a marker's steps from one more, and the win
check is a few mask tests through the last marker only.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, NamedTuple

from engine.boards import load_board
from engine.core import (
    MAX_PLIES,
    EndRule,
    Game,
    InvalidMoveError,
    Move,
    Outcome,
    State,
    reason_text,
    register,
)
from engine.pattern import compile_lines, compile_pattern, line_masks, pattern_masks

#: The 2x2 square, walked from each of its corners (RULES.md §4).
SQUARE_WALK = "F R F R F"
LINE_LENGTH = 4
BOARD = "square-5"
SITES = 25
#: The movement generator splits a colour's bitmask at this site to find its markers by lookup.
HALF = 13
LOW_MASK = (1 << HALF) - 1


class _Tables(NamedTuple):
    """Everything the hot path looks up, built once per process (the board never changes)."""

    #: per action: (bits to flip, neighbours of the marker's cell, win masks through it);
    #: the pass flips nothing
    effects: tuple[tuple[int, int, tuple[int, ...]], ...]
    #: own markers of the low / high half of the sites (bitmask) -> per marker, ascending:
    #: (its neighbours, its step actions keyed by which of those are empty)
    low_markers: tuple[tuple[tuple[int, dict[int, tuple[int, ...]]], ...], ...]
    high_markers: tuple[tuple[tuple[int, dict[int, tuple[int, ...]]], ...], ...]
    square_masks: tuple[tuple[int, ...], ...]


def _steps_by_empty(n: int, frm: int, targets: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
    """Every subset of `frm`'s neighbours (as a bitmask) -> the step actions onto it, ascending."""
    table = {}
    for subset in range(1 << len(targets)):
        chosen = [t for i, t in enumerate(targets) if subset >> i & 1]
        table[sum(1 << t for t in chosen)] = tuple(n + frm * n + t for t in chosen)
    return table


@cache
def _tables() -> _Tables:
    board = load_board(BOARD)
    n = board.num_sites
    assert n == SITES
    adjacent = board.neighbours("adjacent")
    near = tuple(sum(1 << t for t in adjacent[s]) for s in range(n))
    squares = pattern_masks(compile_pattern(board, SQUARE_WALK))
    lines = line_masks(compile_lines(board), LINE_LENGTH)
    wins = tuple(squares[s] + lines[s] for s in range(n))
    effects = [(1 << s, near[s], wins[s]) for s in range(n)]
    effects += [(1 << f | 1 << t, near[t], wins[t]) for f in range(n) for t in range(n)]
    effects.append((0, 0, ()))
    per_marker = [(near[f], _steps_by_empty(n, f, adjacent[f])) for f in range(n)]
    low = tuple(
        tuple(per_marker[f] for f in range(HALF) if own >> f & 1) for own in range(1 << HALF)
    )
    high = tuple(
        tuple(per_marker[f] for f in range(HALF, n) if own << HALF >> f & 1)
        for own in range(1 << (n - HALF))
    )
    return _Tables(tuple(effects), low, high, squares)


@register
class Teeko(Game):
    """Teeko with `markers` markers per player (default 8, Ludii's; 4 is Scarne's)."""

    name = "teeko"
    OPTIONS = {"markers": ("8", "4")}

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self.markers = int(self.options["markers"])
        self.board = load_board(BOARD)
        self.n = n = self.board.num_sites
        #: placing on s is action s, stepping f->t is n + f*n + t, the forced pass comes last
        self.pass_action = n + n * n
        self.full = (1 << n) - 1
        tables = _tables()
        # The hot path reads these straight off the game: one attribute lookup each.
        self.effects = tables.effects
        self.low_markers = tables.low_markers
        self.high_markers = tables.high_markers
        self.square_masks = tables.square_masks

    def new_initial_state(self) -> TeekoState:
        return TeekoState(self, [0, 0, 0], 1, 0, 0, None, list(range(self.n)))

    def move_of(self, action: int) -> Move:
        n = self.n
        labels = self.board.labels
        if 0 <= action < n:
            return Move("place", labels[action])
        if action == self.pass_action:
            return Move("pass")
        if not n <= action < self.pass_action:
            raise InvalidMoveError(f"{action} is not an action of {self!r}")
        frm, to = divmod(action - n, n)
        return Move("step", labels[frm], labels[to])

    def action_of(self, move: Move) -> int:
        if move.kind == "place":
            return self.site(move.cell)
        if move.kind == "step":
            return self.n + self.site(move.cell) * self.n + self.site(move.to)
        if move.kind == "pass":
            return self.pass_action
        raise InvalidMoveError(f"{move} is not a Teeko move (place C4, step C4-D5, or pass)")

    def state_from_dict(self, data: Mapping[str, Any]) -> TeekoState:
        board = self.snapshot_board(data)
        bits = [0, 0, 0]
        for s, ch in enumerate(board):
            if ch != ".":
                bits[int(ch)] |= 1 << s
        if max(bits[1].bit_count(), bits[2].bit_count()) > self.markers:
            raise ValueError(f"snapshot board {board!r} has more than {self.markers} markers")
        return TeekoState(
            self,
            bits,
            int(data["mover"]),
            int(data["ply"]),
            int(data["winner"]),
            EndRule.from_text(data["reason"]),
        )


class TeekoState(State):
    """A Teeko position: per-colour bitboards, the colour to move, the result.

    Hands need no storage: with no captures, a hand holds `markers` minus the colour's
    markers on the board.
    """

    game: Teeko

    def __init__(
        self,
        game: Teeko,
        bits: list[int],
        mover: int,
        ply: int,
        winner: int,
        reason: EndRule | None,
        empty: list[int] | None = None,
    ) -> None:
        self.game = game
        self.bits = bits  # per colour (index 1, 2), its markers as a bitmask over sites
        self.mover = mover
        self.ply = ply
        self.winner = winner
        self.reason = reason  # None while the game goes on
        if empty is None:
            occupied = bits[1] | bits[2]
            empty = [s for s in range(game.n) if not occupied >> s & 1]
        # Ascending empty cells, kept only while placing: the movement phase never reads it.
        self.empty = empty

    def hand(self, colour: int) -> int:
        """Markers `colour` has not placed yet."""
        return self.game.markers - self.bits[colour].bit_count()

    @property
    def placing(self) -> bool:
        """The placement phase lasts while P2 has markers in hand (RULES.md §4)."""
        return self.bits[2].bit_count() < self.game.markers

    # -- the unchecked path --------------------------------------------------------------
    def legal_actions(self) -> list[int]:
        if self.reason:
            return []
        g = self.game
        bits = self.bits
        if bits[2].bit_count() < g.markers:  # `placing`, inlined on the hot path
            return self.empty.copy()
        own = bits[self.mover]
        empty = g.full ^ (own | bits[3 - self.mover])
        actions: list[int] = []
        # Ascending: markers in site order, each one's steps ascending.
        for near, steps in g.low_markers[own & LOW_MASK] + g.high_markers[own >> HALF]:
            actions += steps[empty & near]
        return actions or [g.pass_action]

    def apply_action(self, action: int) -> None:
        p = self.mover
        if action < SITES:
            self.empty.remove(action)
        flip, near, wins = self.game.effects[action]
        if flip:
            bits = self.bits[p] ^ flip
            self.bits[p] = bits
            # The end rule looks only through the marker just placed or moved (`last To`);
            # every winning shape needs a friendly neighbour of it, which most moves lack.
            if bits & near:
                for m in wins:
                    if bits & m == m:
                        self._win(p, action, m)
                        break
        ply = self.ply + 1
        self.ply = ply
        if ply >= MAX_PLIES and not self.reason:
            self.reason = EndRule.MOVE_LIMIT
        self.mover = 3 - p

    def _win(self, colour: int, action: int, mask: int) -> None:
        to = action if action < SITES else (action - SITES) % SITES
        self.winner = colour
        self.reason = EndRule.SQUARE if mask in self.game.square_masks[to] else EndRule.LINE

    def clone(self) -> TeekoState:
        return TeekoState(
            self.game,
            self.bits.copy(),
            self.mover,
            self.ply,
            self.winner,
            self.reason,
            self.empty.copy(),
        )

    # -- game facts ----------------------------------------------------------------------
    def outcome(self) -> Outcome | None:
        if not self.reason:
            return None
        return Outcome(self.winner, None, self.reason)

    def scores(self) -> None:
        return None

    def board_string(self) -> str:
        b1, b2 = self.bits[1], self.bits[2]
        return "".join(".12"[(b1 >> s & 1) | (b2 >> s & 1) << 1] for s in range(self.game.n))

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.snapshot_header(),
            "mover": self.mover,
            "board": self.board_string(),
            "winner": self.winner,
            "reason": reason_text(self.reason),
        }
