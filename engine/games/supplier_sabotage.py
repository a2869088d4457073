"""Supplier Sabotage (RULES.md §2): place or pass, then clear every deficit, own ones first.

A warehouse is a piece from which the board's Pattern walk succeeds (hex boards
`{F R R F R R F}`: a corner of a solid friendly triangle; square boards
`{F R R F R F R}`: an L corner of two perpendicular friendly neighbours); any other piece
is a supplier. Chains and the suppliers around them follow the Connectivity option's
`dirChains`. A turn starts with a placement on any empty site except the mover's last
self-removal site (remembered forever), or a pass; while any deficit warehouse exists
the same player goes on, removing one of their own deficit warehouses if they have any,
else one of the opponent's. Two consecutive single-pass turns end the game: most
warehouses wins, and equal warehouses are decided (and scored) by pieces on the board.

Ludii writes max(0, surplus) on every piece after every ply but does not show it; as it
never keeps a stale value, `surplus_values` is a function of the position.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.boards import Relation, load_board
from engine.core import MAX_PLIES, EndRule, register
from engine.games.chains import ChainsGame, ChainsState, pattern_sites

#: the warehouse walks of SupplierSabotage.lud per board kind ("HexPattern", "SquarePattern1")
WAREHOUSE_WALKS = {"hex": "F R R F R R F", "square": "F R R F R F R"}


@register
class SupplierSabotage(ChainsGame):
    """Supplier Sabotage with Ludii's options: board, connectivity (RULES.md §8)."""

    name = "supplier-sabotage"
    OPTIONS = {
        "board": (
            "hex-3-5",
            "hex-2-3",
            "hex-triangle-5",
            "hex-3",
            "hex-3-4",
            "hex-4-5",
            "hex-5-6",
            "hex-6-7",
            "hex-6-8",
            "square-5",
            "square-7",
            "square-9",
        ),
        "connectivity": ("orthogonal", "square-option"),
    }

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        board = load_board(self.options["board"])
        self.warehouse_walk = WAREHOUSE_WALKS[board.kind]
        # "Square Option" chains (and the suppliers around them) by Adjacent; warehouses
        # always come from the orthogonal walk, whatever the option says.
        square_option = self.options["connectivity"] == "square-option"
        relation: Relation = "adjacent" if square_option else "orthogonal"
        self.setup_board(board, relation)

    def warehouses(self, pieces: int) -> int:
        return pattern_sites(pieces, self.walk)

    def new_initial_state(self) -> SupplierSabotageState:
        state = SupplierSabotageState(self)
        state.init_board(0, 0)
        return state

    def state_from_dict(self, data: Mapping[str, Any]) -> SupplierSabotageState:
        state = SupplierSabotageState(self)
        self.restore_common(state, data)
        state.prev = int(data["prev"])
        state.banned = [-1, *(int(s) for s in data["banned"])]
        return state


class SupplierSabotageState(ChainsState):
    """A Supplier Sabotage position: the board, the mover, who moved last, the banned cells."""

    game: SupplierSabotage

    def __init__(self, game: SupplierSabotage) -> None:
        self.game = game
        self.mover = 1
        #: who played the previous ply (0 before the first): the same as the mover means
        #: the turn goes on with removals ("NewTurn" is false)
        self.prev = 0
        self.ply = 0
        #: per colour, Ludii's player value: the site of its latest self-removal, or -1
        self.banned = [-1, -1, -1]
        self.passed = [False, False, False]
        self.reason = None

    def clone(self) -> SupplierSabotageState:
        other = SupplierSabotageState.__new__(SupplierSabotageState)
        other.game = self.game
        other.mover = self.mover
        other.prev = self.prev
        other.ply = self.ply
        other.banned = self.banned[:]
        other.passed = self.passed[:]
        other.reason = self.reason
        self.copy_board_into(other)
        return other

    # -- legal moves ----------------------------------------------------------------------
    def compute_legal(self) -> list[int]:
        if self.reason:
            return []
        game = self.game
        mover = self.mover
        if self.prev == mover:
            # Continuation: own deficit warehouses first, then the opponent's (priority).
            deficits = self.deficits()
            return self.removals(deficits[mover] or deficits[3 - mover])
        # A new turn: place anywhere empty but on the last self-removal site, or pass.
        banned = self.banned[mover]
        actions = self.placements(game.bit[banned] if banned >= 0 else 0)
        actions.append(game.pass_action)
        return actions

    def is_legal(self, action: int) -> bool:
        """`action in self.legal_actions()`, deciding only that action (the checked path)."""
        if self.reason:
            return False
        game = self.game
        mover = self.mover
        if self.prev == mover:
            deficits = self.deficits()
            return self.removes_from(deficits[mover] or deficits[3 - mover], action)
        if action == game.pass_action:
            return True
        if 0 <= action < game.n:
            empty = not (self.pieces[1] | self.pieces[2]) & game.bit[action]
            return empty and action != self.banned[mover]
        return False

    # -- playing ----------------------------------------------------------------------------
    def apply_action(self, action: int) -> None:
        game = self.game
        n = game.n
        mover = self.mover
        self._legal = None
        self.ply += 1
        if action == game.pass_action:
            self.passed[mover] = True
        else:
            if action >= n:
                site = action - n
                owner = self.owner(site)
                self.remove(owner, site)
                if owner == mover:
                    self.banned[mover] = site
            else:
                self.place(mover, action)
            self.passed[mover] = False
        self.prev = mover
        deficits = self.deficits()
        if deficits[1] or deficits[2]:
            pass  # moveAgain: the same player clears the deficits
        else:
            self.mover = 3 - mover
            if self.passed[1] and self.passed[2]:
                self.reason = EndRule.ALL_PASSED
        if self.ply >= MAX_PLIES and not self.reason:
            self.reason = EndRule.MOVE_LIMIT

    # -- derived views and results ----------------------------------------------------------
    def surplus_values(self) -> list[int | None]:
        values: list[int | None] = [None] * self.game.n
        sites = self.game.grid.sites
        for colour in (1, 2):
            for cells, surplus in self.chain_surpluses(colour):
                for s in sites(cells):
                    values[s] = max(0, surplus)
        return values

    def scores(self) -> tuple[int, int]:
        """Warehouses; at a natural end with equal warehouses, pieces on the board instead."""
        w1, w2 = self.warehouse_counts()
        if w1 == w2 and self.reason and self.reason is not EndRule.MOVE_LIMIT:
            return self.pieces[1].bit_count(), self.pieces[2].bit_count()
        return w1, w2

    def to_dict(self) -> dict[str, Any]:
        return {**self.snapshot_common(), "prev": self.prev, "banned": self.banned[1:]}
