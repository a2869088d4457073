"""The tournament director: plays every active tournament's schedule as ordinary games.

Each pass, for each active tournament: fold its log, read the last event of each pending
game's log, let the aggregate decide (results, replays, the next round, the end), append
what it decided after the head it folded, then create scheduled games up to the
tournament's concurrency, and in clocked tournaments no more than admission control allows
by the platform's measured lag (`services.bus.admission`), so that no game is spoiled by a
platform that took on more than it serves within the clocks. The director keeps nothing it
cannot fold again: game ids are derived from the schedule and `CreateGame` is idempotent
(its command id and game id are the schedule's), so killing it anywhere and starting it
again loses, doubles and re-pairs nothing; two directors at once only race for appends,
and the loser folds again.
A cancelled tournament's games still going are aborted by the operator (`aborted`).

Any number of directors may run (`agon director`): each beats like a consumer
(`Keys.processes`, role `director`), and the active tournaments are shared out among the
live ones by rendezvous hashing of (director, tournament), so each tournament has one
director at a time and a dead director's tournaments go to the others within a second.
While the directors' view of who is alive differs (one starting or dying), two may direct
the same tournament for a moment, which the guarded appends make harmless. A director of
one tournament (`only`, what `agon tournament run` runs) directs it whoever else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from schemas.codec import unpack
from schemas.commands import Abort, CreateGame, SeatSpec
from schemas.tokens import admin_token
from schemas.tournaments import TournamentEnded
from services.bus.admission import Admission, PlatformLag, platform_lag
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import TRANSIENT_ERRORS, Client
from services.bus.consumer import consumer_name
from services.bus.keys import Keys
from services.bus.ownership import share
from services.bus.presence import alive, beat, beating, processes
from services.bus.secret import shared_secret
from services.bus.text import now_ms
from services.tournament.aggregate import End, Tournament, decide
from services.tournament.store import TournamentStore

log = logging.getLogger("agon.director")

#: How often a running director looks at its tournaments.
EVERY_S = 0.2


class Director:
    """Runs the active tournaments (or only `only`) until stopped."""

    role = "director"

    def __init__(
        self,
        redis: Client,
        keys: Keys | None = None,
        *,
        only: str | None = None,
        secret: bytes | None = None,
        every_s: float = EVERY_S,
    ) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.store = TournamentStore(redis, self.keys)
        self.commands = CommandClient(redis, self.keys)
        self.query = QueryClient(redis, self.keys)
        self.only = only
        self.secret = secret or b""
        self.every_s = every_s
        #: this director's name in the heartbeats
        self.name = consumer_name(self.role)
        self.games_created = 0
        self.events_appended = 0
        #: each tournament as folded so far: a pass reads only the events after it
        self._folds: dict[str, Tournament] = {}
        #: each tournament's admission control, and the platform's lag read once a pass
        self._admission: dict[str, Admission] = {}
        self._lag = PlatformLag()

    async def setup(self) -> None:
        if not self.secret:
            self.secret = await shared_secret(self.redis, self.keys)

    def stats(self) -> dict[str, int]:
        return {"games_created": self.games_created, "events": self.events_appended}

    async def run(self, stop: asyncio.Event) -> None:
        """Direct until `stop`, beating beside the passes; leave the heartbeats at the end."""
        while not self.secret and not stop.is_set():
            try:
                await self.setup()
            except TRANSIENT_ERRORS as exc:
                log.warning("%s: Redis unavailable (%s); retrying", self.name, exc)
                await asyncio.sleep(0.5)
        log.warning("%s ready: directing %s", self.name, self.only or "its share of tournaments")
        try:
            async with beating(self.redis, self.keys, self.name, self._beat):
                while not stop.is_set():
                    try:
                        await self.drain()
                    except TRANSIENT_ERRORS as exc:  # Redis away, a failover: one line, go on
                        log.warning("%s: Redis unavailable (%s); retrying", self.name, exc)
                    except Exception:  # a bad pass must not end the director: log it, go on
                        if stop.is_set():  # stopping: the client may be closed under the pass
                            log.info("%s: a pass cut short by the stop", self.name)
                            break
                        log.exception("director: a pass failed; trying again")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), self.every_s)
        finally:
            log.info("%s stopped", self.name)

    async def _beat(self) -> None:
        """Tell the other directors (and `agon status`) that this one is alive."""
        extra = {"tournament": self.only} if self.only else {}
        await beat(self.redis, self.keys, self.name, self.role, "", **self.stats(), **extra)

    async def drain(self) -> int:
        """One pass over the tournaments; the number of events appended and games created."""
        if not self.secret:
            await self.setup()
        if self.only:
            ids = [self.only]
        else:
            ids = await self.store.ids(active=True)
            if ids:
                ids = share(ids, await self._peers(), self.name)
        if ids:
            self._lag = platform_lag(await self.query.processes())
        done = 0
        for tid in ids:
            done += await self.advance(tid)
        return done

    async def _peers(self) -> list[str]:
        """The live directors that share the active tournaments out, this one among them."""
        now = now_ms()
        peers = {self.name}
        for name, b in (await processes(self.redis, self.keys)).items():
            if b.role == self.role and not b.stats.get("tournament") and alive(b, now):
                peers.add(name)
        return sorted(peers)

    async def advance(self, tournament_id: str) -> int:
        # The fold leaves the cache while this pass decides on it and comes back only once
        # its events are in the log: a pass cut short (Redis gone mid-append) never leaves
        # a fold ahead of the log, which would retire a tournament whose end was not written.
        t = self._folds.pop(tournament_id, None)
        if t is None:
            t = await self.store.load(tournament_id)
        else:
            await self.store.catch_up(t)
        if t is None:
            await self.store.retire(tournament_id)
            return 0
        if t.ended is not None:
            self._admission.pop(t.id, None)
            return await self._wind_up(t)
        head = t.seq
        last = await self._started(t)
        ends = {
            gid: End(ev["result"], ev["reason"], ev.get("fault", 0))
            for gid, ev in last.items()
            if ev is not None and ev["type"] == "game_ended"
        }
        events = decide(t, ends, now_ms())
        if not await self.store.append(t.id, head, events):
            return 0  # another writer moved the log on: fold it again next pass
        self.events_appended += len(events)
        for ev in events:
            if isinstance(ev, TournamentEnded):
                log.info("tournament %s ended: %s %s", t.id, ev.reason, ev.detail)
        if t.ended is not None:
            return len(events) + await self._wind_up(t)
        self._folds[t.id] = t
        return len(events) + await self._create(t, {gid for gid, ev in last.items() if ev})

    async def _started(self, t: Tournament) -> dict[str, Any]:
        """The newest event of each pending game that may exist (None: not created yet).

        Games are created in schedule order, at most `concurrency` at a time, so those that
        exist are among the first `concurrency` pending ones."""
        game_ids = [g.game_id for g in t.pending()[: t.spec.concurrency]]
        if not game_ids:
            return {}
        newest = await self.query.newest(game_ids)
        return {
            gid: None if entry is None else unpack(entry.data)
            for gid, entry in zip(game_ids, newest, strict=True)
        }

    async def _create(self, t: Tournament, existing: set[str]) -> int:
        """Create scheduled games, in order, while fewer than the concurrency are going."""
        spec = t.spec
        pending = t.pending()
        going = sum(1 for g in pending if g.game_id in existing)
        admission = self._admission.get(t.id)
        if admission is None:
            admission = self._admission[t.id] = Admission(spec.move_time_ms, spec.concurrency)
        admission.observe(self._lag)
        todo = [g for g in pending if g.game_id not in existing][: admission.room(going)]
        commands = [
            CreateGame(
                command_id=f"tour:{g.game_id}",
                game_id=g.game_id,
                game=spec.game,
                options=spec.options,
                seats=[SeatSpec(kind="bot", name=name) for name in g.seats],
                move_time_ms=spec.move_time_ms,
                seed=g.seed,
                time_bank_ms=spec.time_bank_ms,
                on_timeout=spec.on_timeout,
                forfeit_illegal=True,
                tournament=t.id,
            )
            for g in todo
        ]
        await self.commands.send(commands)
        self.games_created += len(commands)
        return len(commands)

    async def _wind_up(self, t: Tournament) -> int:
        """An ended tournament: abort its games still going (a cancel), stop running it."""
        last = await self._started(t)
        going = [gid for gid, ev in last.items() if ev is not None and ev["type"] != "game_ended"]
        token = admin_token(self.secret)
        await self.commands.send(
            [Abort(command_id=f"cancel:{gid}", game_id=gid, seat=0, token=token) for gid in going]
        )
        await self.store.retire(t.id)
        return len(going)


async def cancel(store: TournamentStore, tournament_id: str, why: str = "") -> Tournament:
    """End a tournament as cancelled (its director aborts its games still going)."""
    for _ in range(20):
        t = await store.load(tournament_id)
        if t is None:
            raise KeyError(tournament_id)
        if t.ended is not None:
            return t
        ev = TournamentEnded(
            tournament_id=t.id,
            seq=t.seq + 1,
            time=now_ms(),
            reason="cancelled",
            detail=why or "cancelled by the operator",
        )
        if await store.append(t.id, t.seq, [ev]):
            t.apply(ev)
            await store.index(t.id, t.created.time)  # let a director wind it up
            return t
        await asyncio.sleep(0.01)
    raise RuntimeError(f"tournament {tournament_id}: the log kept moving; try again")
