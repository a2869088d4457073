"""Batched random Teeko (RULES.md §4): thousands of games per numpy step, move for move as `Teeko`.

Each game is two int64 bitboards (the mover's markers and the opponent's). The placement phase
needs no legal-move generation at all: placing uniformly on the empty cells until the hands are
empty is drawing the first `2 * markers` cells of a uniform random permutation, so one argsort
per batch decides every placement. In the movement phase the 8 adjacent directions are bit
shifts (checked against the board's step tables), a uniform move is the k-th set bit among the
8 target bitboards, and the win test is the single engine's square and line masks through the
marker just moved. Action codes, the forced pass and the move limit are `Teeko`'s.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

import numpy as np

from engine.batch.common import (
    BatchResult,
    Int64s,
    MoveLog,
    bit_sites,
    popcount,
    select_bits,
    uniform_below,
)
from engine.boards import Board
from engine.core import MAX_PLIES
from engine.games.teeko import LINE_LENGTH, SQUARE_WALK, Teeko
from engine.pattern import compile_lines, compile_pattern, line_masks, pattern_masks

#: a win mask no position has (bit 62 is off every 25-site board): pads the per-site mask rows
NEVER = 1 << 62


class _Tables(NamedTuple):
    #: per adjacent direction: how far a bit moves (site(to) - site(from)) and the sites that
    #: have a neighbour that way
    shift_left: Int64s
    shift_right: Int64s
    sources: Int64s
    delta: Int64s
    #: [site, k]: the square and line masks through the site, padded with NEVER
    wins: Int64s


@cache
def _tables(board: Board) -> _Tables:
    deltas, sources = [], []
    for direction in board.directions("adjacent"):
        step = board.step("adjacent", direction)
        moves = {t - f for f, t in enumerate(step) if t >= 0}
        if len(moves) != 1:
            raise ValueError(f"{board.name}: {direction} is not one bit shift")
        deltas.append(moves.pop())
        sources.append(sum(1 << f for f, t in enumerate(step) if t >= 0))
    delta = np.array(deltas, np.int64)
    squares = pattern_masks(compile_pattern(board, SQUARE_WALK))
    lines = line_masks(compile_lines(board), LINE_LENGTH)
    per_site = [squares[s] + lines[s] for s in range(board.num_sites)]
    width = max(len(masks) for masks in per_site)
    wins = np.full((board.num_sites, width), NEVER, np.int64)
    for s, masks in enumerate(per_site):
        wins[s, : len(masks)] = masks
    return _Tables(
        np.maximum(delta, 0), np.maximum(-delta, 0), np.array(sources, np.int64), delta, wins
    )


def playout_batch(
    game: Teeko, n_games: int, rng: np.random.Generator, *, trace: int = 0
) -> BatchResult:
    """Play `n_games` uniformly random games of `game` at once.

    `trace` games (the first ones) also record the legal actions drawn from at every ply.
    """
    board = game.board
    n = board.num_sites
    t = _tables(board)
    full = (1 << n) - 1
    nbytes = (n + 7) // 8
    placing_plies = 2 * game.markers
    log = MoveLog(n_games, n, 64)
    log.legal = [[] for _ in range(min(trace, n_games))]

    ids = np.arange(n_games, dtype=np.int64)
    # Uniform placements on the empty cells, in turn, are a uniform random permutation.
    placements = np.argsort(rng.random((n_games, n)), axis=1)[:, :placing_plies]
    mine = np.zeros(n_games, np.int64)  # the mover's markers
    theirs = np.zeros(n_games, np.int64)
    colour = 1  # the mover: games never pass colours out of turn, so one for the batch
    ply = 0
    while ids.size:
        rows = np.arange(ids.size)
        if ply < placing_plies:
            to = placements[:, ply]
            actions = to
            flip = np.left_shift(1, to)
            if trace:
                _trace_placements(log, ids, mine | theirs, n)
        else:
            empty = full & ~(mine | theirs)
            targets = (
                np.left_shift(mine[:, None] & t.sources, t.shift_left) >> t.shift_right
            ) & empty[:, None]
            counts = popcount(targets)
            cum = counts.cumsum(axis=1)
            total = cum[:, -1]
            k = uniform_below(rng, total)
            direction = np.minimum((cum <= k[:, None]).sum(axis=1), t.delta.size - 1)
            rank = k - cum[rows, direction] + counts[rows, direction]
            moved = total > 0
            # A game with no step passes; its row still computes a (harmless) site 0 move.
            to = np.where(moved, select_bits(targets[rows, direction], rank, nbytes), 0)
            frm = to - t.delta[direction]
            actions = np.where(moved, n + frm * n + to, game.pass_action)
            flip = np.where(moved, np.left_shift(1, to) | np.left_shift(1, frm), 0)
            if trace:
                _trace_steps(log, ids, targets, t.delta, n, game.pass_action)
        mine ^= flip
        masks = t.wins[to]
        won = ((mine[:, None] & masks) == masks).any(axis=1) & (flip != 0)
        log.record(ids, ply, actions)
        ply += 1
        done = won if ply < MAX_PLIES else np.ones(ids.size, np.bool_)
        if done.any():
            own_bits, their_bits = (mine[done], theirs[done])
            ones, twos = (own_bits, their_bits) if colour == 1 else (their_bits, own_bits)
            final = bit_sites(ones, n).astype(np.int8) + 2 * bit_sites(twos, n).astype(np.int8)
            log.finish(ids[done], ply, np.where(won[done], colour, 0).astype(np.int8), final)
            keep = ~done
            ids, mine, theirs, placements = ids[keep], mine[keep], theirs[keep], placements[keep]
        mine, theirs = theirs, mine
        colour = 3 - colour
    return log.result()


def _trace_placements(log: MoveLog, ids: Int64s, occupied: Int64s, n: int) -> None:
    for row in np.flatnonzero(ids < len(log.legal)):
        free = ~int(occupied[row])
        log.legal[int(ids[row])].append(tuple(s for s in range(n) if free >> s & 1))


def _trace_steps(
    log: MoveLog, ids: Int64s, targets: Int64s, delta: Int64s, n: int, pass_action: int
) -> None:
    for row in np.flatnonzero(ids < len(log.legal)):
        legal = sorted(
            n + (to - int(delta[d])) * n + to
            for d in range(delta.size)
            for to in range(n)
            if int(targets[row, d]) >> to & 1
        )
        log.legal[int(ids[row])].append(tuple(legal) or (pass_action,))
