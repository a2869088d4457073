"""Tournament logs in Redis: create, read, append after a known head, list.

Every append names the head it follows; the script refuses it (answering the head) when
the log has moved on, so a restarted or a second director, or a cancel racing a director,
never doubles or interleaves events. A log's entry ids are "<seq>-0", as a game log's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter

from schemas.codec import FIELD, FIELD_BYTES, encode, unpack
from schemas.tournaments import TournamentCreated, TournamentEvent, TournamentSpec
from services.bus.connection import Client
from services.bus.keys import Keys
from services.bus.scripts import Script
from services.bus.text import as_text
from services.tournament.aggregate import Event, Tournament

_EVENTS: TypeAdapter[TournamentEvent] = TypeAdapter(TournamentEvent)

# KEYS[1]: the log. ARGV[1]: the field, ARGV[2]: the head the events follow, then the
# encoded events. Returns -1 when appended, else the log's head.
_APPEND = Script(
    """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local head = 0
if #last > 0 then head = tonumber(string.match(last[1][1], '^(%d+)')) end
if head ~= tonumber(ARGV[2]) then return head end
for i = 3, #ARGV do
  redis.call('XADD', KEYS[1], (head + i - 2) .. '-0', ARGV[1], ARGV[i])
end
return -1
"""
)


class TournamentExists(Exception):
    """A tournament with that id exists already."""


class TournamentStore:
    def __init__(self, redis: Client, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def append(self, tournament_id: str, head: int, events: Sequence[Event]) -> bool:
        """Append `events` if the log's head is `head`; False (nothing written) if not."""
        if not events:
            return True
        args: list[Any] = [FIELD, head, *(encode(ev) for ev in events)]
        answer = await _APPEND(self.redis, [self.keys.tournament_log(tournament_id)], args)
        return int(answer) == -1

    async def create(
        self, tournament_id: str, spec: TournamentSpec, now: int, command_id: str = ""
    ) -> None:
        """Start a tournament's log and list it; `TournamentExists` if the id is taken."""
        created = TournamentCreated(
            tournament_id=tournament_id,
            seq=1,
            time=now,
            spec=spec,
            command_id=command_id or f"create:{tournament_id}",
        )
        if not await self.append(tournament_id, 0, [created]):
            raise TournamentExists(f"tournament {tournament_id} exists already")
        await self.index(tournament_id, now)

    async def index(self, tournament_id: str, created_ms: int) -> None:
        """List the tournament, and for the directors as active (idempotent)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(self.keys.tournaments(), {tournament_id: created_ms})
        pipe.zadd(self.keys.active_tournaments(), {tournament_id: created_ms})
        await pipe.execute()

    async def retire(self, tournament_id: str) -> None:
        await self.redis.zrem(self.keys.active_tournaments(), tournament_id)

    async def events(self, tournament_id: str, after: int = 0) -> list[Event]:
        """The log's events after seq `after`."""
        rows: Any = await self.redis.xrange(
            self.keys.tournament_log(tournament_id), f"{after + 1}-0", "+"
        )
        return _decoded(rows)

    async def load(self, tournament_id: str) -> Tournament | None:
        (t,) = await self.load_many([tournament_id])
        return t

    async def load_many(self, tournament_ids: Sequence[str]) -> list[Tournament | None]:
        """Each tournament folded from its log (None for none), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for tid in tournament_ids:
            pipe.xrange(self.keys.tournament_log(tid))
        logs = [_decoded(rows) for rows in await pipe.execute()]
        return [Tournament.fold(events) if events else None for events in logs]

    async def catch_up(self, t: Tournament) -> None:
        """Fold into `t` what its log holds beyond it."""
        for ev in await self.events(t.id, after=t.seq):
            t.apply(ev)

    async def ids(self, *, active: bool = False, limit: int = 1000, offset: int = 0) -> list[str]:
        """Tournament ids, newest first, from the `offset`-th."""
        key = self.keys.active_tournaments() if active else self.keys.tournaments()
        raw: Any = await self.redis.zrevrange(key, offset, offset + limit - 1)
        return [as_text(r) for r in raw]


def _decoded(rows: Any) -> list[Event]:
    return [_EVENTS.validate_python(unpack(fields[FIELD_BYTES])) for _, fields in rows]
