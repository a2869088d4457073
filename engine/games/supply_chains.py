"""Supply Chains (RULES.md §1): place without starving your own chain, remove what starves.

A piece with at least 3 friendly neighbours (under the Connectivity option) is a
warehouse, any other piece a supplier; a chain in deficit has fewer distinct foreign
suppliers around it than warehouses in it. A ply is a removal of a deficit warehouse of
the removal player (the mover, or the opponent in the Capture variant), which takes
priority, else a placement that leaves the placed piece's chain out of deficit (or a
voluntary pass in the Passing variant). While the removal player still has deficit
warehouses the same player moves again; otherwise the DoubleTurnProtocol (P1 one turn,
then two each) or plain alternation decides. The first forced pass ends the game; in
the Passing variant two consecutive single-pass turns do. Most warehouses wins.

The per-piece surplus numbers Ludii prints are state: after every ply but a forced pass,
`UpdateSurplusesToDisplayFor Mover` then `Next` write each chain's surplus on its pieces
(both colours, so every chain), but a negative surplus is never written, leaving the
previous value. They are kept as bit planes (plane k holds bit k of each site's value).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.boards import Relation, load_board
from engine.core import MAX_PLIES, EndRule, register
from engine.games.chains import ChainsGame, ChainsState, count_at_least, dilate

#: Agon variant -> (removals by the opponent (Capture), passing allowed, double turns)
VARIANTS: dict[str, tuple[bool, bool, bool]] = {
    "self-removal-122": (False, False, True),
    "capture-122": (True, False, True),
    "self-removal": (False, False, False),
    "passing": (False, True, False),
}


@register
class SupplyChains(ChainsGame):
    """Supply Chains with Ludii's options: board, connectivity, variant (RULES.md §8)."""

    name = "supply-chains"
    OPTIONS = {
        "board": ("hex-3-5", "hex-3-4", "hex-4-5", "hex-5-6", "hex-6-7", "hex-6-8", "square-8"),
        "connectivity": ("adjacent", "orthogonal"),
        "variant": tuple(VARIANTS),
    }

    def __init__(self, **options: object) -> None:
        super().__init__(**options)
        relation: Relation = (
            "adjacent" if self.options["connectivity"] == "adjacent" else "orthogonal"
        )
        self.setup_board(load_board(self.options["board"]), relation)
        self.capture, self.passing, self.double_turns = VARIANTS[self.options["variant"]]
        #: enough bit planes for any surplus (at most the number of sites)
        self.planes = self.n.bit_length()

    def warehouses(self, pieces: int) -> int:
        return count_at_least(pieces, self.shifts)[1] & pieces

    def new_initial_state(self) -> SupplyChainsState:
        state = SupplyChainsState(self)
        state.init_board(0, 0)
        return state

    def state_from_dict(self, data: Mapping[str, Any]) -> SupplyChainsState:
        state = SupplyChainsState(self)
        self.restore_common(state, data)
        state.turn_var = int(data["turn_var"])
        pos = self.grid.pos
        planes = [0] * self.planes
        for s, value in enumerate(data["values"]):
            if value is not None:
                for k in range(self.planes):
                    if int(value) >> k & 1:
                        planes[k] |= 1 << pos[s]
        state.value_planes = planes
        return state


class SupplyChainsState(ChainsState):
    """A Supply Chains position: the board, the mover, the protocol's var and the display."""

    game: SupplyChains

    def __init__(self, game: SupplyChains) -> None:
        self.game = game
        self.mover = 1
        self.ply = 0
        #: Ludii's global var "MoveInTurn"; unset reads as -1 (Constants.OFF)
        self.turn_var = -1
        #: per colour: was its last turn a single voluntary pass (Passing variant's end)
        self.passed = [False, False, False]
        self.reason = None
        self.value_planes = [0] * game.planes

    def clone(self) -> SupplyChainsState:
        other = SupplyChainsState.__new__(SupplyChainsState)
        other.game = self.game
        other.mover = self.mover
        other.ply = self.ply
        other.turn_var = self.turn_var
        other.passed = self.passed[:]
        other.reason = self.reason
        other.value_planes = self.value_planes[:]
        self.copy_board_into(other)
        return other

    def removal_player(self, mover: int) -> int:
        return 3 - mover if self.game.capture else mover

    # -- legal moves ----------------------------------------------------------------------
    def compute_legal(self) -> list[int]:
        if self.reason:
            return []
        game = self.game
        mover = self.mover
        # Phase 1: removals take priority whenever the removal player has deficit warehouses.
        deficit = self.deficits()[self.removal_player(mover)]
        if deficit:
            return self.removals(deficit)
        # Phase 2: placements that keep the placed piece's chain out of deficit.
        actions = game.grid.sites(self.legal_placements(mover))
        if game.passing:
            actions.append(game.pass_action)
        # Phase 3: nothing to do is Ludii's forced pass, which ends the game once played.
        return actions or [game.pass_action]

    def is_legal(self, action: int) -> bool:
        """`action in self.legal_actions()`, deciding only that action (the checked path)."""
        if self.reason:
            return False
        game = self.game
        mover = self.mover
        deficit = self.deficits()[self.removal_player(mover)]
        if deficit:
            return self.removes_from(deficit, action)
        if 0 <= action < game.n:
            return self.may_place(mover, action)
        if action == game.pass_action:
            # A voluntary pass, or the forced one when no placement is left.
            return game.passing or not self.legal_placements(mover)
        return False

    def may_place(self, mover: int, site: int) -> bool:
        """Whether `site` is in `legal_placements(mover)`, judged from that site alone."""
        game = self.game
        e = game.bit[site]
        own = self.pieces[mover]
        other = 3 - mover
        if (own | self.pieces[other]) & e:
            return False
        neighbours = game.neighbours
        nbrs = neighbours[game.grid.pos[site]]
        friends = nbrs & own
        if not friends:
            return True  # a lone supplier
        # e is a warehouse with 3 friendly neighbours; a friend with exactly 2 becomes one.
        need = 1 if friends.bit_count() >= 3 else 0
        f = friends
        while f:
            b = f & -f
            f ^= b
            if (neighbours[b.bit_length() - 1] & own).bit_count() == 2:
                need += 1
        suppliers = self.pieces[other] & ~self.wh[other]
        have = nbrs & suppliers
        wh = self.wh[mover]
        for cells, halo in self.chains[mover]:
            if cells & friends:
                need += (cells & wh).bit_count()
                have |= halo & suppliers
        return have.bit_count() >= need

    def legal_placements(self, mover: int) -> int:
        """Mask of the empty sites where `mover` may place (RULES.md §1, Placement).

        Placing on e only changes the chain that e joins: e becomes a warehouse with at
        least 3 friendly neighbours, a friendly neighbour with exactly 2 becomes one, and
        the foreign suppliers around are those around the merged chains plus those next
        to e (a placement never changes a foreign piece's status).
        """
        game = self.game
        shifts = game.shifts
        own = self.pieces[mover]
        other = 3 - mover
        empty = game.valid & ~(own | self.pieces[other])
        # A site with no friendly neighbour makes a lone supplier: always legal.
        near = empty & dilate(own, shifts)
        legal = empty & ~near
        if not near:
            return legal
        ge2, ge3 = count_at_least(own, shifts)
        becomes_wh = ge2 & ~ge3 & own
        suppliers = self.pieces[other] & ~self.wh[other]
        wh = self.wh[mover]
        chains = [
            (cells, halo & suppliers, (cells & wh).bit_count())
            for cells, halo in self.chains[mover]
            if halo & near
        ]
        neighbours = game.neighbours
        while near:
            e = near & -near
            near ^= e
            nbrs = neighbours[e.bit_length() - 1]
            friends = nbrs & own
            need = (friends & becomes_wh).bit_count() + (1 if ge3 & e else 0)
            have = nbrs & suppliers
            for cells, around, wc in chains:
                if cells & friends:
                    need += wc
                    have |= around
            if have.bit_count() >= need:
                legal |= e
        return legal

    # -- playing ----------------------------------------------------------------------------
    def apply_action(self, action: int) -> None:
        game = self.game
        n = game.n
        mover = self.mover
        self._legal = None
        self.ply += 1
        if action == game.pass_action:
            if not game.passing:
                self.reason = EndRule.NO_MOVES  # a forced pass: `no Moves Mover` ends the game
                return
            self.passed[mover] = True
            if self.passed[3 - mover]:
                self.reason = EndRule.ALL_PASSED
                return
            # The board did not change, so the display and scores stay as they are.
        else:
            if action >= n:
                site = action - n
                self.remove(self.removal_player(mover), site)
                self.clear_value(site)
            else:
                self.place(mover, action)
            self.passed[mover] = False
            self.update_display()
        self.next_mover(mover)
        if self.ply >= MAX_PLIES and not self.reason:
            self.reason = EndRule.MOVE_LIMIT

    def next_mover(self, mover: int) -> None:
        """The `then` block's turn logic: removals go on, else the move protocol runs."""
        if self.deficits()[self.removal_player(mover)]:
            return  # moveAgain, and the protocol does not advance
        if self.game.double_turns:
            self.turn_var = (3 + self.turn_var) % 2
            if self.turn_var == 1:
                return
        self.mover = 3 - mover

    # -- the surplus display ------------------------------------------------------------------
    def update_display(self) -> None:
        """UpdateSurplusesToDisplayFor Mover and Next: write every chain's surplus if >= 0.

        The same pass over the chains finds the deficit warehouses, for the turn logic.
        Chains are gathered by surplus first, so each distinct value is written once.
        """
        pieces, wh, chains = self.pieces, self.wh, self.chains
        deficits = [0, 0, 0]
        by_value: dict[int, int] = {}  # surplus -> the cells of the chains that have it
        for colour in (1, 2):
            own_wh = wh[colour]
            suppliers = pieces[3 - colour] & ~wh[3 - colour]
            for cells, halo in chains[colour]:
                surplus = (halo & suppliers).bit_count() - (cells & own_wh).bit_count()
                if surplus < 0:
                    deficits[colour] |= cells & own_wh  # Ludii keeps their previous value
                else:
                    by_value[surplus] = by_value.get(surplus, 0) | cells
        written = 0
        for cells in by_value.values():
            written |= cells
        keep = ~written
        planes = [plane & keep for plane in self.value_planes]
        for value, cells in by_value.items():
            k = 0
            while value:
                if value & 1:
                    planes[k] |= cells
                value >>= 1
                k += 1
        self.value_planes = planes
        self._deficits = deficits

    def clear_value(self, site: int) -> None:
        keep = ~self.game.bit[site]
        self.value_planes = [plane & keep for plane in self.value_planes]

    def surplus_values(self) -> list[int | None]:
        occupied = self.pieces[1] | self.pieces[2]
        planes = self.value_planes
        out: list[int | None] = []
        for p in self.game.grid.pos:
            if occupied >> p & 1:
                out.append(sum((plane >> p & 1) << k for k, plane in enumerate(planes)))
            else:
                out.append(None)
        return out

    # -- results ------------------------------------------------------------------------------
    def scores(self) -> tuple[int, int]:
        return self.warehouse_counts()

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.snapshot_common(),
            "turn_var": self.turn_var,
            "values": self.surplus_values(),
        }
