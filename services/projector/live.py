"""The live projector: keeps every registered read model up to date from the partition feeds.

It consumes every partition's feed (group `projector`) through the shared consumer loop. A
batch's events are grouped by game; each game is folded on from its cached fold (or from
the stored `seen` seq, by reading the log) and its cells are written with the registry's
guarded write, which refuses a write unless the stored seq is exactly the one the fold
started from. A refused write (another projector or a rebuild got there first) drops the
cached fold and folds the game again from its log. A gap (a restart, a trimmed feed, a
lost race) folds from the log too, so the read models always end at the log's head.

When the projectors divide the partitions (`services.bus.ownership`), each write carries
the epoch of its partition's lease (`fence`), and the script refuses it once another
projector holds the lease: one paused past its lease that resumes writes nothing there,
gives the partition up (`lose`) and leaves the batch's entries of it pending, for the new
owner to claim.

With `replicas` (`--ack-replicas`, as the engine's), a batch is acknowledged only once the
server that serves each partition holds its games' models up to the batch's events and that
many replicas confirmed it (`write.unconfirmed`); otherwise the batch is read again. So a
master failover cannot keep the acknowledgement and lose the models it stood for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Unpack

from schemas.codec import FIELD, DecodeError, unpack, unpack_event
from schemas.events import EventMap
from services.bus.cache import LRU
from services.bus.clients import log_entries
from services.bus.connection import Client, ReplicasBehind
from services.bus.consumer import ConsumerOptions, ConsumerSettings, StreamConsumer
from services.bus.keys import FEED_GROUPS, PROJECTOR_GROUP, Keys
from services.bus.reader import Entry
from services.gamelog.fold import GameFold, fold
from services.projector.write import FENCED, Write, head_of, unconfirmed, write

log = logging.getLogger("agon.projector")


def feed_event(entry: Entry) -> EventMap:
    """The event map of a feed entry, checked for the two fields events are routed by."""
    if entry.data is None:
        raise DecodeError("malformed", f"no field {FIELD!r}")
    ev: Any = unpack(entry.data)
    if not isinstance(ev.get("game_id"), str) or not isinstance(ev.get("seq"), int):
        raise DecodeError("malformed", "no game_id/seq")
    event: EventMap = ev
    return event


class Projector(StreamConsumer):
    """Consumes every partition's feed into the read models: `run` or `drain`."""

    role = "projector"
    trim_groups = FEED_GROUPS

    def __init__(
        self,
        redis: Client,
        keys: Keys | None = None,
        *,
        settings: ConsumerSettings | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        keys = keys or Keys()
        feeds = [keys.feed(p) for p in keys.all_partitions()]
        self.join(redis, keys, feeds, PROJECTOR_GROUP, settings, partitioned=True, **options)
        #: events read, game writes done, games folded again from their logs, game writes
        #: refused because another projector owns the partition now (entries left pending)
        self.events = 0
        self.writes = 0
        self.refolds = 0
        self.fenced = 0
        #: per game: its fold, and the cells that fold last wrote
        self._cache: LRU[str, tuple[GameFold, dict[tuple[str, str], Any] | None]] = LRU(
            self.settings.cache_size
        )

    def stats(self) -> dict[str, int]:
        return {
            "events": self.events,
            "writes": self.writes,
            "refolds": self.refolds,
            "fenced": self.fenced,
            "set_aside": self.entries_set_aside,
        }

    def forget(self) -> None:
        """A failed batch may have folded events it never wrote: fold from Redis again."""
        self._cache.clear()

    def forget_partitions(self, partitions: set[int]) -> None:
        self._cache.drop(lambda gid: self.keys.partition(gid) in partitions)

    async def process(self, entries: Sequence[Entry]) -> None:
        by_game: dict[str, list[EventMap]] = {}
        tips: dict[str, tuple[int, bytes]] = {}  # per game its last entry: seq, bytes
        for entry in entries:
            try:
                ev = feed_event(entry)
            except DecodeError as exc:
                # Only the event store writes feeds, so this is corruption to report, not a
                # reason to stop; `agon verify` reads the logs, the source of truth.
                await self.set_aside(entry, f"{exc.code}: {exc.message}")
                continue
            self.events += 1
            gid, seq = ev["game_id"], ev["seq"]
            by_game.setdefault(gid, []).append(ev)
            if seq > tips.get(gid, (0, b""))[0]:
                tips[gid] = (seq, entry.data or b"")  # never empty: feed_event read it
        held: dict[str, int] = {}
        fenced: set[int] = set()
        pending = list(by_game)
        for _ in range(3):
            if not pending:
                break
            pending = await self._project(pending, by_game, tips, held, fenced)
        if pending:
            log.warning("projector: %d games kept racing; their next event retries", len(pending))
        if fenced:
            # Partitions given up: their models are the new owner's to confirm.
            held = {g: s for g, s in held.items() if self.keys.partition(g) not in fenced}
        if self.replicas and held:
            short = await unconfirmed(
                self.redis, self.keys, held, self.replicas, self.replica_timeout_ms
            )
            if short:
                raise ReplicasBehind(
                    f"the read models of {len(short)} games lack {self.replicas} replicas"
                )
        await self.ack_except(entries, fenced)

    async def _project(
        self,
        game_ids: list[str],
        by_game: dict[str, list[EventMap]],
        tips: dict[str, tuple[int, bytes]],
        held: dict[str, int],
        fenced: set[int],
    ) -> list[str]:
        """Fold and write the games' new events; return the games whose write was refused.
        `held` gets the seq each game's stored models now reach, as far as this knows;
        `fenced` the partitions another projector owns now (`_write`).

        Each write names the log entry its fold ended with (`Write.head`), so it lands
        only where the log holds that entry: after a failover the new master may lack an
        event this read from the old one, or hold another event of its seq."""
        for gid in game_ids:
            cached = self._cache.get(gid)
            if cached is not None and any(ev["seq"] <= cached[0].seq for ev in by_game[gid]):
                # An event its fold holds came again: a redelivery, or the same seq from a
                # new master whose log replaced what the fold read from the old one, and
                # which lost the models written from it. What is stored decides, not the
                # fold (a redelivery costs one read of the stored seq).
                self._cache.pop(gid)
        uncached = [g for g in game_ids if g not in self._cache]
        seen: dict[str, int] = {}
        if uncached:
            pipe = self.redis.pipeline(transaction=False)
            for gid in uncached:
                pipe.hget(self.keys.projector_seen(self.keys.partition(gid)), gid)
            for gid, value in zip(uncached, await pipe.execute(), strict=True):
                seen[gid] = int(value or 0)
        writes: list[Write] = []
        refold: list[str] = []
        for gid in game_ids:
            cached = self._cache.get(gid)
            game, since = cached if cached is not None else (None, None)
            stored = game.seq if game is not None else seen[gid]
            fresh = {ev["seq"]: ev for ev in by_game[gid] if ev["seq"] > stored}
            if not fresh:
                held[gid] = stored
                continue  # all projected already (a redelivery)
            if game is None and stored == 0 and 1 in fresh:
                # A new game whose log so far is all in this batch: no need to read it.
                try:
                    game = GameFold.start(fresh.pop(1))
                except Exception:
                    log.exception("projector: game %s does not start", gid)
                    continue
            seqs = sorted(fresh)
            if game is None or seqs != list(range(game.seq + 1, game.seq + 1 + len(seqs))):
                self._cache.pop(gid)
                seen[gid] = stored
                refold.append(gid)
                continue
            try:
                game.extend(fresh[s] for s in seqs)
            except Exception:
                log.exception("projector: game %s does not fold; dropped from cache", gid)
                self._cache.pop(gid)
                continue
            tip, data = tips[gid]
            head = head_of(data) if tip == game.seq else ""
            writes.append(Write(game, stored, stored, since, head))
        writes.extend(await self._refold(refold, seen))
        return await self._write(writes, held, fenced)

    async def _refold(self, game_ids: list[str], seen: dict[str, int]) -> list[Write]:
        """Fold games from their logs (a cache miss or a gap) up to the log head."""
        if not game_ids:
            return []
        self.refolds += len(game_ids)
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.xrange(self.keys.log(gid), "-", "+")
        out = []
        for gid, rows in zip(game_ids, await pipe.execute(), strict=True):
            entries = log_entries(rows)
            try:
                game = fold(gid, [unpack_event(e.data) for e in entries])
            except Exception:
                log.exception("projector: the log of game %s does not fold; skipped", gid)
                continue
            out.append(Write(game, seen[gid], seen[gid], head=head_of(entries[-1].data)))
        return out

    async def _write(
        self, writes: list[Write], held: dict[str, int], fenced: set[int]
    ) -> list[str]:
        """Write the folds, each under its partition's lease epoch; return the games whose
        write another write beat, to fold again. A partition whose lease another projector
        holds now goes to `fenced` and is given up: its games are neither retried nor held."""
        # The epochs the writes carry (read as `write` builds its calls, before any await).
        epochs = {p: self.fence(p) for p in {self.keys.partition(w.game.game_id) for w in writes}}
        results = await write(self.redis, self.keys, writes, written=True, fence=self.fence)
        refused: list[str] = []
        for w, (result, cells) in zip(writes, results, strict=True):
            game = w.game
            if result == FENCED:
                self.fenced += 1
                p = self.keys.partition(game.game_id)
                if p not in fenced:
                    fenced.add(p)
                    self.lose(p, epochs[p])  # drops its games' folds too
                continue
            if result != -1:
                # Someone else projected this game meanwhile: fold again from what is stored.
                self._cache.pop(game.game_id)
                if result < game.seq:
                    refused.append(game.game_id)
                else:
                    held[game.game_id] = game.seq
                continue
            held[game.game_id] = game.seq
            self.writes += 1
            if game.status == "ended":
                self._cache.pop(game.game_id)  # nothing more will happen to it
            else:
                self._cache.put(game.game_id, (game, cells))
        return refused
