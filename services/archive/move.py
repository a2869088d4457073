"""Moving finished games out of Redis into the archive (`archive`), and back (`restore`).

`archive` never loses a game. It takes finished games whose end is older than the
threshold (found through the projector's `ended` index, whose score is the creation time,
never later than the end), and for each writes the file under a temporary name, fsyncs it,
renames it, reads it back and checks it (hash chain, replay through the rules, and byte for
byte the log in Redis), and lists it in the index. Only then one Lua script in the game's
partition (every key carries its `{p}` tag, so it works on a Redis Cluster) deletes the
game, after checking atomically that its log is still the one written (length, sha1 of
the last event), that it ends with `game_ended` no later than the cutoff, and that the
projector has folded it to its end: a game still going, one that ended recently, or one
another archiver took meanwhile is left alone. A refused game stays listed in the index (its
file is sound; Redis, which readers ask first, still has it) until a later run takes it.

What goes: the log, the reply memory, the game's cells of every read model but its results
(its view and index entries), its projector seen seq and its entry in the games registry;
the game joins its partition's archived set (`Keys.archived`). Its results records stay
(`KEPT_WHEN_ARCHIVED`: standings, leaderboards and ratings read them), and the archived set
records a digest of them: `agon rebuild` leaves them alone and `agon verify` checks them
against it. A tournament game is archived only once its tournament has recorded it: the
director reads the logs of the games it waits for.

`restore` reads a game's file back, checks its hash chain, its replay and the sha256 the
index recorded, and writes the log with a script that refuses when the game has a log (or
is registered) in Redis: the same entries ("<seq>-0") the event store appended, with no
feed entries (a finished game gives live readers nothing to do). It registers the game,
takes it out of the archived set, and writes its read models with rebuild's guarded write.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from schemas.codec import unpack_event
from schemas.views import StoredView
from services.archive.files import Archive, ArchiveError, Entry
from services.bus.clients import LogEntry, QueryClient, log_entries
from services.bus.connection import Client
from services.bus.keys import Keys
from services.bus.scripts import Script
from services.bus.text import as_text
from services.gamelog.fold import GameFold, fold
from services.projector.models import KEPT_WHEN_ARCHIVED, READ_MODELS, kept_cells, kept_digest
from services.projector.rebuild import rebuild_write
from services.projector.write import write

#: Games read from Redis, written and deleted per round.
CHUNK = 64


# -- archiving ------------------------------------------------------------------------------
# Delete one archived game from Redis, if it is still exactly what was archived.
# KEYS[1] log, KEYS[2] reply memory, KEYS[3] games registry, KEYS[4] projector seen,
#   KEYS[5] archived set, KEYS[6..] the game's read-model keys whose cells go.
# ARGV[1] game id, ARGV[2] head (events written), ARGV[3] sha1 of the last event's bytes,
#   ARGV[4] cutoff (ms): the game must have ended by then, ARGV[5] the digest of the results
#   cells it keeps; then per KEYS[6..] the cell's kind ('string': DEL the key, 'zset': ZREM,
#   'hash': HDEL) and its member or field.
# Returns 'archived', or why the game was left alone.
_ARCHIVE = Script(
    """
local gid, head = ARGV[1], tonumber(ARGV[2])
local n = redis.call('XLEN', KEYS[1])
if n == 0 then
  if redis.call('HEXISTS', KEYS[5], gid) == 1 then return 'archived already' end
  return 'no log'
end
if n ~= head then return 'log moved on' end
local last = redis.call('XRANGE', KEYS[1], head .. '-0', head .. '-0')
if #last == 0 then return 'log moved on' end
local data
local kv = last[1][2]
for i = 1, #kv, 2 do if kv[i] == 'm' then data = kv[i + 1] end end
if not data or redis.sha1hex(data) ~= ARGV[3] then return 'log changed' end
local ok, ev = pcall(cmsgpack.unpack, data)
if not ok or type(ev) ~= 'table' or ev['type'] ~= 'game_ended' then return 'not ended' end
if tonumber(ev['time']) > tonumber(ARGV[4]) then return 'ended recently' end
if tonumber(redis.call('HGET', KEYS[4], gid) or '0') ~= head then return 'not projected yet' end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], gid)
redis.call('HDEL', KEYS[4], gid)
for i = 6, #KEYS do
  local kind, member = ARGV[2 * i - 6], ARGV[2 * i - 5]
  if kind == 'string' then redis.call('DEL', KEYS[i])
  elseif kind == 'zset' then redis.call('ZREM', KEYS[i], member)
  else redis.call('HDEL', KEYS[i], member) end
end
redis.call('HSET', KEYS[5], gid, ARGV[5])
return 'archived'
"""
)

# Write a restored game's log back, unless the game is in Redis.
# KEYS[1] log, KEYS[2] games registry, KEYS[3] archived set.
# ARGV[1] game id, ARGV[2] its creation time (the registry's score), ARGV[3..] the events.
_RESTORE = Script(
    """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'a log of this game is in Redis' end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 'the game is registered in Redis' end
for i = 3, #ARGV do redis.call('XADD', KEYS[1], (i - 2) .. '-0', 'm', ARGV[i]) end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 'restored'
"""
)


@dataclass
class ArchiveStats:
    """What an archive run did."""

    #: ended games created before the cutoff (the ones looked at)
    candidates: int = 0
    archived: int = 0
    #: gzip bytes written (dry run: 0)
    bytes_written: int = 0
    #: MEMORY USAGE of the keys deleted (log, view, reply memory), taken before the deletion
    redis_bytes: int = 0
    events: int = 0
    #: why games were left in Redis, with how many
    skipped: Counter[str] = field(default_factory=Counter)
    #: one line per game whose file failed
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    dry_run: bool = False

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out["skipped"] = dict(self.skipped)
        out["games_per_sec"] = round(self.archived / self.seconds, 1) if self.seconds else 0.0
        return out


OnProgress = Callable[[int, int | None], None]


async def candidates(redis: Client, keys: Keys, cutoff: int) -> list[str]:
    """Ended games created by `cutoff` (a game ends after it is created), oldest first."""
    pipe = redis.pipeline(transaction=False)
    for p in keys.all_partitions():
        pipe.zrange(keys.index_status(p, "ended"), "-inf", cutoff, byscore=True, withscores=True)
    found = [(float(s), as_text(g)) for rows in await pipe.execute() for g, s in rows]
    return [gid for _, gid in sorted(found)]


async def archive(
    redis: Client,
    keys: Keys,
    where: Archive,
    older_than_ms: int,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    now: int | None = None,
    progress: OnProgress | None = None,
) -> ArchiveStats:
    """Move finished games that ended more than `older_than_ms` ago to the archive (see the
    module doc); with `dry_run` only count what would go. `progress(done, total)` after
    each round: candidates looked at, or with a `limit` games archived."""
    started = time.perf_counter()
    now = int(time.time() * 1000) if now is None else now
    cutoff = now - older_than_ms
    stats = ArchiveStats(dry_run=dry_run)
    ids = await candidates(redis, keys, cutoff)
    stats.candidates = len(ids)
    total = len(ids) if limit is None else min(limit, len(ids))
    for start in range(0, len(ids), CHUNK):
        room = None if limit is None else limit - stats.archived
        if room is not None and room <= 0:
            break
        chunk = ids[start : start + CHUNK]
        await _archive_chunk(redis, keys, where, chunk, cutoff, now, room, stats)
        if progress is not None:
            progress(start + len(chunk) if limit is None else stats.archived, total)
    stats.seconds = time.perf_counter() - started
    return stats


@dataclass
class _Game:
    """A game on its way to the archive."""

    gid: str
    view: StoredView
    entries: list[LogEntry]
    fold: GameFold
    redis_bytes: int
    entry: Entry | None = None


async def _archive_chunk(
    redis: Client,
    keys: Keys,
    where: Archive,
    ids: list[str],
    cutoff: int,
    now: int,
    room: int | None,
    stats: ArchiveStats,
) -> None:
    games = await _finished(redis, keys, ids, cutoff, stats)
    if room is not None:
        games = games[:room]
    if stats.dry_run:
        stats.archived += len(games)
        stats.redis_bytes += sum(g.redis_bytes for g in games)
        stats.events += sum(len(g.entries) for g in games)
        return
    for g in games:
        try:
            g.entry = await asyncio.to_thread(where.store, g.entries, g.view, now)
        except (ArchiveError, OSError) as exc:
            stats.failed.append(
                str(exc) if isinstance(exc, ArchiveError) else f"game {g.gid}: {exc}"
            )
    written = [g for g in games if g.entry is not None]
    if not written:
        return
    # Listed before anything is deleted: a crash in between leaves a game in both places.
    await asyncio.to_thread(where.append, [asdict(g.entry) for g in written if g.entry])
    answers = await _ARCHIVE.run_many(redis, [_archive_call(keys, g, cutoff) for g in written])
    for g, answer in zip(written, answers, strict=True):
        why = as_text(answer)
        if why != "archived":
            stats.skipped[why] += 1
            continue
        assert g.entry is not None
        stats.archived += 1
        stats.bytes_written += g.entry.size
        stats.redis_bytes += g.redis_bytes
        stats.events += len(g.entries)


async def _finished(
    redis: Client, keys: Keys, ids: list[str], cutoff: int, stats: ArchiveStats
) -> list[_Game]:
    """The games of `ids` that ended by `cutoff` and that nothing still needs: their logs,
    folds and the MEMORY USAGE of their own keys."""
    views = await QueryClient(redis, keys).views(ids)
    ready: list[str] = []
    viewed: dict[str, StoredView] = {}
    tournaments: dict[str, str] = {}
    for gid, view in zip(ids, views, strict=True):
        if view is None:
            stats.skipped["no view (archived meanwhile?)"] += 1
        elif view["status"] != "ended":
            stats.skipped["not ended"] += 1
        elif view["updated"] > cutoff:
            stats.skipped["ended recently"] += 1
        else:
            ready.append(gid)
            viewed[gid] = view
            if view.get("tournament"):
                tournaments[gid] = view["tournament"]
    if tournaments:
        waiting = await _unrecorded(redis, keys, set(tournaments.values()))
        kept = {gid for gid in tournaments if gid in waiting}
        stats.skipped["its tournament has not recorded it"] += len(kept)
        ready = [gid for gid in ready if gid not in kept]
    if not ready:
        return []
    pipe = redis.pipeline(transaction=False)
    for gid in ready:
        pipe.xrange(keys.log(gid), "-", "+")
        for key in (keys.log(gid), keys.view(gid), keys.replies_memory(gid)):
            pipe.memory_usage(key, samples=0)
    answers = await pipe.execute()
    out = []
    for i, gid in enumerate(ready):
        rows, *sizes = answers[4 * i : 4 * i + 4]
        entries = log_entries(rows)
        if not entries:
            stats.skipped["no log (archived meanwhile?)"] += 1
            continue
        try:
            events = [unpack_event(e.data) for e in entries]
            game = GameFold.start(events[0], replay=False)  # the facts; the file check replays
            game.extend(events[1:])
        except Exception as exc:
            stats.failed.append(f"game {gid}: its log does not fold ({exc})")
            continue
        if game.status != "ended" or game.seq != viewed[gid]["seq"]:
            stats.skipped["not projected yet"] += 1
            continue
        out.append(_Game(gid, viewed[gid], entries, game, sum(int(s or 0) for s in sizes)))
    return out


async def _unrecorded(redis: Client, keys: Keys, tournament_ids: Iterable[str]) -> set[str]:
    """The games the tournaments still wait for (their director reads those games' logs)."""
    # Here, not at the top: `agon replay` reads archives, and tournaments load networkx.
    from services.tournament.store import TournamentStore

    tids = sorted(tournament_ids)
    loaded = await TournamentStore(redis, keys).load_many(tids)
    return {g.game_id for t in loaded if t is not None for g in t.pending()}


def _archive_call(keys: Keys, g: _Game, cutoff: int) -> tuple[list[str], list[Any]]:
    gid = g.gid
    p = keys.partition(gid)
    script_keys = [
        keys.log(gid),
        keys.replies_memory(gid),
        keys.games(p),
        keys.projector_seen(p),
        keys.archived(p),
    ]
    last = hashlib.sha1(g.entries[-1].data).hexdigest()
    digest = kept_digest(kept_cells(keys, g.fold))
    args: list[Any] = [gid, len(g.entries), last, cutoff, digest]
    for model in READ_MODELS:
        if model.name in KEPT_WHEN_ARCHIVED:
            continue
        for cell in model.cells(keys, g.fold):
            script_keys.append(cell.key)
            args += [cell.kind, cell.field or gid]
    return script_keys, args


# -- restoring ------------------------------------------------------------------------------
@dataclass
class RestoreStats:
    """What a restore did: games restored, and a line per game it did not restore."""

    restored: list[str] = field(default_factory=list)
    #: games Redis has already, left as they are
    skipped: list[str] = field(default_factory=list)
    #: games whose file failed its checks (or is missing)
    refused: list[str] = field(default_factory=list)
    events: int = 0
    seconds: float = 0.0


async def restore(
    redis: Client,
    keys: Keys,
    where: Archive,
    game_ids: Sequence[str],
    *,
    progress: OnProgress | None = None,
) -> RestoreStats:
    """Bring archived games back into Redis (see the module doc). A file that fails its
    checks is refused (a line in `refused`), a game Redis has is skipped; the rest are
    restored with their read models rewritten."""
    started = time.perf_counter()
    stats = RestoreStats()
    for start in range(0, len(game_ids), CHUNK):
        chunk = game_ids[start : start + CHUNK]
        logs: list[tuple[str, list[LogEntry]]] = []
        for gid in chunk:
            try:
                entries = await asyncio.to_thread(where.load, gid, replay=True, tree=True)
            except ArchiveError as exc:
                stats.refused.append(str(exc))
                continue
            if entries is None:
                stats.refused.append(f"game {gid}: not in the archive {where.root}")
                continue
            logs.append((gid, entries))
        if logs:
            await _restore_logs(redis, keys, where, logs, stats)
        if progress is not None:
            progress(min(len(game_ids), start + CHUNK), len(game_ids))
    stats.seconds = time.perf_counter() - started
    return stats


async def _restore_logs(
    redis: Client,
    keys: Keys,
    where: Archive,
    logs: list[tuple[str, list[LogEntry]]],
    stats: RestoreStats,
) -> None:
    folds = [fold(gid, [unpack_event(e.data) for e in entries]) for gid, entries in logs]
    calls = []
    for (gid, entries), game in zip(logs, folds, strict=True):
        p = keys.partition(gid)
        calls.append(
            (
                [keys.log(gid), keys.games(p), keys.archived(p)],
                [gid, game.created["time"], *(e.data for e in entries)],
            )
        )
    answers = await _RESTORE.run_many(redis, calls)
    restored: list[GameFold] = []
    for (gid, entries), game, answer in zip(logs, folds, answers, strict=True):
        why = as_text(answer)
        if why != "restored":
            stats.skipped.append(f"game {gid}: {why}; left as it is")
            continue
        restored.append(game)
        stats.restored.append(gid)
        stats.events += len(entries)
    if not restored:
        return
    # The read models, as rebuild writes them: over whatever the game left behind.
    await write(redis, keys, [rebuild_write(game) for game in restored])
    marked = int(time.time() * 1000)
    await asyncio.to_thread(
        where.append, [{"id": game.game_id, "restored": marked} for game in restored]
    )
