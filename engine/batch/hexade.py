"""Batched random Hexade (RULES.md §5): many games per numpy step, move for move as `Hexade`.

The board holds seats, not colours: seats alternate every ply even across a swap, so one
batch-wide "seat to move" serves every game, and a swap just hands the single stone on the
board to seat 2. Each game keeps its empty cells in an unordered list, so a uniform placement
is one random index and a swap-with-last. Everything the rules look at after a placement lies
on the 12 `All` radials of the stone, at most 5 cells out: captures, lines, and the ring and
triangle cells (all within two steps). Those 60 cells are gathered into one 64-bit word per
game, cut into a 5-bit field per radial, and small lookup tables answer "which run does a
friend close", "how long is my run" and "do these 18 cells make a ring or a triangle". The
tables are translated from the single engine's own per-site tables, and the translation is
checked to be exact when it is built. Colours come back only in the result.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from engine.batch.common import BatchResult, Int64s, MoveLog, uniform_below
from engine.core import MAX_PLIES
from engine.games.hexade import Hexade

U64s = NDArray[np.uint64]
#: cells per radial in the local word: the 5 beyond the stone (a line of 6 needs at most 5)
REACH = 5
RADIAL_MASK = (1 << REACH) - 1


class _Tables(NamedTuple):
    """Per site (plus one row of padding for "no stone placed"), in local-word terms.

    The local word of a site holds, for each of its 12 `All` radials r (the 6 orthogonal ones
    in board order, then the 6 diagonal ones), the next `REACH` cells at bits
    `REACH*r .. REACH*r + REACH-1`, nearest first; a cell off the board is the padding site,
    which is always empty. Orthogonal radial r and r+3 point in opposite directions.
    """

    #: [site, bit]: the site read into that bit of the local word
    local: NDArray[np.intp]
    #: [site, radial]: the enemy run lengths that radial captures, as bits (bit k: run of k)
    capture_lengths: NDArray[np.uint8]
    #: [enemy bits | friend bits << REACH] of one radial: the enemy run a friend closes, or 0
    closed_run: NDArray[np.uint8]
    #: [own bits of one radial]: how many own stones lead it
    own_run: NDArray[np.uint8]
    #: [the 18 cells within two steps, as bits]: whether they complete a ring or a triangle
    ring_or_triangle: NDArray[np.bool_]
    #: per radial: which of its bits are within two steps (the ring and triangle cells), and
    #: where they go in the 18-bit index
    near_bits: U64s
    near_shift: U64s


_LOCAL_TABLES: dict[str, _Tables] = {}


def _local_tables(game: Hexade) -> _Tables:
    """The single engine's capture and win tables, re-expressed over the local words."""
    key = game.board.name
    if key not in _LOCAL_TABLES:
        _LOCAL_TABLES[key] = _build_tables(game)
    return _LOCAL_TABLES[key]


def _radial_cells(game: Hexade) -> list[list[list[int]]]:
    """[site][radial]: the next `REACH` sites outward, -1 past the edge."""
    board = game.board
    steps = [board.step("orthogonal", d) for d in board.directions("orthogonal")]
    steps += [board.step("diagonal", d) for d in board.directions("diagonal")]
    out = []
    for s in range(game.n):
        radials = []
        for step in steps:
            ray, cur = [], s
            for _ in range(REACH):
                cur = step[cur] if cur >= 0 else -1
                ray.append(cur)
            radials.append(ray)
        out.append(radials)
    return out


def _sites(mask: int) -> list[int]:
    return [t for t in range(mask.bit_length()) if mask >> t & 1]


def _build_tables(game: Hexade) -> _Tables:
    """Translate the single engine's per-site tables and check the translation is exact.

    Captures keep their per-site run lengths (at the board's edge Ludii's All-distance can
    differ). Lines and shapes become site-independent lookups, which is only right if every
    site's own masks are exactly the lookups' shapes that fit on the board there: that is
    checked here, so a change in the single engine's tables fails loudly rather than silently.
    """
    n = game.n
    radials = _radial_cells(game)
    n_radials = len(radials[0])
    orth = n_radials // 2
    # The cells within two steps: orthogonal radials' first two cells, diagonal radials' first.
    near_slots = [(r, k) for r in range(n_radials) for k in range(2 if r < orth else 1)]
    near_bit = {slot: i for i, slot in enumerate(near_slots)}

    local = np.full((n + 1, 64), n, np.intp)  # 64: a whole word, the spare bits padding
    capture_lengths = np.zeros((n + 1, n_radials), np.uint8)
    shapes_at: list[set[int]] = []  # per site: its ring and triangle masks as 18-bit indexes
    for s in range(n):
        slot_of: dict[int, tuple[int, int]] = {}  # site -> (radial, depth)
        for r, ray in enumerate(radials[s]):
            for k, t in enumerate(ray):
                if t >= 0:
                    local[s, REACH * r + k] = t
                    slot_of.setdefault(t, (r, k))
        for capture_ray, lengths in game.captures[s]:
            r, k = slot_of[capture_ray[0]]
            if k != 0 or list(capture_ray) != radials[s][r][: len(capture_ray)]:
                raise ValueError(f"site {s}: capture ray {capture_ray} is not one of the radials")
            capture_lengths[s, r] = sum(1 << length for length in lengths)
        lines = set(game.lines[s])
        if lines != _line_windows(s, radials[s][:orth]):
            raise ValueError(f"site {s}: the line masks are not the runs along the 3 axes")
        shapes: set[int] = set()
        for mask in set(game.wins[s]) - lines:
            cells = [t for t in _sites(mask) if t != s]
            if any(slot_of.get(t, (-1, -1)) not in near_bit for t in cells):
                raise ValueError(f"site {s}: shape {cells} reaches beyond two steps")
            shapes.add(sum(1 << near_bit[slot_of[t]] for t in cells))
        shapes_at.append(shapes)
    every_shape = set().union(*shapes_at)
    for s in range(n):
        on_board = sum(1 << i for i, (r, k) in enumerate(near_slots) if radials[s][r][k] >= 0)
        if shapes_at[s] != {m for m in every_shape if m & on_board == m}:
            raise ValueError(f"site {s}: the shapes are not those that fit on the board there")

    index = np.arange(1 << len(near_slots), dtype=np.int64)
    ring_or_triangle = np.zeros(index.size, np.bool_)
    for m in every_shape:
        ring_or_triangle |= (index & m) == m
    near_bits = np.zeros(n_radials, np.uint64)
    near_shift = np.zeros(n_radials, np.uint64)
    for (r, k), i in near_bit.items():
        near_bits[r] |= np.uint64(1 << k)
        if k == 0:
            near_shift[r] = i
    return _Tables(
        local,
        capture_lengths,
        _closed_runs(),
        np.array([_leading_ones(bits) for bits in range(1 << REACH)], np.uint8),
        ring_or_triangle,
        near_bits,
        near_shift,
    )


def _line_windows(s: int, orthogonal: list[list[int]]) -> set[int]:
    """Every 6 cells in a row through `s` along the 3 axes, as site masks."""
    half = len(orthogonal) // 2
    windows = set()
    for r in range(half):
        ahead, behind = orthogonal[r], orthogonal[r + half]
        for back in range(REACH + 1):
            cells = [*behind[:back], s, *ahead[: REACH - back]]
            if min(cells) >= 0:
                windows.add(sum(1 << t for t in cells))
    return windows


def _leading_ones(bits: int) -> int:
    k = 0
    while bits >> k & 1:
        k += 1
    return k


def _closed_runs() -> NDArray[np.uint8]:
    """[enemy | friend << REACH]: the length of the enemy run a friend closes, 0 if none does."""
    table = np.zeros(1 << 2 * REACH, np.uint8)
    for enemy in range(1 << REACH):
        run = _leading_ones(enemy)
        for friend in range(1 << REACH):
            if run < REACH and friend >> run & 1 and not enemy & friend:
                table[enemy | friend << REACH] = run
    return table


def _words(cells: NDArray[np.bool_]) -> U64s:
    """(rows, 64) booleans as one 64-bit word per row, column 0 the lowest bit."""
    packed = np.packbits(cells, axis=1, bitorder="little")
    return packed.view("<u8")[:, 0].astype(np.uint64)


def playout_batch(
    game: Hexade,
    n_games: int,
    rng: np.random.Generator,
    *,
    trace: int = 0,
    swap_chance: float | None = None,
) -> BatchResult:
    """Play `n_games` uniformly random games of `game` at once.

    `trace` games (the first ones) also record the legal actions drawn from at every ply.
    `swap_chance`, for tests only, replaces the uniform choice at ply 1 by a swap with that
    probability (uniform play swaps once in 169 games).
    """
    n = game.n
    t = _local_tables(game)
    width = n + 1  # the last column is the padding cell: always empty
    n_radials = t.capture_lengths.shape[1]
    axes = n_radials // 4  # the orthogonal radials come first, in opposite pairs r, r + axes
    shifts = np.arange(0, REACH * n_radials, REACH, dtype=np.uint64)
    log = MoveLog(n_games, n, 256)
    log.legal = [[] for _ in range(min(trace, n_games))]

    ids = np.arange(n_games, dtype=np.int64)
    board = np.zeros((n_games, width), np.int8)  # per site: 0 empty, else the stone's seat
    empties = np.tile(np.arange(n, dtype=np.int16), (n_games, 1))  # [:count] are the empty cells
    count = np.full(n_games, n, np.int64)
    swapped = np.zeros(n_games, np.bool_)
    first = np.zeros(n_games, np.int64)  # the site of the first stone, which a swap hands over
    seat = 1
    ply = 0
    while ids.size:
        rows = np.arange(ids.size)
        at_board, at_empties = rows * width, rows * n  # flat indexing beats (row, column) pairs
        if trace:
            _trace(log, ids, empties, count, ply, game)
        if ply == 1:  # the swap is one more choice, drawn as the one past the empty cells
            if swap_chance is None:
                pick = uniform_below(rng, count + 1)
            else:
                chosen = rng.random(ids.size) < swap_chance
                pick = np.where(chosen, count, uniform_below(rng, count))
            swap = pick == count
            place = ~swap
        else:
            pick = uniform_below(rng, count)
            place = count > 0  # with a full board the mover passes
        last = at_empties + np.maximum(count - 1, 0)  # a passing game keeps its row untouched
        taken = np.minimum(at_empties + pick, last)
        flat_empties = empties.ravel()
        site = np.where(place, flat_empties[taken], n).astype(np.intp)
        flat_empties[taken] = np.where(place, flat_empties[last], flat_empties[taken])
        count -= place
        action = np.where(place, site, game.pass_action)
        flat_board = board.ravel()
        if ply == 0:
            first = site.astype(np.int64)
        elif ply == 1:
            action = np.where(swap, game.swap_action, action)
            flat_board[at_board[swap] + first[swap]] = 2
            swapped = swap
        flat_board[at_board + site] = seat
        board[:, n] = 0

        # One word per game of its stones around the new one, then one 5-bit field per radial.
        near = flat_board[at_board[:, None] + t.local[site]]
        own = (_words(near == seat)[:, None] >> shifts) & RADIAL_MASK
        enemy = (_words(near == 3 - seat)[:, None] >> shifts) & RADIAL_MASK
        run = t.closed_run[enemy | own << REACH]
        captured = np.where((t.capture_lengths[site] >> run) & 1, run, 0)
        if captured.any():
            _capture(flat_board, width, flat_empties, n, count, site, captured, t)
        # Captures remove enemy stones only, so the mover's shapes need no second look.
        lines = t.own_run[own[:, :axes]] + t.own_run[own[:, axes : 2 * axes]] >= REACH
        near_index = ((own & t.near_bits) << t.near_shift).sum(axis=1)
        won = lines.any(axis=1) | t.ring_or_triangle[near_index]

        log.record(ids, ply, action)
        ply += 1
        done = won if ply < MAX_PLIES else np.ones(ids.size, np.bool_)
        if done.any():
            winners = np.where(won[done], np.where(swapped[done], 3 - seat, seat), 0)
            final = board[done, :n]
            colours = np.where(swapped[done, None] & (final > 0), 3 - final, final)
            log.finish(ids[done], ply, winners.astype(np.int8), colours.astype(np.int8))
            keep = ~done
            ids, board, empties, count = ids[keep], board[keep], empties[keep], count[keep]
            swapped, first = swapped[keep], first[keep]
        seat = 3 - seat
    return log.result()


def _capture(
    board: NDArray[np.int8],
    width: int,
    empties: NDArray[np.int16],
    n: int,
    count: Int64s,
    site: NDArray[np.intp],
    captured: NDArray[np.uint8],
    t: _Tables,
) -> None:
    """Empty the captured runs and append their cells to the games' empty lists.

    `board` and `empties` are the flat views of the (games, width) and (games, n) tables;
    `captured` holds per game and radial the length of the run it removes (0: none).
    """
    n_radials = captured.shape[1]
    hits = np.flatnonzero(captured)
    length = captured.ravel()[hits].astype(np.intp)
    # One entry per captured cell, grouped by game since flatnonzero walks the rows in order.
    entry = np.arange(int(length.sum()))
    hit_of = np.repeat(np.arange(hits.size), length)
    row_of = hits[hit_of] // n_radials
    depth = entry - (np.cumsum(length) - length)[hit_of]
    bit = REACH * (hits[hit_of] % n_radials) + depth
    cells = t.local[site[row_of], bit]
    board[row_of * width + cells] = 0
    new_row = np.ones(entry.size, np.bool_)
    new_row[1:] = row_of[1:] != row_of[:-1]
    rank = entry - np.maximum.accumulate(np.where(new_row, entry, 0))
    empties[row_of * n + count[row_of] + rank] = cells
    np.add.at(count, row_of, 1)


def _trace(
    log: MoveLog, ids: Int64s, empties: NDArray[np.int16], count: Int64s, ply: int, game: Hexade
) -> None:
    for row in np.flatnonzero(ids < len(log.legal)):
        legal = sorted(int(s) for s in empties[row, : count[row]])
        if ply == 1:
            legal.append(game.swap_action)
        log.legal[int(ids[row])].append(tuple(legal) or (game.pass_action,))
