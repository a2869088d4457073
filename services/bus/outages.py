"""Outages: the spells in which Redis refused the platform's writes, and the clocks' pause.

When Redis runs out of memory (or a master turns replica in a failover) nobody's command can
reach a command stream: a bot that chose its move in time cannot send it. That time is the
platform's, never a player's. Every consumer notices a refusal within a heartbeat
(`WriteWatch`, fed by its heartbeat and its batches) and, at its first accepted write after
it, records the spell in one sorted set (`Keys.outages`), from its last accepted write before
the refusal to its first one after (the spell as wide as it could have been). The engine
adds the paused time (`paused_ms`) to a deadline when it judges a move or a timeout claim,
and the dispatcher re-arms a clock that came due in a spell, handing the bot its turn again
with the time it had left.

A master of a Redis Cluster that dies stops only its own partitions: a bot whose game
lives there cannot send its move until the master's replica takes over. Every cluster
client notices (`AgonCluster`: a node it counted down, until it answers again or its
slots moved), and each consumer that runs on it records the spell for that master's
partitions alone (`Keys.outages(p)`, beside the partition's games), from when the cluster
last heard from the master to when its slots were served again. The engine takes such a
spell into account at once, before it is written; the engine and the dispatcher read
those of the partitions they judge besides the ones of every partition.

Spells older than `KEEP_MS` are dropped when a new one is written, so the set stays small.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from services.bus.connection import TRANSIENT_ERRORS, Client
from services.bus.keys import Keys

#: How long a spell is kept: longer than any turn's allowance.
KEEP_MS = 24 * 3_600_000
#: At most this many spells are read back (the newest).
READ_LIMIT = 1_000

Spell = tuple[int, int]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def record(
    redis: Client, keys: Keys, spell: Spell, partitions: Iterable[int | None] = (None,)
) -> None:
    """Write a spell (start, end in ms), for every partition or those of `partitions`
    (their master did not answer), and drop the ones older than `KEEP_MS`."""
    start, end = spell
    pipe = redis.pipeline(transaction=False)
    for p in partitions:
        pipe.zadd(keys.outages(p), {f"{start}-{end}": end})
        pipe.zremrangebyscore(keys.outages(p), "-inf", end - KEEP_MS)
    await pipe.execute()


async def spells(redis: Client, keys: Keys, since: int = 0) -> list[Spell]:
    """The newest `READ_LIMIT` recorded spells of every partition that ended after `since`,
    oldest first."""
    members: Any = await redis.zrevrangebyscore(
        keys.outages(), "+inf", since, start=0, num=READ_LIMIT
    )
    return _spells(members)


async def partition_spells(
    redis: Client, keys: Keys, partitions: Iterable[int | None], since: int = 0
) -> dict[int | None, list[Spell]]:
    """`spells` of each of `partitions` (None: every partition's) in one round trip; a
    partition whose master does not answer (it is failing over) is left out, so that it
    holds back none of the others."""
    wanted = list(partitions)
    pipe = redis.pipeline(transaction=False)
    for p in wanted:
        pipe.zrevrangebyscore(keys.outages(p), "+inf", since, start=0, num=READ_LIMIT)
    answers = await pipe.execute(raise_on_error=False)
    out = {}
    for p, answer in zip(wanted, answers, strict=True):
        if isinstance(answer, Exception):
            if not isinstance(answer, TRANSIENT_ERRORS):
                raise answer
            continue
        out[p] = _spells(answer)
    return out


def _spells(members: Any) -> list[Spell]:
    out = []
    for member in members:
        start, _, end = (member.decode() if isinstance(member, bytes) else member).partition("-")
        out.append((int(start), int(end)))
    return sorted(out)


def paused_ms(recorded: Iterable[Spell], start: int, end: int) -> int:
    """How much of [start, end] fell in the spells (overlapping spells counted once)."""
    total, reach = 0, start
    for a, b in sorted(recorded):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


class WriteWatch:
    """One process's view of whether Redis takes its writes: `refused()` after a write was
    refused, `accepted()` after one went through (it returns the spell that write ended, if
    any), and `recorded()` once that spell is written: till then it stays open, so a spell
    whose record was refused in turn is not lost."""

    def __init__(self) -> None:
        self.last_accepted = _now_ms()
        self.refused_since: int | None = None

    @property
    def refusing(self) -> bool:
        return self.refused_since is not None

    def refused(self) -> None:
        if self.refused_since is None:
            self.refused_since = self.last_accepted

    def accepted(self) -> Spell | None:
        now = _now_ms()
        start, self.last_accepted = self.refused_since, now
        return None if start is None else (start, now)

    def recorded(self) -> None:
        self.refused_since = None


__all__ = [
    "KEEP_MS",
    "Spell",
    "WriteWatch",
    "partition_spells",
    "paused_ms",
    "record",
    "spells",
]
