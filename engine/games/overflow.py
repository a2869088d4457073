"""Overflow (RULES.md §3): sow stacks of neutral discs on an nxn board, one 8-connected group.

Either player sows any stack toward one of the 8 directions: an *overflow* move when the
ray to the edge is shorter than the stack and holds an empty square (one disc per ray
square, the rest leave the game), otherwise a *contained* move onto the occupied squares
ahead, the remainder piled on the last one, restricted to the directions of greatest reach
among the stack's contained-eligible ones. Every move must leave the occupied squares one
8-connected group. A player's score is the number of occupied squares of their house
(P1 the odd-phase squares, P2 the even ones, A1 included); emptying a house ends the game.
Heights live in a plain list per site; occupancy also lives in a padded bitboard (one
spare column per row) so the group rule is a few shifts instead of a graph search.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.boards import load_board
from engine.core import (
    MAX_PLIES,
    SOW_DIRECTIONS,
    EndRule,
    Game,
    InvalidMoveError,
    Move,
    Outcome,
    State,
    reason_text,
    register,
)


def _ring_is_connected(config: int) -> bool:
    """Whether the occupied cells of a 3x3 window (centre bit 4 excluded) touch each other.

    Bit k of `config` is window cell (k // 3, k % 3). If a stack's occupied neighbours are
    8-connected among themselves, every path through the stack has a detour around it, so
    lifting the stack cannot split the group; otherwise only a full flood fill can tell.
    """
    cells = [k for k in range(9) if k != 4 and config >> k & 1]
    if not cells:
        return False
    seen = {cells[0]}
    todo = [cells[0]]
    while todo:
        a = todo.pop()
        for b in cells:
            if b not in seen and abs(a // 3 - b // 3) <= 1 and abs(a % 3 - b % 3) <= 1:
                seen.add(b)
                todo.append(b)
    return len(seen) == len(cells)


_LOCAL_CUT_SAFE = tuple(_ring_is_connected(c) for c in range(512))


def _reach(heights: list[int], ray: tuple[int, ...], h: int) -> int:
    """How many squares of `ray` from the first are occupied in a row, at most `h`."""
    reach = 0
    for t in ray[:h]:
        if not heights[t]:
            break
        reach += 1
    return reach


@register
class Overflow(Game):
    """Overflow on a `size`x`size` board (default 6)."""

    name = "overflow"
    OPTIONS = {"size": ("6", "3", "4", "5", "7", "8")}

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        n = int(self.options["size"])
        self.board = load_board(f"square-{n}")
        sites = self.board.num_sites
        self.pass_action = 8 * sites
        width = n + 1  # one padding column separates the rows in the bitboard
        self.width = width
        pos = [(s // n + 1) * width + s % n + 1 for s in range(sites)]
        self.pos = tuple(pos)
        self.bit = tuple(1 << p for p in pos)
        #: per site, per direction (SOW_DIRECTIONS order), the squares up to the edge
        self.rays = tuple(
            tuple(self.board.ray("adjacent", d, s) for d in SOW_DIRECTIONS) for s in range(sites)
        )
        self.ray_bits = tuple(
            tuple(sum(self.bit[t] for t in ray) for ray in per_dir) for per_dir in self.rays
        )
        phases = [c.phase for c in self.board.cells]
        #: house masks: P1 owns phase 1, P2 phase 0 (RULES.md §3)
        self.house = (
            0,
            sum(self.bit[s] for s in range(sites) if phases[s] == 1),
            sum(self.bit[s] for s in range(sites) if phases[s] == 0),
        )
        self.full = sum(self.bit)

    def new_initial_state(self) -> OverflowState:
        sites = self.board.num_sites
        return OverflowState(self, [1] * sites, self.full, 1, 0, 0, None)

    def move_of(self, action: int) -> Move:
        if action == self.pass_action:
            return Move("pass")
        if not 0 <= action < self.pass_action:
            raise InvalidMoveError(f"{action} is not an action of {self!r}")
        frm, d = divmod(action, 8)
        return Move("sow", self.board.labels[frm], direction=SOW_DIRECTIONS[d])

    def action_of(self, move: Move) -> int:
        if move.kind == "pass":
            return self.pass_action
        if move.kind != "sow":
            raise InvalidMoveError(f"{move} is not an Overflow move (sow a stack: C4>NE, or pass)")
        return self.site(move.cell) * 8 + SOW_DIRECTIONS.index(move.direction)

    def state_from_dict(self, data: Mapping[str, Any]) -> OverflowState:
        self.check_snapshot(data)
        heights = [int(h) for h in data["heights"]]
        if len(heights) != self.board.num_sites or min(heights) < 0:
            raise ValueError(f"snapshot heights do not fit {self.board.name}: {heights}")
        occ = sum(b for b, h in zip(self.bit, heights, strict=True) if h)
        return OverflowState(
            self,
            heights,
            occ,
            int(data["mover"]),
            int(data["ply"]),
            int(data["winner"]),
            EndRule.from_text(data["reason"]),
        )


class OverflowState(State):
    """An Overflow position: stack heights, the colour to move and, once over, the result."""

    game: Overflow

    def __init__(
        self,
        game: Overflow,
        heights: list[int],
        occ: int,
        mover: int,
        ply: int,
        winner: int,
        reason: EndRule | None,
    ) -> None:
        self.game = game
        self.heights = heights
        self.occ = occ  # padded bitboard of occupied squares
        self.mover = mover
        self.ply = ply
        self.winner = winner
        self.reason = reason  # None while the game goes on

    # -- the group rule ----------------------------------------------------------------
    def _one_group(self, occ: int) -> bool:
        """Whether `occ` is exactly one 8-connected group (Ludii's `count Groups` is 1)."""
        if not occ:
            return False
        w = self.game.width
        x = occ & -occ
        while True:
            h = x | (x << 1) | (x >> 1)
            y = (h | (h << w) | (h >> w)) & occ
            if y == x:
                return x == occ
            x = y

    def _can_lift(self, frm: int) -> bool:
        """Whether the group stays one group once the stack on `frm` is gone."""
        g = self.game
        occ = self.occ
        p = g.pos[frm]
        w = g.width
        window = (
            (occ >> (p - w - 1) & 7) | (occ >> (p - 1) & 5) << 3 | (occ >> (p + w - 1) & 7) << 6
        )
        return _LOCAL_CUT_SAFE[window] or self._one_group(occ ^ g.bit[frm])

    # -- the unchecked path --------------------------------------------------------------
    def legal_actions(self) -> list[int]:
        if self.reason:
            return []
        g = self.game
        heights = self.heights
        rays = g.rays
        bits = g.bit
        occ = self.occ
        actions: list[int] = []
        for frm, h in enumerate(heights):
            if not h:
                continue
            # Phase 1: classify each direction, keeping the contained ones of greatest reach.
            best = 0
            contained: list[int] = []
            overflow: list[int] = []
            for d, ray in enumerate(rays[frm]):
                if not ray:
                    continue
                reach = 0  # `_reach`, inlined: this loop is the hot path
                for t in ray[:h]:
                    if not heights[t]:
                        break
                    reach += 1
                if h > len(ray) and reach < len(ray):
                    overflow.append(d)
                elif reach > best:
                    best = reach
                    contained = [d]
                elif reach == best and reach:
                    contained.append(d)
            # Phase 2: the group rule. A contained move only empties `frm`; an overflow
            # move also fills the whole ray, which may reconnect what `frm` held together.
            if contained and not self._can_lift(frm):
                contained = []
            if overflow:
                lifted = occ ^ bits[frm]
                ray_bits = g.ray_bits[frm]
                overflow = [d for d in overflow if self._one_group(lifted | ray_bits[d])]
            base = frm * 8
            actions.extend(base + d for d in sorted(contained + overflow))
        return actions or [g.pass_action]

    def apply_action(self, action: int) -> None:
        g = self.game
        if action != g.pass_action:
            self._sow(*divmod(action, 8))
            occ = self.occ
            p1 = (occ & g.house[1]).bit_count()
            p2 = (occ & g.house[2]).bit_count()
            if not (p1 and p2):
                self.winner = 1 if p1 else 2
                self.reason = EndRule.HOUSE_EMPTIED
        self.ply += 1
        if not self.reason and self.ply >= MAX_PLIES:
            self.reason = EndRule.MOVE_LIMIT
        self.mover = 3 - self.mover

    def _sow(self, frm: int, d: int) -> None:
        g = self.game
        heights = self.heights
        bits = g.bit
        ray = g.rays[frm][d]
        h = heights[frm]
        heights[frm] = 0
        occ = self.occ ^ bits[frm]
        reach = _reach(heights, ray, h)
        if h > len(ray) and reach < len(ray):
            # overflow: one disc on every ray square, the rest leave the game
            for t in ray:
                heights[t] += 1
            occ |= g.ray_bits[frm][d]
        else:
            # contained: one disc per square up to the reach, the remainder on the last
            for t in ray[: reach - 1]:
                heights[t] += 1
            heights[ray[reach - 1]] += h - (reach - 1)
        self.occ = occ

    def clone(self) -> OverflowState:
        return OverflowState(
            self.game, self.heights.copy(), self.occ, self.mover, self.ply, self.winner, self.reason
        )

    # -- game facts ----------------------------------------------------------------------
    def outcome(self) -> Outcome | None:
        if not self.reason:
            return None
        return Outcome(self.winner, self.scores(), self.reason)

    def scores(self) -> tuple[int, int]:
        house = self.game.house
        return (self.occ & house[1]).bit_count(), (self.occ & house[2]).bit_count()

    def board_string(self) -> str:
        return ",".join(map(str, self.heights))

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.snapshot_header(),
            "mover": self.mover,
            "heights": list(self.heights),
            "winner": self.winner,
            "reason": reason_text(self.reason),
        }
