"""The memory benchmark: what a finished game costs Redis once the pipeline has trimmed.

For each game (Teeko, Hexade, Overflow, Supply Chains, Supplier Sabotage) a private
redis-server of its own plays N games between two random bots through the whole pipeline
(`services.cli.pipeline.selfplay`, services in this process), then every consumer runs its
housekeeping (what `run` does every 5 s: trim acknowledged entries). Reported per game:

- Redis `used_memory` (INFO memory) on the empty server, after play, after housekeeping,
  and (after - empty) / finished games: everything a finished game costs, shared
  structures (registry, indexes, empty streams and their groups) included;
- `MEMORY USAGE` (SAMPLES 0, exact) of each game's own keys, its log, view and replies
  memory, as medians per game: what stays per game for good (the replies memory only for
  the idempotency window);
- the kinds of keys that remain: per finished game, and shared by the partitions.

`agon bench memory [--games N] [--json]` prints the table (bench/benchmarks.py).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from services.bus.connection import Client, connect
from services.bus.embedded import EmbeddedRedis
from services.bus.keys import Keys
from services.bus.text import as_text
from services.cli.pipeline import ServiceSet, selfplay

GAMES = ("teeko", "hexade", "overflow", "supply-chains", "supplier-sabotage")
BOTS = ("random", "random")
#: The kinds of key one game owns; every other key is shared by the games of a partition.
GAME_KINDS = ("log", "view", "replies memory")


def key_kinds(keys: Keys, game_ids: Sequence[str], bots: Sequence[str]) -> dict[str, str]:
    """Every key name the pipeline may leave, by `Keys`, with its kind."""
    kinds: dict[str, str] = {}
    for gid in game_ids:
        kinds |= {
            keys.log(gid): "log",
            keys.view(gid): "view",
            keys.replies_memory(gid): "replies memory",
        }
    kinds |= {
        keys.processes(): "processes",
        keys.secret(): "server secret",
        keys.reader_dead_letter(): "reader dead letters",
        **{keys.bot_turns(b): "bot inbox" for b in bots},
    }
    for p in keys.all_partitions():
        kinds |= {
            keys.commands(p): "command stream",
            keys.feed(p): "feed",
            keys.games(p): "games registry",
            keys.dead_letter(p): "dead letters",
            keys.clocks(p): "clocks",
            keys.projector_seen(p): "projector seen",
            keys.index_time(p): "index",
            **{keys.bot_results(p, b): "bot results" for b in bots},
        }
    return kinds


def key_kind(keys: Keys, kinds: dict[str, str], name: str) -> str:
    """The kind of a key; "unknown: <name>" for one nobody should leave."""
    found = kinds.get(name)
    if found is not None:
        return found
    for p in keys.all_partitions():
        for prefix in (keys.index_status(p, ""), keys.index_game(p, ""), keys.index_player(p, "")):
            if name.startswith(prefix):
                return "index"
        if name.startswith(keys.results(p, "")) or name.startswith(keys.tournament_results(p, "")):
            return "results"
    if name.startswith(keys.reply_stream("")):
        return "reply stream"
    return f"unknown: {name}"


async def used_memory(redis: Client) -> int:
    info: Any = await redis.info("memory")
    return int(info["used_memory"])


async def housekeeping(redis: Client, keys: Keys, bots: Sequence[str]) -> None:
    """Drain what is left, then trim as every consumer's housekeeping does; leave the groups."""
    services = ServiceSet(redis, keys, bots)
    await services.drain()
    for service in services.services():
        await service.housekeeping()
        await service.reader.leave()


async def measure_game(url: str, game: str, count: int, timeout_s: float) -> dict[str, Any]:
    """Play `count` games of `game` on the (empty) server at `url` and measure what stays."""
    keys = Keys()
    redis = await connect(url)
    try:
        empty = await used_memory(redis)
        started = time.perf_counter()
        result = await selfplay(redis, keys, [(game, {})], count, list(BOTS), timeout_s=timeout_s)
        seconds = time.perf_counter() - started
        after_play = await used_memory(redis)
        await housekeeping(redis, keys, BOTS)
        after = await used_memory(redis)

        ids = [gid async for gid in _game_ids(redis, keys)]
        names = [as_text(k) async for k in redis.scan_iter(match="*", count=1000)]
        known = key_kinds(keys, ids, BOTS)
        of = {n: key_kind(keys, known, n) for n in names}
        kinds = Counter(of.values())
        per_game: dict[str, list[int]] = {kind: [] for kind in GAME_KINDS}
        totals: list[int] = []
        for gid in sorted(ids):
            sizes = []
            for kind, key in zip(
                GAME_KINDS, (keys.log(gid), keys.view(gid), keys.replies_memory(gid)), strict=True
            ):
                size = await redis.memory_usage(key, samples=0) or 0
                per_game[kind].append(int(size))
                sizes.append(int(size))
            totals.append(sum(sizes))
        stream_entries = 0
        for n in names:
            if of[n] in ("command stream", "feed", "bot inbox"):
                stream_entries += await redis.xlen(n)
        finished = result.finished or 1
        return {
            "game": game,
            "games": result.games,
            "finished": result.finished,
            "moves": result.moves,
            "seconds": round(seconds, 2),
            "used_memory_empty": empty,
            "used_memory_after_play": after_play,
            "used_memory_after_housekeeping": after,
            "used_memory_per_finished_game": round((after - empty) / finished),
            "shared_bytes": after - empty - sum(totals),
            "game_keys_median_bytes": round(statistics.median(totals)) if totals else 0,
            "log_median_bytes": _median(per_game["log"]),
            "view_median_bytes": _median(per_game["view"]),
            "replies_memory_median_bytes": _median(per_game["replies memory"]),
            "keys_per_finished_game": {
                k: round(kinds[k] / finished, 2) for k in GAME_KINDS if kinds[k]
            },
            "shared_keys": {k: v for k, v in sorted(kinds.items()) if k not in GAME_KINDS},
            "entries_left_in_streams": stream_entries,
        }
    finally:
        await redis.aclose()


def _median(values: Sequence[int]) -> int:
    return round(statistics.median(values)) if values else 0


async def _game_ids(redis: Client, keys: Keys) -> Any:
    for p in keys.all_partitions():
        members: Any = await redis.zrange(keys.games(p), 0, -1)
        for gid in members:
            yield as_text(gid)


def run_memory_bench(
    games: int, names: Sequence[str] = GAMES, timeout_s: float = 300.0
) -> list[dict[str, Any]]:
    """One row per game name, each measured on a private redis-server of its own."""
    rows = []
    quiet = logging.getLogger("agon")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # not every consumer's "ready" line, five times over
    try:
        for i, name in enumerate(names, start=1):
            print(f"[{i}/{len(names)}] {name}: {games} games...", file=sys.stderr, flush=True)
            with EmbeddedRedis() as server:
                rows.append(asyncio.run(measure_game(server.url, name, games, timeout_s)))
    finally:
        quiet.setLevel(level)
    return rows


def print_memory_table(rows: Sequence[dict[str, Any]]) -> None:
    kib = 1024
    print(
        f"{'game':<18} {'games':>6} {'moves':>6} {'empty':>8} {'played':>8} {'trimmed':>8}"
        f" {'/game':>7} {'shared':>7} {'keys/game':>9} {'log':>7} {'view':>6} {'replies':>7}"
    )
    for r in rows:
        print(
            f"{r['game']:<18} {r['finished']:>3}/{r['games']:<2} {r['moves']:>6}"
            f" {r['used_memory_empty'] / kib:>6.0f}Ki {r['used_memory_after_play'] / kib:>6.0f}Ki"
            f" {r['used_memory_after_housekeeping'] / kib:>6.0f}Ki"
            f" {r['used_memory_per_finished_game'] / kib:>5.1f}Ki"
            f" {r['shared_bytes'] / kib:>5.0f}Ki"
            f" {r['game_keys_median_bytes'] / kib:>7.1f}Ki {r['log_median_bytes'] / kib:>5.1f}Ki"
            f" {r['view_median_bytes'] / kib:>4.1f}Ki"
            f" {r['replies_memory_median_bytes'] / kib:>5.1f}Ki"
        )
    print(
        "empty/played/trimmed: Redis used_memory on the empty server, after play, after"
        " housekeeping; /game: (trimmed - empty) / finished games; shared: trimmed - empty - all"
        " games' own keys; keys/game: MEMORY USAGE of"
        " log + view + replies memory, median per game (log, view, replies: medians too)"
    )
    for r in rows:
        own = ", ".join(f"{k} x{v:g}" for k, v in r["keys_per_finished_game"].items())
        shared = ", ".join(f"{k} {v}" for k, v in r["shared_keys"].items())
        print(
            f"  {r['game']}: per game: {own}; shared: {shared};"
            f" {r['entries_left_in_streams']} entries left in streams"
        )
