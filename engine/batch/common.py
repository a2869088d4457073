"""What every batched playout engine shares: the result record, the move log and bit selection.

A batched engine plays many uniformly random games of one game at once, one numpy operation
per rule phase over all unfinished games. Games that end are compacted out of the working
arrays, so every game still in play is at the same ply; the engines lean on that (one mover,
one phase per step). `MoveLog` keeps the action codes in a (games, plies) table that grows by
doubling, and `BatchResult` hands back per game the actions, winner, ply count and final
board, which is everything needed to replay a game through the single-game `State`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from engine.core import MAX_PLIES

Int64s = NDArray[np.int64]

#: no action was played at this ply (the game had ended)
NO_ACTION = -1


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The outcome of `n_games` random playouts played side by side.

    `moves[i, :plies[i]]` are game i's action codes (the single-game engine's codes), the rest
    of the row is `NO_ACTION`; `winners[i]` is the winning colour or 0 for a draw; `boards[i]`
    the final position, one colour (0 empty) per site. `legal`, only for the first games when
    asked for (`trace`), lists per ply the ascending legal actions the batch drew from.
    """

    moves: NDArray[np.int16]
    plies: NDArray[np.int32]
    winners: NDArray[np.int8]
    boards: NDArray[np.int8]
    legal: tuple[tuple[tuple[int, ...], ...], ...] = ()

    @property
    def n_games(self) -> int:
        return int(self.plies.shape[0])

    @property
    def total_plies(self) -> int:
        return int(self.plies.sum())

    def actions(self, game: int) -> list[int]:
        """Game `game`'s action codes, in the order played."""
        return [int(a) for a in self.moves[game, : self.plies[game]]]


class MoveLog:
    """The action table and per-game results, written as games move and end.

    `ids` (the game numbers still in play, in the engine's row order) index every write, so the
    engine can drop finished rows from its own arrays without renumbering anything here.
    """

    def __init__(self, n_games: int, num_sites: int, first_width: int) -> None:
        self.moves = np.full((n_games, min(first_width, MAX_PLIES)), NO_ACTION, np.int16)
        self.plies = np.zeros(n_games, np.int32)
        self.winners = np.zeros(n_games, np.int8)
        self.boards = np.zeros((n_games, num_sites), np.int8)
        self.legal: list[list[tuple[int, ...]]] = []

    def record(self, ids: Int64s, ply: int, actions: Int64s) -> None:
        width = self.moves.shape[1]
        if ply >= width:
            grown = np.full((self.moves.shape[0], min(2 * width, MAX_PLIES)), NO_ACTION, np.int16)
            grown[:, :width] = self.moves
            self.moves = grown
        self.moves[ids, ply] = actions

    def finish(
        self, ids: Int64s, plies: int, winners: NDArray[np.int8], boards: NDArray[np.int8]
    ) -> None:
        self.plies[ids] = plies
        self.winners[ids] = winners
        self.boards[ids] = boards

    def result(self) -> BatchResult:
        longest = int(self.plies.max(initial=0))
        return BatchResult(
            self.moves[:, :longest].copy(),
            self.plies,
            self.winners,
            self.boards,
            tuple(tuple(plies) for plies in self.legal),
        )


# -- picking the k-th set bit of many bitboards at once --------------------------------------

_BYTE_POPCOUNT = np.array([bin(v).count("1") for v in range(256)], np.int64)
#: [byte, k] -> the position of the k-th set bit of the byte (0 where it has fewer bits)
_BYTE_SELECT = np.array(
    [[[b for b in range(8) if v >> b & 1][k] if k < bin(v).count("1") else 0 for k in range(8)]
     for v in range(256)],
    np.int64,
)  # fmt: skip


def select_bits(bits: Int64s, k: Int64s, nbytes: int = 8) -> Int64s:
    """Per row, the index of the `k`-th (from 0, lowest first) set bit of `bits`.

    `k` must be below each value's popcount and the bits must lie in the low `nbytes` bytes.
    Two lookups per byte, so choosing a uniform move never loops over sites.
    """
    octets = np.ascontiguousarray(bits, dtype="<i8").view(np.uint8).reshape(-1, 8)[:, :nbytes]
    counts = _BYTE_POPCOUNT[octets]
    before = counts.cumsum(axis=1)
    # a value with no set bit (a row that will not use the answer) stays in range
    byte = np.minimum((before <= k[:, None]).sum(axis=1), nbytes - 1)
    rows = np.arange(bits.shape[0])
    rank = k - before[rows, byte] + counts[rows, byte]
    site: Int64s = 8 * byte + _BYTE_SELECT[octets[rows, byte], rank]
    return site


def popcount(bits: Int64s) -> Int64s:
    """Set bits per non-negative value (numpy 1.x has no bit-count ufunc): the SWAR sum."""
    x = bits.astype(np.uint64)
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    counted: Int64s = ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.int64)
    return counted


def uniform_below(rng: np.random.Generator, counts: Int64s) -> Int64s:
    """One uniform integer in [0, count) per row; 0 where the count is 0."""
    drawn: Int64s = (rng.random(counts.shape[0]) * counts).astype(np.int64)
    return drawn


def bit_sites(bits: Int64s, num_sites: int) -> NDArray[np.bool_]:
    """Bitboards as a (rows, sites) boolean table."""
    shifted: Int64s = bits[:, None] >> np.arange(num_sites, dtype=np.int64)
    return (shifted & 1).astype(np.bool_)
