"""Hexade (RULES.md §5): place stones on a side-8 hexhex; captures; ring, line or triangle wins.

Players alternately place a stone on any empty cell; at the second ply colour 2 may `swap`
instead, which leaves the board alone, exchanges which seat holds which colour and lets
colour 2 move again. After a placement, on each of the 12 `All` radials from the stone a
run of enemy stones closed by a friendly one at All-distance 2 or 3 is removed (so runs of
1-3 on the 6 orthogonal radials and 1-2 on the 6 diagonal ones, as Ludii computes it). Then
the mover wins if the stone completes a ring of six around any centre, a line of six, or a
side-3 triangle. Stones are kept per colour as bitmasks, so every win shape through a site
is one mask test; the empty cells are a sorted list updated in place.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping
from functools import cache
from typing import Any, NamedTuple

from engine.boards import Board, Relation, load_board
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

BOARD = "hex-8"
RING_WALK = "F R F R F R F R F"
#: the side-3 triangle from a corner and from a side's middle: together every triangle
TRIANGLE_WALKS = ("F F R R F F R R F", "F R R F F R R F F")
LINE_LENGTH = 6
#: a run is captured when the friendly stone closing it is this many All-steps away
CAPTURE_DISTANCES = frozenset({2, 3})


class _Tables(NamedTuple):
    """Per site: what the hot path looks up, built once per process."""

    #: the radials worth scanning: (sites outward, run lengths that capture)
    captures: tuple[tuple[tuple[tuple[int, ...], frozenset[int]], ...], ...]
    all_near: tuple[int, ...]  # the 12 All neighbours, as a bitmask
    near: tuple[int, ...]  # the 6 orthogonal neighbours, as a bitmask
    wins: tuple[tuple[int, ...], ...]  # ring, line and triangle masks through the site
    rings: tuple[tuple[int, ...], ...]
    lines: tuple[tuple[int, ...], ...]


def _all_distances(board: Board, site: int) -> list[int]:
    """Ludii's `count Steps All` from `site`: breadth-first over orthogonal and diagonal links."""
    links = [
        a + b
        for a, b in zip(board.neighbours("orthogonal"), board.neighbours("diagonal"), strict=True)
    ]
    dist = [-1] * board.num_sites
    dist[site] = 0
    frontier = [site]
    while frontier:
        nxt = []
        for s in frontier:
            for t in links[s]:
                if dist[t] < 0:
                    dist[t] = dist[s] + 1
                    nxt.append(t)
        frontier = nxt
    return dist


def _radials(board: Board, site: int) -> list[tuple[int, ...]]:
    """The 12 `All` radials from `site`: orthogonal then diagonal, each up to the edge."""
    relations: tuple[Relation, ...] = ("orthogonal", "diagonal")
    return [board.ray(r, d, site) for r in relations for d in board.directions(r)]


@cache
def _tables() -> _Tables:
    board = load_board(BOARD)
    n = board.num_sites
    captures = []
    for s in range(n):
        dist = _all_distances(board, s)
        per_site = []
        for ray in _radials(board, s):
            # A run of k enemies is closed by the friend at ray[k].
            runs = frozenset(k for k in range(1, len(ray)) if dist[ray[k]] in CAPTURE_DISTANCES)
            if runs:
                per_site.append((ray[: max(runs) + 1], runs))
        captures.append(tuple(per_site))
    rings = pattern_masks(compile_pattern(board, RING_WALK))
    lines = line_masks(compile_lines(board), LINE_LENGTH)
    triangles = [pattern_masks(compile_pattern(board, walk)) for walk in TRIANGLE_WALKS]
    wins = tuple(
        tuple(dict.fromkeys(rings[s] + lines[s] + triangles[0][s] + triangles[1][s]))
        for s in range(n)
    )

    def mask(sites: tuple[int, ...]) -> int:
        return sum(1 << t for t in sites)

    all_near = tuple(
        mask(board.neighbours("orthogonal")[s] + board.neighbours("diagonal")[s]) for s in range(n)
    )
    near = tuple(mask(board.neighbours("orthogonal")[s]) for s in range(n))
    return _Tables(tuple(captures), all_near, near, wins, rings, lines)


@register
class Hexade(Game):
    """Hexade on Ludii's `hex 8` (169 cells); no options."""

    name = "hexade"  # no OPTIONS: Ludii's Hexade has none

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        self.board = load_board(BOARD)
        self.n = n = self.board.num_sites
        #: placing on s is action s; then the swap, then the forced pass
        self.swap_action = n
        self.pass_action = n + 1
        tables = _tables()
        # The hot path reads these straight off the game: one attribute lookup each.
        self.captures = tables.captures
        self.all_near = tables.all_near
        self.near = tables.near
        self.wins = tables.wins
        self.rings = tables.rings
        self.lines = tables.lines

    def new_initial_state(self) -> HexadeState:
        return HexadeState(self, [0] * self.n, 1, 0, False, 0, None)

    def move_of(self, action: int) -> Move:
        if 0 <= action < self.n:
            return Move("place", self.board.labels[action])
        if action == self.swap_action:
            return Move("swap")
        if action == self.pass_action:
            return Move("pass")
        raise InvalidMoveError(f"{action} is not an action of {self!r}")

    def action_of(self, move: Move) -> int:
        if move.kind == "place":
            return self.site(move.cell)
        if move.kind == "swap":
            return self.swap_action
        if move.kind == "pass":
            return self.pass_action
        raise InvalidMoveError(f"{move} is not a Hexade move (place C4, swap, or pass)")

    def state_from_dict(self, data: Mapping[str, Any]) -> HexadeState:
        board = self.snapshot_board(data)
        return HexadeState(
            self,
            [".12".index(ch) for ch in board],
            int(data["mover"]),
            int(data["ply"]),
            bool(data["swapped"]),
            int(data["winner"]),
            EndRule.from_text(data["reason"]),
        )


class HexadeState(State):
    """A Hexade position: stones, the colour to move, whether the seats swapped, the result."""

    game: Hexade

    def __init__(
        self,
        game: Hexade,
        cells: list[int],
        mover: int,
        ply: int,
        swapped: bool,
        winner: int,
        reason: EndRule | None,
    ) -> None:
        self.game = game
        self.cells = cells  # per site: 0 empty, else the stone's colour
        self.mover = mover  # a colour, as Ludii's trials record it
        self.ply = ply
        self.swapped = swapped
        self.winner = winner
        self.reason = reason  # None while the game goes on
        self.bits = [0, 0, 0]  # per colour, its stones as a bitmask over sites
        for s, c in enumerate(cells):
            if c:
                self.bits[c] |= 1 << s
        self.empty = [s for s, c in enumerate(cells) if not c]  # ascending

    def seat_of(self, colour: int) -> int:
        return 3 - colour if self.swapped else colour

    # -- the unchecked path --------------------------------------------------------------
    def legal_actions(self) -> list[int]:
        if self.reason:
            return []
        actions = self.empty.copy()
        if self.ply == 1:
            actions.append(self.game.swap_action)
        return actions or [self.game.pass_action]

    def apply_action(self, action: int) -> None:
        g = self.game
        p = self.mover
        if action < g.n:
            self._place(action, p)
            self.mover = 3 - p
        elif action == g.swap_action:
            # The board stays; the seats exchange colours and colour 2 moves again.
            self.swapped = not self.swapped
        else:
            self.mover = 3 - p
        self.ply += 1
        if self.ply >= MAX_PLIES and not self.reason:
            self.reason = EndRule.MOVE_LIMIT

    def _place(self, s: int, p: int) -> None:
        g = self.game
        cells = self.cells
        bits = self.bits
        empty = self.empty
        q = 3 - p
        cells[s] = p
        del empty[bisect_left(empty, s)]
        bits[p] |= 1 << s
        # Captures: only where an enemy stone touches the new one along some radial.
        if bits[q] & g.all_near[s]:
            taken = self.captures(s, p)
            bits[q] ^= taken
            while taken:
                x = (taken & -taken).bit_length() - 1
                taken &= taken - 1
                cells[x] = 0
                insort(empty, x)
        # Wins, through the placed stone only; every shape needs a friendly neighbour of it.
        mine = bits[p]
        if mine & g.near[s]:
            for m in g.wins[s]:
                if mine & m == m:
                    self.winner = p
                    self.reason = self._shape_of(s, m)
                    break

    def captures(self, s: int, p: int) -> int:
        """The enemy stones a stone of colour `p` on `s` captures, as a bitmask: on each
        radial, a run of enemy stones closed by a friendly one at a capturing distance."""
        cells = self.cells
        q = 3 - p
        taken = 0
        for ray, runs in self.game.captures[s]:
            if cells[ray[0]] != q:
                continue
            k = 1
            for t in ray[1:]:
                if cells[t] != q:
                    if cells[t] == p and k in runs:
                        for x in ray[:k]:
                            taken |= 1 << x
                    break
                k += 1
        return taken

    def _shape_of(self, s: int, mask: int) -> EndRule:
        """The rule a winning mask belongs to, named as in RULES.md §5."""
        if mask in self.game.rings[s]:
            return EndRule.RING
        if mask in self.game.lines[s]:
            return EndRule.LINE
        return EndRule.TRIANGLE

    def clone(self) -> HexadeState:
        twin = object.__new__(HexadeState)
        twin.__dict__.update(self.__dict__)
        twin.cells = self.cells.copy()
        twin.bits = self.bits.copy()
        twin.empty = self.empty.copy()
        return twin

    # -- game facts ----------------------------------------------------------------------
    def outcome(self) -> Outcome | None:
        if not self.reason:
            return None
        return Outcome(self.winner, None, self.reason)

    def scores(self) -> None:
        return None

    def board_string(self) -> str:
        return "".join(".12"[c] for c in self.cells)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.snapshot_header(),
            "mover": self.mover,
            "swapped": self.swapped,
            "board": self.board_string(),
            "winner": self.winner,
            "reason": reason_text(self.reason),
        }
