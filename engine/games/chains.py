"""Chains, warehouses and suppliers: the machinery Supply Chains and Supplier Sabotage share.

Both games (RULES.md §1, §2) judge a position by its *chains* (maximal connected groups
of one player's pieces), each chain's *warehouses*, and the distinct foreign *suppliers*
around it; a chain with fewer suppliers around than warehouses is in *deficit*. Here a
position is a pair of bitboards on a padded grid (`BitGrid`): bit `row * width + col`,
with spare columns so that a shift never wraps a row, which makes neighbour counts, the
Pattern walk and flood fills a handful of big-int operations. Each player's chains are
kept as `(cells, halo)` mask pairs and updated incrementally when a piece is placed
(merge) or removed (split). `ChainsState` holds what both games keep per position; the
two game modules add their turn structure. `ChainsDisplay` is the derived display.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from engine.boards import Board, Relation, load_board
from engine.core import EndRule, Game, InvalidMoveError, Move, Outcome, State, reason_text
from engine.pattern import headings, parse_walk

#: One chain: (its cells, its halo = the cells next to it that are not in it), as masks.
Chain = tuple[int, int]

Offset = tuple[int, int]  # (drow, dcol) on the lattice


def lattice_offsets(board: Board, relation: Relation) -> dict[str, Offset]:
    """Each direction of `relation` as one (drow, dcol) offset, checked on every step.

    Square and hex boards are lattices, so every step in a direction moves by the same
    offset; that is what lets a whole bitboard move in one shift.
    """
    cells = board.cells
    out: dict[str, Offset] = {}
    for direction in board.directions(relation):
        found: set[Offset] = set()
        for s, t in enumerate(board.step(relation, direction, strict=True)):
            if t >= 0:
                found.add((cells[t].row - cells[s].row, cells[t].col - cells[s].col))
        if len(found) != 1:
            raise ValueError(f"{board.name}: {relation} {direction} is not one lattice offset")
        out[direction] = found.pop()
    return out


def walk_offsets(board: Board, walk: str) -> tuple[tuple[Offset, ...], ...]:
    """The sites an `(is Pattern {walk})` visits, as offsets from `from`, per start direction.

    RULES.md §6: every supported orthogonal direction is a start direction (rotations, no
    reflections), and the walk turns as `engine.pattern.headings` says. Visits of `from`
    itself are dropped: they always match.
    """
    steps = parse_walk(walk)
    offset = lattice_offsets(board, "orthogonal")
    out = []
    for start in board.directions("orthogonal"):
        row = col = 0
        seen: list[Offset] = []
        for heading in headings(board, steps, start):
            dr, dc = offset[heading]
            row, col = row + dr, col + dc
            if (row, col) != (0, 0) and (row, col) not in seen:
                seen.append((row, col))
        out.append(tuple(seen))
    return tuple(out)


class BitGrid:
    """A board laid out on a padded bit grid: site s is bit `pos[s]`.

    `pad` spare columns after each row keep any column offset up to `pad` from wrapping
    into a real cell, so a lattice offset (drow, dcol) is the shift `drow * width + dcol`.
    Bit order is (row, col) order, which is Ludii's site order, so reading a mask from the
    low bit up lists sites ascending.
    """

    def __init__(self, board: Board, pad: int = 1) -> None:
        rows = [c.row for c in board.cells]
        cols = [c.col for c in board.cells]
        self.board = board
        self.row0, self.col0 = min(rows), min(cols)
        self.width = max(cols) - self.col0 + 1 + pad
        self.pad = pad
        self.pos = tuple(
            (r - self.row0) * self.width + c - self.col0 for r, c in zip(rows, cols, strict=True)
        )
        self.bit = tuple(1 << p for p in self.pos)
        self.valid = sum(self.bit)
        size = max(self.pos) + 1
        site_at = [-1] * size
        for s, p in enumerate(self.pos):
            site_at[p] = s
        self.site_at = tuple(site_at)
        # Listing a mask's sites goes a byte at a time: per byte of the grid, the sites of
        # each of its 256 values, so the work is one table look-up per non-zero byte.
        self.nbytes = (size + 7) // 8
        self.byte_sites = tuple(
            tuple(
                tuple(
                    site_at[p] for p in range(8 * i, min(8 * i + 8, size)) if v >> (p - 8 * i) & 1
                )
                for v in range(256)
            )
            for i in range(self.nbytes)
        )

    def shift_of(self, offset: Offset) -> int:
        if abs(offset[1]) > self.pad:
            raise ValueError(f"offset {offset} needs more than {self.pad} padding columns")
        return offset[0] * self.width + offset[1]

    def relation_shifts(self, relation: Relation) -> tuple[int, ...]:
        """The positive shifts k such that the relation's neighbours are at +k and -k."""
        shifts = {self.shift_of(o) for o in lattice_offsets(self.board, relation).values()}
        positive = tuple(sorted(k for k in shifts if k > 0))
        if {-k for k in positive} | set(positive) != shifts:
            raise ValueError(f"{self.board.name}: {relation} directions are not in opposite pairs")
        return positive

    def neighbour_masks(self, relation: Relation) -> tuple[int, ...]:
        """Per grid position (not per site), the mask of its neighbours; 0 off the board."""
        masks = [0] * len(self.site_at)
        bit = self.bit
        for s, nbrs in enumerate(self.board.neighbours(relation)):
            masks[self.pos[s]] = sum(bit[t] for t in nbrs)
        return tuple(masks)

    def sites(self, mask: int) -> list[int]:
        """The sites of a mask (of board cells), ascending."""
        out: list[int] = []
        for table, byte in zip(self.byte_sites, mask.to_bytes(self.nbytes, "little"), strict=True):
            if byte:
                out += table[byte]
        return out


@cache
def bit_grid(board_name: str) -> BitGrid:
    """The one-column-padded grid of a board, built once (its tables take milliseconds)."""
    return BitGrid(load_board(board_name))


# -- chain bookkeeping: plain functions on masks, for the hot paths ------------------------


def dilate(mask: int, shifts: tuple[int, ...]) -> int:
    """The mask and every neighbour of it (unclipped: AND with something on the board)."""
    out = mask
    for k in shifts:
        out |= (mask << k) | (mask >> k)
    return out


def group(seed: int, pieces: int, shifts: tuple[int, ...]) -> int:
    """The connected part of `pieces` containing `seed`: grow until nothing is added."""
    g = seed
    while True:
        grown = pieces & dilate(g, shifts)
        if grown == g:
            return g
        g = grown


def split_chains(pieces: int, shifts: tuple[int, ...], valid: int) -> list[Chain]:
    """Every chain of `pieces` with its halo (neighbouring board cells outside it)."""
    out = []
    while pieces:
        c = group(pieces & -pieces, pieces, shifts)
        out.append((c, dilate(c, shifts) & valid & ~c))
        pieces &= ~c
    return out


def place_in_chains(chains: list[Chain], bit: int, neighbours: int) -> list[Chain]:
    """The chains after a piece lands on `bit`: every chain it touches merges with it."""
    cells, halo, rest = bit, neighbours, []
    for chain in chains:
        if chain[0] & neighbours:
            cells |= chain[0]
            halo |= chain[1]
        else:
            rest.append(chain)
    rest.append((cells, halo & ~cells))
    return rest


def remove_from_chains(
    chains: list[Chain], bit: int, shifts: tuple[int, ...], valid: int
) -> list[Chain]:
    """The chains after the piece on `bit` leaves: its chain may fall apart."""
    out = []
    for chain in chains:
        if chain[0] & bit:
            out.extend(split_chains(chain[0] & ~bit, shifts, valid))
        else:
            out.append(chain)
    return out


def count_at_least(pieces: int, shifts: tuple[int, ...]) -> tuple[int, int]:
    """Masks (at least 2, at least 3) of positions by how many neighbours lie in `pieces`.

    A bit-parallel saturating counter over the shifted copies, one per direction.
    """
    ge1 = ge2 = ge3 = 0
    for k in shifts:
        for x in (pieces << k, pieces >> k):
            ge3 |= ge2 & x
            ge2 |= ge1 & x
            ge1 |= x
    return ge2, ge3


def compile_walk(grid: BitGrid, walk: str) -> tuple[tuple[int, ...], ...]:
    """Per start direction, the signed shifts of the sites the walk visits."""
    return tuple(tuple(grid.shift_of(o) for o in path) for path in walk_offsets(grid.board, walk))


def pattern_sites(pieces: int, walk: tuple[tuple[int, ...], ...]) -> int:
    """The pieces from which the compiled walk succeeds: every visited site is a piece too."""
    hits = 0
    for path in walk:
        ok = pieces
        for k in path:
            ok &= pieces >> k if k > 0 else pieces << -k
            if not ok:
                break
        hits |= ok
    return hits & pieces


# -- the derived display --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChainInfo:
    """One chain as a player sees it: cells, warehouses and the foreign suppliers around."""

    owner: int
    cells: tuple[int, ...]
    warehouses: tuple[int, ...]
    suppliers_around: tuple[int, ...]

    @property
    def surplus(self) -> int:
        return len(self.suppliers_around) - len(self.warehouses)

    @property
    def in_deficit(self) -> bool:
        return self.surplus < 0


@dataclass(frozen=True, slots=True)
class ChainsDisplay:
    """Everything Ludii draws beyond the pieces: chains, deficit warehouses, piece values.

    `surplus_values` is per site the number Ludii prints on the piece (None on empty sites);
    `deficit_warehouses` is the red-marked set of each colour, `[P1 sites, P2 sites]`.
    """

    labels: tuple[str, ...]
    chains: tuple[ChainInfo, ...]
    deficit_warehouses: tuple[tuple[int, ...], tuple[int, ...]]
    surplus_values: tuple[int | None, ...]

    def to_dict(self) -> dict[str, Any]:
        """The display with cells as labels, for read models and the web page."""
        lab = self.labels

        def names(sites: tuple[int, ...]) -> list[str]:
            return [lab[s] for s in sites]

        return {
            "chains": [
                {
                    "owner": c.owner,
                    "cells": names(c.cells),
                    "warehouses": names(c.warehouses),
                    "suppliers_around": names(c.suppliers_around),
                    "surplus": c.surplus,
                }
                for c in self.chains
            ],
            "deficit_warehouses": {
                str(p + 1): names(d) for p, d in enumerate(self.deficit_warehouses)
            },
            "surplus_values": {
                lab[s]: v for s, v in enumerate(self.surplus_values) if v is not None
            },
        }


# -- the game and state both games build on ------------------------------------------------


class ChainsGame(Game):
    """A chains game on one board: action codes and the grid tables both games need.

    Actions: place on s -> s, remove from s -> n + s, pass -> 2n (RULES.md §9), so sorting
    actions lists placements, then removals, then pass.
    """

    #: the walk that makes a warehouse, or "" when warehouses are counted (Supply Chains)
    warehouse_walk: str = ""

    def setup_board(self, board: Board, chain_relation: Relation) -> None:
        self.board = board
        self.n = board.num_sites
        self.pass_action = 2 * board.num_sites
        self.chain_relation = chain_relation
        self.grid = grid = bit_grid(board.name)
        self.shifts = grid.relation_shifts(chain_relation)
        self.neighbours = grid.neighbour_masks(chain_relation)
        self.bit = grid.bit
        self.valid = grid.valid
        self.walk = compile_walk(grid, self.warehouse_walk) if self.warehouse_walk else ()

    def move_of(self, action: int) -> Move:
        n = self.n
        if 0 <= action < n:
            return Move("place", self.board.labels[action])
        if n <= action < 2 * n:
            return Move("remove", self.board.labels[action - n])
        if action == 2 * n:
            return Move("pass")
        raise InvalidMoveError(f"{action} is not an action of {self!r}")

    def action_of(self, move: Move) -> int:
        if move.kind == "place":
            return self.site(move.cell)
        if move.kind == "remove":
            return self.n + self.site(move.cell)
        if move.kind == "pass":
            return self.pass_action
        raise InvalidMoveError(f"{move} is not a {self.name} move (place C4, remove xC4, pass)")

    @abstractmethod
    def warehouses(self, pieces: int) -> int:
        """The warehouses among one player's pieces (the rule differs per game)."""

    def snapshot_pieces(self, data: Mapping[str, Any]) -> tuple[int, int]:
        """Validate a snapshot's header and board; return the two colours' piece masks."""
        text = self.snapshot_board(data)
        bit = self.bit
        p1 = sum(bit[s] for s, ch in enumerate(text) if ch == "1")
        p2 = sum(bit[s] for s, ch in enumerate(text) if ch == "2")
        return p1, p2

    def restore_common(self, state: ChainsState, data: Mapping[str, Any]) -> None:
        """Read what both games' snapshots hold (see `ChainsState.snapshot_common`)."""
        state.init_board(*self.snapshot_pieces(data))
        state.mover = int(data["mover"])
        state.ply = int(data["ply"])
        state.passed = [False, *(bool(b) for b in data["passed"])]
        state.reason = EndRule.from_text(data["reason"])


class ChainsState(State):
    """What both games keep per position: pieces, warehouses and chains of each colour.

    Lists are indexed by colour (index 0 unused) and replaced or copied, never shared
    mutably, so `clone` is a few list copies. `_legal` and `_deficits` cache the legal
    actions and the deficit warehouses of the position; every change of position resets
    them.
    """

    game: ChainsGame
    #: per colour: was its last turn a single voluntary pass (the all-passed end)
    passed: list[bool]
    pieces: list[int]
    wh: list[int]
    chains: list[list[Chain]]
    _legal: list[int] | None
    _deficits: list[int] | None

    def init_board(self, p1: int, p2: int) -> None:
        game = self.game
        self.pieces = [0, p1, p2]
        self.wh = [0, game.warehouses(p1), game.warehouses(p2)]
        self.chains = [
            [],
            split_chains(p1, game.shifts, game.valid),
            split_chains(p2, game.shifts, game.valid),
        ]
        self._legal = None
        self._deficits = None

    def snapshot_common(self) -> dict[str, Any]:
        """What both games' snapshots hold: header, board, mover, passes and the end."""
        return {
            **self.snapshot_header(),
            "board": self.board_string(),
            "mover": self.mover,
            "passed": self.passed[1:],
            "reason": reason_text(self.reason),
        }

    def copy_board_into(self, other: ChainsState) -> None:
        other.pieces = self.pieces[:]
        other.wh = self.wh[:]
        other.chains = [[], self.chains[1][:], self.chains[2][:]]
        other._legal = self._legal
        other._deficits = self._deficits

    # -- changes of the board ------------------------------------------------------------
    def place(self, colour: int, site: int) -> None:
        game = self.game
        bit = game.bit[site]
        pieces = self.pieces[colour] | bit
        self.pieces[colour] = pieces
        self.wh[colour] = game.warehouses(pieces)
        self._deficits = None
        self.chains[colour] = place_in_chains(
            self.chains[colour], bit, game.neighbours[game.grid.pos[site]]
        )

    def remove(self, colour: int, site: int) -> None:
        game = self.game
        bit = game.bit[site]
        pieces = self.pieces[colour] & ~bit
        self.pieces[colour] = pieces
        self.wh[colour] = game.warehouses(pieces)
        self._deficits = None
        self.chains[colour] = remove_from_chains(self.chains[colour], bit, game.shifts, game.valid)

    # -- chain accounting ------------------------------------------------------------------
    def suppliers(self, colour: int) -> int:
        """Mask of the colour's suppliers: its pieces that are not warehouses."""
        return self.pieces[colour] & ~self.wh[colour]

    def deficit_warehouses(self, colour: int) -> int:
        """Mask of the colour's warehouses whose chain has fewer suppliers around than them."""
        wh = self.wh[colour]
        if not wh:
            return 0
        suppliers = self.suppliers(3 - colour)
        out = 0
        for cells, halo in self.chains[colour]:
            w = cells & wh
            if w and (halo & suppliers).bit_count() < w.bit_count():
                out |= w
        return out

    def deficits(self) -> list[int]:
        """Per colour (index 0 unused) the mask of its deficit warehouses, cached."""
        found = self._deficits
        if found is None:
            found = self._deficits = [0, self.deficit_warehouses(1), self.deficit_warehouses(2)]
        return found

    def chain_surpluses(self, colour: int) -> Iterator[tuple[int, int]]:
        """(cells, surplus) for each chain of the colour."""
        wh = self.wh[colour]
        suppliers = self.suppliers(3 - colour)
        for cells, halo in self.chains[colour]:
            yield cells, (halo & suppliers).bit_count() - (cells & wh).bit_count()

    def warehouse_counts(self) -> tuple[int, int]:
        return self.wh[1].bit_count(), self.wh[2].bit_count()

    def owner(self, site: int) -> int:
        bit = self.game.bit[site]
        return 1 if self.pieces[1] & bit else 2 if self.pieces[2] & bit else 0

    # -- derived views ---------------------------------------------------------------------
    def board_string(self) -> str:
        bit = self.game.bit
        p1, p2 = self.pieces[1], self.pieces[2]
        return "".join("1" if p1 & b else "2" if p2 & b else "." for b in bit)

    @abstractmethod
    def surplus_values(self) -> list[int | None]:
        """Per site the value Ludii shows on the piece there, None on an empty site."""

    def display(self) -> ChainsDisplay:
        """Every chain with its warehouses, suppliers around and surplus; deficit warehouses.

        The contract's `State.display`: both chains games show this, the others nothing.
        """
        game = self.game
        sites = game.grid.sites
        chains = []
        for colour in (1, 2):
            suppliers = self.suppliers(3 - colour)
            for cells, halo in self.chains[colour]:
                chains.append(
                    ChainInfo(
                        colour,
                        tuple(sites(cells)),
                        tuple(sites(cells & self.wh[colour])),
                        tuple(sites(halo & suppliers)),
                    )
                )
        chains.sort(key=lambda c: c.cells[0])
        deficits = self.deficits()
        return ChainsDisplay(
            game.board.labels,
            tuple(chains),
            (tuple(sites(deficits[1])), tuple(sites(deficits[2]))),
            tuple(self.surplus_values()),
        )

    def legal_actions(self) -> list[int]:
        legal = self._legal
        if legal is None:
            legal = self._legal = self.compute_legal()
        return legal[:]

    @abstractmethod
    def compute_legal(self) -> list[int]:
        """The legal actions, ascending; `legal_actions` caches them per position."""

    def placements(self, forbidden: int = 0) -> list[int]:
        """Every empty site except those in `forbidden`, as actions."""
        game = self.game
        return game.grid.sites(game.valid & ~(self.pieces[1] | self.pieces[2] | forbidden))

    def removes_from(self, mask: int, action: int) -> bool:
        """Whether `action` removes a piece of `mask`: `action in self.removals(mask)`."""
        game = self.game
        n = game.n
        return n <= action < 2 * n and bool(mask & game.bit[action - n])

    def removals(self, mask: int) -> list[int]:
        """Removing each piece of `mask`, as actions."""
        n = self.game.n
        return [n + s for s in self.game.grid.sites(mask)]

    # -- results -----------------------------------------------------------------------------
    def outcome(self) -> Outcome | None:
        """Most warehouses (as `scores` counts them) wins; the move limit is always a draw."""
        if not self.reason:
            return None
        s1, s2 = self.scores()
        winner = 0 if self.reason is EndRule.MOVE_LIMIT else 1 if s1 > s2 else 2 if s2 > s1 else 0
        return Outcome(winner, (s1, s2), self.reason)

    @abstractmethod
    def scores(self) -> tuple[int, int]: ...
