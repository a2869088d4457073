"""Presence: who is alive, from one heartbeat per process, and how far behind each group is.

Every running process beats: the consumers (engines, projectors, dispatchers, bot workers),
the directors, the gateways, and a gateway once more for each outside bot it streams to.
A beat is one field of the `Keys.processes` hash, named after the process, holding a JSON
object: role, group, time (ms), pid, host, and whatever else the process tells (its
counters, `ack_replicas`, a gateway's url: `Beat.stats`). A process beats every `EVERY_S`
(`beating`) and removes its beat when it stops; it counts as alive while its last beat is
at most `ALIVE_MS` old (`alive`). That one rule serves everyone who asks: a consumer
claiming a dead one's entries, the directors sharing the tournaments out, the dispatcher
telling a served bot from an unserved one, admission control counting a bot process's lag,
`agon status`. (As arq keeps one key with a TTL and checks it one way; a hash field has no
TTL of its own, so the time is in the beat, and housekeeping drops beats older than
`FORGET_AFTER_MS`, left by processes that were killed.)

On a Redis Cluster the beats are kept twice, on two masters (`beat_keys`): every beat goes
to both, a reader takes the newer of the two, and neither waits long for a copy whose master
died (`on_each`), so one master's death blinds nobody to who is alive. A reader that could
not read them (or waited out an outage) judges nobody dead for `SETTLE_MS` after (`Sight`).

The pipeline's backlog is read one way too: `group_rows` turns XINFO GROUPS of some streams
into a row per stream and group (lag: entries not yet delivered to the group; pending:
delivered, not yet acknowledged), and `group_totals` sums them per group, for the
consumers' stats line, the gateway's metrics, `agon status` and the load benchmark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any

from services.bus.connection import TRANSIENT_ERRORS, Client, is_cluster, seen
from services.bus.keys import Keys
from services.bus.text import as_text, now_ms

log = logging.getLogger("agon.bus")

#: How often a running process beats: four beats in `ALIVE_MS`, so one late beat is no death.
EVERY_S = 0.175
#: A process whose last beat is at most this old is alive; older, its work goes to others
#: (a killed bot worker's turn is answered by another well inside a 2 s move clock).
ALIVE_MS = 700
#: Beats older than this (of processes killed before they could remove theirs) are dropped.
FORGET_AFTER_MS = 3_600_000
#: The fields that say who beats; every other field is in `Beat.stats`.
FIELDS = ("role", "group", "time", "pid", "host")


@dataclass(frozen=True, slots=True)
class Beat:
    """A process's last heartbeat, as `beat_value` stores it."""

    role: str
    #: its consumer group ("" for a process that is not a consumer: director, gateway)
    group: str = ""
    #: when it beat (ms since the epoch); 0 for a beat that does not say
    time: int = 0
    pid: int | None = None
    host: str | None = None
    #: everything else it told: counters, `ack_replicas`, a gateway's `url`, ...
    stats: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: bytes | str | None) -> Beat | None:
        """A stored beat; None for a missing one or one that is not a JSON object."""
        if raw is None:
            return None
        try:
            data = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        return cls(
            role=str(data.get("role", "?")),
            group=str(data.get("group") or ""),
            time=_time(data.get("time")),
            pid=data.get("pid"),
            host=data.get("host"),
            stats={k: v for k, v in data.items() if k not in FIELDS},
        )


def _time(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def alive(beat: Beat | None, now: int, within_ms: int = ALIVE_MS) -> bool:
    """Whether the process that beat `beat` counts as alive at `now`: the one rule (a
    member's share of the partitions allows it as long as its leases, `within_ms`)."""
    return beat is not None and now - beat.time <= within_ms


#: Once one copy of the beats answered, how long the other may take.
COPY_GRACE_S = 0.1
#: How long a read waits for a copy that has answered every read lately (`Sight.settled`)
#: once only a copy back from an outage answered: alone, that one judges nobody for a
#: while (a kill-host run's engine took a dead member's partitions 1.5 s late, its own
#: host's copy missing the grace at every read while the promoted replica's answered).
SETTLED_WAIT_S = 0.25
#: After the beats could not be read, how long nobody is judged dead: everyone's beats
#: failed alike meanwhile (the master holding them failed over), and each process beats
#: again within `EVERY_S` of them coming back.
SETTLE_MS = 600


class Sight:
    """Whether a reader of the beats may judge who is dead by them now.

    The beats live in one key (on a cluster, two copies). While it cannot be read (its
    master failing over), no process can beat either; when it comes back every beat is as
    old as the outage, the live ones' too. A reader that failed to read the beats, or read
    only a copy nobody wrote to meanwhile (`Answers.fresh`), waits `SETTLE_MS` after reading
    them again before it takes anyone's work: only the dead have not beaten again by then.
    """

    def __init__(self) -> None:
        self.blind = False
        self.settled_at = 0
        #: since when each copy has answered every read (a copy that missed one starts anew)
        self.since: dict[int, int] = {}
        #: why it does not judge who is dead now (None: it does), as last told
        self.why: str | None = None

    def failed(self) -> None:
        """A read of the beats failed (Redis away)."""
        self.blind = True

    def read(
        self, now: int, took_ms: int = 0, fresh: bool = True, answers: Answers | None = None
    ) -> bool:
        """The beats were read at `now`, in `took_ms`: whether they may say who is dead. A
        read that took half of `ALIVE_MS` or longer may have waited out an outage of the
        copy it read: as blind, unless every copy of several answered (each beat is the
        newer of its copies, one of them written to throughout; at a whole quota after a
        kill, reads took 0.4-0.6 s on a starved host, and each such read stopped judging
        for a settle). So is a read that is not `fresh` (`Answers.fresh`). A read that only
        some copies answered (`Answers.alone`) judges only once those copies have answered
        every read for `SETTLE_MS`: a copy back from an outage may be a replica promoted a
        moment ago, holding everyone's beats as old as the failover beside a few fresh ones
        (read alone, it made a kill-host run's dispatcher find its live peers dead, and a
        bot worker claim live workers' turns); by then the live have beaten into it."""
        if answers is not None:
            self.since = {i: self.since.get(i, now) for i in answers.answered}
        if not fresh:
            self.blind = True
            return self._judges(False, "a copy of the beats that nobody wrote to lately")
        every = answers is not None and answers.asked > 1 and answers.alone is None
        if self.blind or (took_ms >= ALIVE_MS // 2 and not every):
            why = "an outage" if self.blind else f"a read that took {took_ms} ms"
            self.blind, self.settled_at = False, now + SETTLE_MS
            self._judges(False, f"the beats read again after {why}: settling {SETTLE_MS} ms")
        alone = None if answers is None else answers.alone
        if alone is not None and not alone <= self.settled(now):
            return self._judges(False, "one copy of the beats answering, not yet for long")
        return self._judges(now >= self.settled_at, self.why)

    def settled(self, now: int) -> frozenset[int]:
        """The copies that have answered every read for `SETTLE_MS` (the next read waits
        for them: `ask_each`'s `prefer`)."""
        return frozenset(i for i, since in self.since.items() if now - since >= SETTLE_MS)

    def _judges(self, judges: bool, why: str | None) -> bool:
        """`judges`; each time its reader stops judging who is dead (`-v`), why, and again
        once it judges again: a dead process's work moves no sooner."""
        if judges and self.why is not None:
            log.info("the beats say who is dead again (after %s)", self.why)
            self.why = None
        elif not judges and why is not None and why != self.why:
            log.info("nobody is judged dead by their beats for now: %s", why)
            self.why = why
        return judges


def beat_value(role: str, group: str, **stats: Any) -> str:
    """A beat as stored: role, group, time, process and host, and `stats`."""
    fields = {
        "role": role,
        "group": group,
        "time": now_ms(),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        **stats,
    }
    return json.dumps(fields)


def beat_keys(redis: Client, keys: Keys) -> list[str]:
    """Where the beats are: one hash; on a cluster two, on two masters (`Keys.processes_copy`),
    each beat written to both, and read from whichever answers (the newer beat counts)."""
    if is_cluster(redis):
        return [keys.processes(), keys.processes_copy()]
    return [keys.processes()]


@dataclass(slots=True)
class Answers:
    """What the copies of the beats answered (`ask_each`)."""

    answers: list[Any]
    #: how many copies were asked
    asked: int
    #: which of them answered (their places among the keys asked)
    answered: tuple[int, ...] = ()

    @property
    def alone(self) -> frozenset[int] | None:
        """The copies that answered when not all did (None when all did)."""
        return None if len(self.answers) >= self.asked else frozenset(self.answered)

    def fresh(self, times: Iterable[int], now: int, within_ms: int = ALIVE_MS) -> bool:
        """Whether beats (their `times`) read from these answers may say who is dead by
        `within_ms` (`alive`): every copy answered, or one that did holds a beat younger
        than half that. Every live process beats each `EVERY_S`; a copy nobody could write
        to (a replica promoted after its master died) holds none, and judged alone it finds
        every process dead. (A member's share is judged by its lease: at a whole quota,
        after a kill, a live copy held no engine's beat younger than half `ALIVE_MS`, the
        beats slowed to 0.4 s each, and the engines took the dead one's partitions late.)"""
        return self.alone is None or now - max(times, default=0) < within_ms // 2


async def ask_each(
    redis: Client,
    keys: Sequence[str],
    command: str,
    *args: Any,
    prefer: Collection[int] = (),
    wait_s: float | None = None,
) -> Answers:
    """`command key *args` on each of `keys` (the copies of the beats) at once; the answers
    of those that answered. Once one answered, the others get `COPY_GRACE_S` more: a copy
    whose master died must not hold a beat (or its reader) for a read timeout. A copy not
    among `prefer` (places among `keys`; empty: any) that answers first waits up to
    `SETTLED_WAIT_S` for one that is. With `wait_s`, what answered by then. Raises only
    when none answered."""
    calls = [asyncio.ensure_future(redis.execute_command(command, k, *args)) for k in keys]
    for call in calls:  # one left behind (this read cancelled, or given up) fails unreported
        call.add_done_callback(seen)
    wanted = frozenset(calls[i] for i in prefer) or frozenset(calls)
    await _answered(calls, wanted, None if wait_s is None else _clock() + wait_s)
    errors = [e for f in calls if f.done() and not f.cancelled() and (e := f.exception())]
    for error in errors:
        if not isinstance(error, TRANSIENT_ERRORS):
            raise error
    good = [i for i, f in enumerate(calls) if _answer(f)]
    if not good:
        raise errors[0] if errors else TimeoutError("no copy of the beats answered")
    return Answers([calls[i].result() for i in good], len(calls), tuple(good))


def _answer(call: asyncio.Future[Any]) -> bool:
    return call.done() and not call.cancelled() and call.exception() is None


def _clock() -> float:
    return asyncio.get_running_loop().time()


async def _answered(
    calls: Sequence[asyncio.Future[Any]],
    wanted: frozenset[asyncio.Future[Any]],
    deadline: float | None = None,
) -> None:
    """Wait until one of `wanted` answered (or another did and none of `wanted` is left),
    then `COPY_GRACE_S` for the rest; once another answered, `SETTLED_WAIT_S` at most for
    one of `wanted`; never past `deadline` (the event loop's clock). Cancels what is left."""
    pending, ends, heard = set(calls), deadline, False
    try:
        while pending and (ends is None or _clock() < ends):
            left = None if ends is None else ends - _clock()
            done, pending = await asyncio.wait(
                pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            answered = {f for f in done if _answer(f)}
            if heard or not answered:
                continue
            heard = bool(answered & wanted) or not pending & wanted
            then = _clock() + (COPY_GRACE_S if heard else SETTLED_WAIT_S)
            ends = then if ends is None else min(ends, then)
    finally:
        for call in pending:  # (also when the caller is cancelled: none is left running)
            call.cancel()
    if pending:
        await asyncio.wait(pending)


async def on_each(redis: Client, keys: Sequence[str], command: str, *args: Any) -> list[Any]:
    """`ask_each`'s answers."""
    return (await ask_each(redis, keys, command, *args)).answers


async def _on_each(redis: Client, keys: Keys, command: str, *args: Any) -> list[Any]:
    return await on_each(redis, beat_keys(redis, keys), command, *args)


async def beat(redis: Client, keys: Keys, name: str, role: str, group: str, **stats: Any) -> None:
    """Write one beat of process `name`."""
    await _on_each(redis, keys, "HSET", name, beat_value(role, group, **stats))


async def beat_many(redis: Client, keys: Keys, beats: Mapping[str, str]) -> None:
    """Write the beats (`beat_value`) of several processes (a gateway's outside bots)."""
    await _on_each(redis, keys, "HSET", *(x for pair in beats.items() for x in pair))


async def forget(redis: Client, keys: Keys, names: Iterable[str]) -> None:
    """Remove the beats of processes that are gone."""
    if gone := list(names):
        await _on_each(redis, keys, "HDEL", *gone)


def newest(answers: Iterable[Any], role: str | None = None) -> dict[str, Beat | None]:
    """HGETALL answers of the beat keys merged: per process, the beat with the latest time
    (None where no copy is readable). Each stored beat is parsed once, and with `role`
    only those `beat_value` wrote for that role: every member of a partitioned kind reads
    every beat every round, and their number grows with the hosts."""
    out: dict[str, Beat | None] = {}
    mark = None if role is None else json.dumps({"role": role})[1:-1]
    for raw in answers:
        for name, value in dict(raw).items():
            if mark is not None and mark not in as_text(value):
                continue
            key, beat = as_text(name), Beat.parse(value)
            if key not in out or _time_of(beat) > _time_of(out[key]):
                out[key] = beat
    return out


def _time_of(beat: Beat | None) -> int:
    return -1 if beat is None else beat.time


@contextlib.asynccontextmanager
async def beating(
    redis: Client, keys: Keys, name: str, send: Callable[[], Awaitable[object]]
) -> AsyncIterator[None]:
    """While inside, `send()` a beat of process `name` every `EVERY_S` (a failure, Redis
    away, is logged at debug level and the next beat tries again); on the way out the
    beating stops and the beat is removed, so nobody waits `ALIVE_MS` to learn it is gone."""
    done = asyncio.Event()

    async def loop() -> None:
        while not done.is_set():
            try:
                await send()
            except Exception as exc:
                log.debug("%s: heartbeat failed: %s", name, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), EVERY_S)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        done.set()
        await asyncio.wait([task], timeout=2.0)
        with contextlib.suppress(Exception):
            await forget(redis, keys, [name])


def beats_of(merged: Mapping[str, Beat | None]) -> dict[str, Beat]:
    """The readable beats of `newest`'s answer, by process name."""
    return {name: b for name, b in merged.items() if b is not None}


async def processes(redis: Client, keys: Keys) -> dict[str, Beat]:
    """Every process's last beat, by process name."""
    return beats_of(newest(await _on_each(redis, keys, "HGETALL")))


async def forget_old(redis: Client, keys: Keys) -> int:
    """Drop the beats older than `FORGET_AFTER_MS` (and unreadable ones); how many went."""
    beats = newest(await _on_each(redis, keys, "HGETALL"))
    now = now_ms()
    old = [k for k, b in beats.items() if b is None or now - b.time > FORGET_AFTER_MS]
    if old:
        await forget(redis, keys, old)
    return len(old)


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One consumer group on one stream, as XINFO GROUPS tells it."""

    stream: str
    group: str
    consumers: int
    #: entries not yet delivered to the group; None where Redis cannot tell
    lag: int | None
    #: entries delivered, not yet acknowledged
    pending: int


def rows_of(streams: Sequence[str], answers: Iterable[Any]) -> list[GroupRow]:
    """The rows of XINFO GROUPS answers, one answer per stream in order; an answer that is
    None or an error (no such stream yet) has none."""
    out = []
    for stream, groups in zip(streams, answers, strict=True):
        if groups is None or isinstance(groups, Exception):
            continue
        for g in groups:
            lag = g.get("lag")
            out.append(
                GroupRow(
                    stream=stream,
                    group=as_text(g["name"]),
                    consumers=int(g["consumers"]),
                    lag=None if lag is None else int(lag),
                    pending=int(g["pending"]),
                )
            )
    return out


async def group_rows(redis: Client, streams: Sequence[str]) -> list[GroupRow]:
    """A row per stream and group of `streams`, read in one pipeline."""
    pipe = redis.pipeline(transaction=False)
    for stream in streams:
        pipe.xinfo_groups(stream)
    return rows_of(streams, await pipe.execute(raise_on_error=False))


def group_totals(rows: Iterable[GroupRow]) -> dict[str, tuple[int, int]]:
    """(lag, pending) per group, summed over its streams (an unknown lag counts as 0)."""
    out: dict[str, tuple[int, int]] = {}
    for row in rows:
        lag, pending = out.get(row.group, (0, 0))
        out[row.group] = (lag + (row.lag or 0), pending + row.pending)
    return out
