"""`agon rebuild`: recompute every registered read model from the logs, safely while play goes on.

Nothing is deleted first. Partition by partition, in chunks of games, each game's log is
folded and its cells written with the registry's guarded write, which overwrites the
stored models of a game unless they are already ahead of the fold (a live projector got
there first; its models are newer). A live projector whose write is refused because the
rebuild moved the stored seq folds the game again from its log, so once play stops every
read model stands at its log's head. Meanwhile, cells of games that no longer exist are
swept away (a game is registered before anything projects it, so a game registered after
the sweep listed the keys is never touched), but for the results cells an archived game
keeps (`agon archive`).

Replaying moves is CPU-bound: with `workers` > 1 forked processes take the partitions in
turn, each with its own connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import gc
import logging
import multiprocessing
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from schemas.codec import FIELD, FIELD_BYTES, DecodeError, unpack_event
from services.bus.connection import Client, connect, seen
from services.bus.keys import Keys
from services.bus.text import as_text
from services.gamelog.fold import GameFold, fold
from services.projector.models import (
    archived_games,
    game_of_field,
    game_of_key,
    kept_patterns,
    stored_models,
)
from services.projector.write import Write, write

log = logging.getLogger("agon.rebuild")

#: Games folded between two turns of the event loop (about a millisecond's work).
YIELD_EVERY = 32


@dataclass
class RebuildStats:
    games: int = 0
    events: int = 0
    #: games whose stored models were ahead of the rebuild's fold (a live projector)
    ahead: int = 0
    #: stale cells of vanished games removed
    swept: int = 0
    skipped: list[str] = field(default_factory=list)

    def add(self, other: RebuildStats) -> None:
        self.games += other.games
        self.events += other.events
        self.ahead += other.ahead
        self.skipped.extend(other.skipped)


async def rebuild(
    redis: Client, keys: Keys | None = None, chunk: int = 1000, *, workers: int = 1, url: str = ""
) -> RebuildStats:
    """Recompute every read model from the logs (see the module doc), and sweep."""
    keys = keys or Keys()
    parts = list(keys.all_partitions())
    stats = RebuildStats()
    # The sweep touches only games that are not registered, the rebuild only games that
    # are: the two go side by side.
    sweeping = asyncio.ensure_future(sweep(redis, keys))
    sweeping.add_done_callback(seen)  # if the rebuild fails first, its error is the one
    try:
        await _rebuild_all(redis, keys, parts, chunk, workers, url, stats)
    except BaseException:
        sweeping.cancel()
        raise
    stats.swept = await sweeping
    return stats


async def _rebuild_all(
    redis: Client,
    keys: Keys,
    parts: list[int],
    chunk: int,
    workers: int,
    url: str,
    stats: RebuildStats,
) -> None:
    if workers <= 1 or not url or "fork" not in multiprocessing.get_all_start_methods():
        stats.add(await _rebuild_partitions(redis, keys, parts, chunk))
    else:
        shares = await _shares(redis, keys, parts, workers)
        loop = asyncio.get_running_loop()
        # Fork, not spawn: the children start at once, with the engine already imported.
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            done = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        pool, _rebuild_in_process, url, keys.prefix, keys.partitions, share, chunk
                    )
                    for share in shares
                )
            )
        for part in done:
            stats.add(part)


async def _shares(redis: Client, keys: Keys, parts: list[int], workers: int) -> list[list[int]]:
    """Partitions dealt to `workers` so that each gets about as many games: biggest first,
    each to the least loaded worker. The whole rebuild waits for the slowest one."""
    pipe = redis.pipeline(transaction=False)
    for p in parts:
        pipe.zcard(keys.games(p))
    sizes = dict(zip(parts, await pipe.execute(), strict=True))
    shares: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for p in sorted(parts, key=lambda p: -sizes[p]):
        i = loads.index(min(loads))
        shares[i].append(p)
        loads[i] += sizes[p]
    return [share for share in shares if share]


def _rebuild_in_process(
    url: str, prefix: str, partitions: int, parts: list[int], chunk: int
) -> RebuildStats:
    async def main() -> RebuildStats:
        redis = await connect(url)
        try:
            return await _rebuild_partitions(redis, Keys(prefix, partitions), parts, chunk)
        finally:
            await redis.aclose()

    return asyncio.run(main())


async def _rebuild_partitions(
    redis: Client, keys: Keys, parts: Sequence[int], chunk: int
) -> RebuildStats:
    """Rebuild the read models of `parts`, chunk by chunk of games within a partition.

    Three stages overlap: while one chunk folds (CPU), Redis already reads the next one's
    logs and writes the previous one's read models (a write of several round trips makes
    progress whenever the fold pauses, every `YIELD_EVERY` games).
    """
    stats = RebuildStats()
    pipe = redis.pipeline(transaction=False)
    for p in parts:
        pipe.zrange(keys.games(p), 0, -1)
    chunks: list[list[str]] = []
    for members in await pipe.execute():
        ids = [as_text(g) for g in members]
        chunks.extend(ids[i : i + chunk] for i in range(0, len(ids), chunk))
    if not chunks:
        return stats
    raw = _raw_logs_client(redis)
    tasks: list[asyncio.Future[Any]] = []
    with _gc_paused():
        try:
            reading = _start(tasks, _read_raw_logs(raw, keys, chunks[0]))
            writing: asyncio.Future[Any] | None = None
            for i, ids in enumerate(chunks):
                log.info("rebuild: chunk %d of %d (%d games)", i + 1, len(chunks), len(ids))
                logs = await reading
                if i + 1 < len(chunks):
                    reading = _start(tasks, _read_raw_logs(raw, keys, chunks[i + 1]))
                    await asyncio.sleep(0)  # let it send its commands before the fold
                writes: list[Write] = []
                for n, (gid, rows) in enumerate(zip(ids, logs, strict=True)):
                    if n % YIELD_EVERY == 0:
                        await asyncio.sleep(0)  # the write before takes its next round trip
                    try:
                        datas = [_data(fields) for _, fields in rows]
                        game = fold(gid, map(unpack_event, datas))
                    except Exception as exc:
                        stats.skipped.append(f"game {gid}: {exc}")
                        continue
                    writes.append(rebuild_write(game))
                    stats.games += 1
                    stats.events += len(datas)
                if writing is not None:
                    stats.ahead += sum(1 for r, _ in await writing if r != -1)
                writing = _start(tasks, write(redis, keys, writes, optimistic=True))
            if writing is not None:
                stats.ahead += sum(1 for r, _ in await writing if r != -1)
        finally:
            for task in tasks:
                task.cancel()
    return stats


def rebuild_write(game: GameFold) -> Write:
    """Rebuild's write of a game folded from its log: it replaces what is stored unless the
    stored models are ahead of this fold (a live projector wrote a newer seq)."""
    return Write(game, 0, game.seq)


async def sweep(redis: Client, keys: Keys) -> int:
    """Remove read-model cells of games that are not registered; return how many went."""
    models = await stored_models(redis, keys)
    tables = [(name, kind) for name, kind in models if kind != "string"]
    pipe = redis.pipeline(transaction=False)
    for name, kind in tables:
        if kind == "zset":
            pipe.zrange(name, 0, -1)
        else:
            pipe.hkeys(name)
    members = await pipe.execute() if tables else []
    # An archived game keeps its results cells (`KEPT_WHEN_ARCHIVED`), nothing else. Archived
    # games are read before and after the registry: a game archived or restored meanwhile
    # is in one of the three.
    archived = set(await archived_games(redis, keys))
    known = set(await _game_ids(redis, keys))  # read after the listing: see the module doc
    archived |= set(await archived_games(redis, keys))
    known_or_archived = known | archived
    kept = kept_patterns(keys)
    pipe = redis.pipeline(transaction=False)
    stale_keys = [
        name for name, kind in models if kind == "string" and game_of_key(name) not in known
    ]
    for name in stale_keys:
        pipe.delete(name)  # one key per command: they are in different slots
    removed = len(stale_keys)
    for (name, kind), got in zip(tables, members, strict=True):
        keep = known_or_archived if any(fnmatch.fnmatchcase(name, p) for p in kept) else known
        stale = [m for m in map(as_text, got) if game_of_field(m) not in keep]
        if stale:
            (pipe.zrem if kind == "zset" else pipe.hdel)(name, *stale)
            removed += len(stale)
    if removed:
        await pipe.execute()
    return removed


async def _game_ids(redis: Client, keys: Keys) -> list[str]:
    pipe = redis.pipeline(transaction=False)
    for p in keys.all_partitions():
        pipe.zrange(keys.games(p), 0, -1)
    return [as_text(g) for ids in await pipe.execute() for g in ids]


def _start(tasks: list[asyncio.Future[Any]], work: Any) -> asyncio.Future[Any]:
    """A read or write run beside the fold. When Redis goes away, the one awaited next
    raises and the other, failed alike, is dropped: marked seen, it is not logged."""
    task: asyncio.Future[Any] = asyncio.ensure_future(work)
    task.add_done_callback(seen)
    tasks.append(task)
    return task


def _raw_logs_client(redis: Client) -> Client:
    """A client on `redis`'s connections that leaves XRANGE replies as the parser made them.

    redis-py turns every entry into a tuple and a dict; rebuild only wants the bytes. (A
    cluster client is used as it is.)
    """
    if not isinstance(redis, Redis):
        return redis
    raw = Redis(connection_pool=redis.connection_pool)
    raw.set_response_callback("XRANGE", _as_is)
    return raw


def _as_is(response: Any, **options: Any) -> Any:
    return response


async def _read_raw_logs(raw: Client, keys: Keys, ids: Sequence[str]) -> list[Any]:
    """Each game's log as rows of (id, fields), raw where the client allows it."""
    pipe = raw.pipeline(transaction=False)
    for gid in ids:
        pipe.xrange(keys.log(gid), "-", "+")
    result: list[Any] = await pipe.execute()
    return result


def _data(fields: Any) -> bytes:
    """Field `m` of an entry, raw ([k, v, ...]) or parsed ({k: v})."""
    if isinstance(fields, dict):
        return bytes(fields[FIELD_BYTES])
    if fields[0] == FIELD_BYTES:
        return bytes(fields[1])
    for i in range(2, len(fields) - 1, 2):
        if fields[i] == FIELD_BYTES:
            return bytes(fields[i + 1])
    raise DecodeError("malformed", f"no field {FIELD!r}")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic GC while folding: a chunk allocates a great many small, acyclic objects,
    and each collection would walk them all again (it doubles the time to decode)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
