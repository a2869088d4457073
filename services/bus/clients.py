"""The clients every process uses to talk to the pipeline: commands out, replies and views in.

`CommandClient` sends commands to their game's partition command stream and awaits the
engine's replies on a reply stream of its own (`Keys.reply_stream`, one per client), read
by one background task. A reply that does not come in time is asked for again with the
same `command_id`: the engine answers a repeated id with its first reply and appends
nothing, so a retry is always safe. `send` is fire-and-forget for senders that read the
log rather than replies (bot workers).

`QueryClient` reads what the projector keeps and what the engine logged: a game's view,
the game list with filters and pagination across every partition (its cursor read by
`parse_cursor`, which the archive's list shares), a bot's results, the result records of
a game's rules or of a tournament, the bot-health of a bot and its waiting turns, and a
game's log from a seq: whether games have a log at all (`heads`) and their newest event
(`newest`) are asked here and nowhere else. Nothing else in Agon XADDs a command or spells
a read-model key (the bot registry is `services.bus.registry`, beside these clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import msgpack

from schemas.codec import FIELD, FIELD_BYTES, DecodeError, decode_event, decode_reply, encode
from schemas.commands import Command
from schemas.events import Event
from schemas.replies import Reply
from schemas.views import StoredView
from services.bus import presence
from services.bus.connection import TRANSIENT_ERRORS, WRITES_REFUSED, Client, is_cluster
from services.bus.keys import WORKERS_GROUP, Keys
from services.bus.scripts import confirmed, run_replicated
from services.bus.text import as_text, now_ms

log = logging.getLogger("agon.bus")

#: Reply streams are capped (a client reads its replies at once) and expire when unused.
REPLY_MAXLEN = 10_000
REPLY_TTL_MS = 3_600_000
#: Game statuses of the index.
STATUSES = ("waiting", "playing", "ended")
#: How often a command client ends the waits for replies whose time is up (so a wait ends
#: at most this late).
SWEEP_S = 0.05


#: What a sender hears of a command a closing client did not send.
UNSENT = "the command client closed before sending"
#: How many times a closing client stops what it was sending (a sender may come meanwhile).
CLOSE_PASSES = 3


def _fail(batch: Sequence[tuple[str, bytes, asyncio.Future[None]]], exc: Exception) -> None:
    """Tell the senders of `batch` still waiting (a cancelled one's future is done)."""
    for _, _, sent in batch:
        if not sent.done():
            sent.set_exception(exc)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One stored event: its seq and its bytes (the hash chain is over these bytes)."""

    seq: int
    data: bytes


def log_entries(rows: Any) -> list[LogEntry]:
    """An XRANGE answer of a log as entries."""
    return [
        LogEntry(int(as_text(eid).partition("-")[0]), fields[FIELD_BYTES]) for eid, fields in rows
    ]


class CommandClient:
    """Sends commands and awaits their replies. Use as `async with CommandClient(...)`."""

    def __init__(
        self, redis: Client, keys: Keys, *, name: str = "", timeout_s: float = 10.0
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.reply_to = keys.reply_stream(name or f"client-{uuid.uuid4().hex[:12]}")
        self.timeout_s = timeout_s
        self._waiting: dict[str, asyncio.Future[Reply]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        #: a close under way stops the sends (`_flushed` sends nothing more meanwhile)
        self._stopping = False
        self._last = "0-0"
        #: per node (None: a single server), single commands waiting for the next turn of
        #: the event loop or for the pipeline in flight there to be answered (`_send_one`)
        self._outbox: dict[str | None, list[tuple[str, bytes, asyncio.Future[None]]]] = {}
        #: per node, the pipeline in flight there
        self._flushing: dict[str | None, asyncio.Task[None]] = {}
        #: (deadline in loop time, order, the wake-up of a wait for one reply) (`_settled`)
        self._deadlines: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._sweeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CommandClient:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def start(self) -> None:
        if self._reader is None:
            self._closing = False  # a closed client may be used again
            self._reader = asyncio.create_task(self._read_replies())

    async def close(self) -> None:
        """Stop reading replies and sending: nothing of the client outlives it (a send
        left running would hold its connection open past its event loop's end)."""
        self._closing = self._stopping = True
        reader, self._reader = self._reader, None
        try:
            for _ in range(CLOSE_PASSES):  # again for a sender that came while one stopped
                # The senders waiting for the next pipeline hear that none comes (first: a
                # pipeline that ends would send them); what is on its way stops now, its
                # connection closed with it.
                for batch in self._outbox.values():
                    _fail(batch, ConnectionError(UNSENT))
                self._outbox.clear()
                stopping = [t for t in (reader, *self._flushing.values()) if t is not None]
                if not stopping:
                    break
                reader = None
                for task in stopping:
                    task.cancel()
                await asyncio.wait(stopping, timeout=2.0)
        finally:
            self._stopping = False  # a closed client may send again
        with contextlib.suppress(Exception):
            await self.redis.delete(self.reply_to)
        for future in self._waiting.values():
            future.cancel()
        self._waiting.clear()
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:  # (last: a wait that ended above may have started one)
            sweeper.cancel()
            await asyncio.wait([sweeper], timeout=2.0)

    # -- sending ---------------------------------------------------------------------------
    def _queue(self, pipe: Any, command: Command) -> None:
        pipe.xadd(self.keys.commands_for(command.game_id), {FIELD: encode(command)})

    async def send(
        self, commands: Sequence[Command], *, replicas: int = 0, timeout_ms: int = 1000
    ) -> None:
        """Send without waiting for replies (the sender reads the log instead). With
        `replicas`, return only once that many replicas hold the commands, else raise
        `ReplicasBehind` (what was sent may be lost in a failover: send it again)."""
        if not commands:
            return
        if replicas:
            words = [
                (stream, ("XADD", stream, "*", FIELD, encode(c)))
                for c in commands
                for stream in [self.keys.commands_for(c.game_id)]
            ]
            answers = await run_replicated(self.redis, words, replicas, timeout_ms)
            confirmed(answers, f"commands sent lack {replicas} replicas")
            return
        if len(commands) == 1:  # a person's move
            command = commands[0]
            await self._send_one(self.keys.commands_for(command.game_id), encode(command))
            return
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            self._queue(pipe, command)
        await pipe.execute()

    async def _send_one(self, stream: str, data: bytes) -> None:
        """One XADD, sent in one pipeline with every other one waiting to go: a gateway's
        concurrent requests share one pipeline (a command sent alone costs the client a
        syscall and redis-py's round of a command, several times its share of a pipeline).

        Group commit, per node (on a cluster, the master serving the stream's slot): one
        pipeline is in flight to a node at a time. A command that finds none goes at the
        next turn of the event loop, with whatever joined it in this turn; one that finds
        a pipeline on its way goes with the next, as soon as that one is answered. An idle
        client adds no wait; a busy one sends as many commands per pipeline as arrived
        during one round trip; a master that answers nothing (its host died) holds back
        only its own streams' commands."""
        node = self._node_of(stream)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._outbox.setdefault(node, [])
        waiting.append((stream, data, future))
        if len(waiting) == 1 and node not in self._flushing:
            asyncio.get_running_loop().call_soon(self._flush, node)
        await future

    def _node_of(self, stream: str) -> str | None:
        """The node `stream`'s commands go to (None: a single server, or not known)."""
        if not is_cluster(self.redis):
            return None
        with contextlib.suppress(Exception):  # not known: the pipeline finds out
            node = self.redis.get_node_from_key(stream)
            return node.name if node is not None else None
        return None

    def _flush(self, node: str | None) -> None:
        if not self._outbox.get(node) or node in self._flushing:
            return  # already on its way, or the pipeline in flight takes it when answered
        batch = self._outbox.pop(node)
        task = asyncio.create_task(self._send_batch(batch))
        self._flushing[node] = task
        task.add_done_callback(lambda _: self._flushed(node))

    def _flushed(self, node: str | None) -> None:
        del self._flushing[node]
        if self._stopping:
            _fail(self._outbox.pop(node, []), ConnectionError(UNSENT))
        elif self._outbox.get(node):
            self._flush(node)  # what queued while the pipeline was out goes as the next one

    async def _send_batch(self, batch: list[tuple[str, bytes, asyncio.Future[None]]]) -> None:
        try:
            if len(batch) == 1:
                stream, data, _ = batch[0]
                answers: list[Any] = [await self.redis.xadd(stream, {FIELD: data})]
            else:
                pipe = self.redis.pipeline(transaction=False)
                for stream, data, _ in batch:
                    pipe.xadd(stream, {FIELD: data})
                answers = await pipe.execute(raise_on_error=False)
        except BaseException as exc:  # the senders hear of it, whatever it is
            _fail(batch, exc if isinstance(exc, Exception) else ConnectionError("send cancelled"))
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, future), answer in zip(batch, answers, strict=True):
            if future.done():
                continue  # its sender was cancelled
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            else:
                future.set_result(None)

    async def send_encoded(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Send commands encoded beforehand, each with its command stream
        (`Keys.commands_for`): for load generators, which encode outside the timed part."""
        pipe = self.redis.pipeline(transaction=False)
        for stream, data in items:
            pipe.xadd(stream, {FIELD: data})
        await pipe.execute()

    async def submit(self, command: Command, *, timeout_s: float | None = None) -> Reply:
        """Send one command and return the engine's reply."""
        (reply,) = await self.submit_many([command], timeout_s=timeout_s)
        return reply

    async def submit_many(
        self, commands: Sequence[Command], *, timeout_s: float | None = None, retries: int = 2
    ) -> list[Reply]:
        """Send commands (each with `reply_to` this client's stream) and await every reply.

        A command whose reply is late is sent again with the same id, `retries` times, then
        `TimeoutError` names the ones that got no answer. Redis refusing the writes (out of
        memory) raises at once: backpressure for the caller to pass on, not a reason to wait.
        """
        self.start()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        ids = [c.command_id for c in commands]
        futures = {cid: self._future(cid) for cid in ids}
        # Encoded once (with this client's reply stream), sent again as they are.
        todo = [(cid, self.keys.commands_for(c.game_id), self._encoded(c)) for cid, c in
                zip(ids, commands, strict=True)]  # fmt: skip
        try:
            for attempt in range(retries + 1):
                try:
                    await self._send_encoded(todo)
                except WRITES_REFUSED:
                    raise
                except TRANSIENT_ERRORS:
                    if attempt == retries:
                        raise
                if len(todo) == 1:  # a person's move, a bot's: the gateway's hot path
                    await self._settled(futures[todo[0][0]], timeout)
                else:
                    await asyncio.wait([futures[cid] for cid, _, _ in todo], timeout=timeout)
                todo = [item for item in todo if not futures[item[0]].done()]
                if not todo:
                    break
                log.info("no reply yet for %d commands; sending them again", len(todo))
        finally:
            for cid in ids:
                self._waiting.pop(cid, None)
        if todo:
            named = ", ".join(cid for cid, _, _ in todo[:5])
            raise TimeoutError(f"no reply from the engine for {len(todo)} command(s): {named}")
        return [futures[cid].result() for cid in ids]

    def _encoded(self, command: Command) -> bytes:
        """`encode(command)` with `reply_to` this client's stream (the same bytes as
        encoding an updated copy, without making one)."""
        fields = command.model_dump(mode="python")
        fields["reply_to"] = self.reply_to
        data: bytes = msgpack.packb(fields, use_bin_type=True)
        return data

    async def _send_encoded(self, todo: Sequence[tuple[str, str, bytes]]) -> None:
        """(command id, stream, bytes) sent: one alone through the shared pipeline."""
        if len(todo) == 1:  # a person's move
            _, stream, data = todo[0]
            await self._send_one(stream, data)
        else:
            await self.send_encoded([(stream, data) for _, stream, data in todo])

    async def _settled(self, future: asyncio.Future[Reply], timeout: float) -> None:
        """Wait until `future` is done or `timeout` has passed (leaving it pending).

        What `asyncio.wait` does for one future, without a timer per wait: the client's
        sweeper ends the waits whose time is up, every `SWEEP_S`. The event loop keeps its
        timers in a heap of handles it orders in Python; one per command, set and cancelled,
        was 7% of a busy gateway's CPU."""
        if future.done():
            return
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()

        def replied(_: asyncio.Future[Reply]) -> None:
            if not wake.done():
                wake.set_result(None)

        future.add_done_callback(replied)
        heapq.heappush(self._deadlines, (loop.time() + timeout, next(self._order), wake))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())
        try:
            await wake
        finally:
            future.remove_done_callback(replied)

    async def _sweep(self) -> None:
        """End the waits whose time is up (and forget the answered ones), until none is left."""
        loop = asyncio.get_running_loop()
        deadlines = self._deadlines
        while deadlines:
            await asyncio.sleep(SWEEP_S)
            now = loop.time()
            while deadlines and (deadlines[0][0] <= now or deadlines[0][2].done()):
                wake = heapq.heappop(deadlines)[2]
                if not wake.done():
                    wake.set_result(None)

    def _future(self, command_id: str) -> asyncio.Future[Reply]:
        future = self._waiting.get(command_id)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._waiting[command_id] = future
        return future

    async def _read_replies(self) -> None:
        """Resolve the waiting futures from the reply stream, for as long as the client runs."""
        while not self._closing:
            try:
                raw: Any = await self.redis.xread(
                    {self.reply_to: self._last}, count=500, block=1000
                )
            except TRANSIENT_ERRORS as exc:
                # redis-py may turn a cancellation into a connection error: stop if closing.
                if self._closing:
                    return
                log.warning("reading replies failed (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            items = raw.items() if isinstance(raw, dict) else (raw or ())
            for _, entries in items:
                if entries and isinstance(entries[0], list) and len(entries) == 1:
                    entries = entries[0]
                for entry_id, fields in entries:
                    self._last = as_text(entry_id)
                    self._resolve(fields.get(FIELD_BYTES))

    def _resolve(self, data: bytes | None) -> None:
        if data is None:
            return
        try:
            reply = decode_reply(data)
        except DecodeError as exc:
            log.warning("an unreadable reply on %s: %s", self.reply_to, exc)
            return
        future = self._waiting.get(reply.command_id)
        if future is not None and not future.done():
            future.set_result(reply)


@dataclass
class GamePage:
    """One page of the game list: views, newest first, and the cursor of the next page."""

    games: list[StoredView] = field(default_factory=list)
    cursor: str | None = None


@dataclass(frozen=True)
class Gauges:
    """What a metrics scrape reads (`QueryClient.gauges`)."""

    #: each group's (lag, pending) summed over its streams
    groups: dict[str, tuple[int, int]]
    live_games: int
    beats: dict[str, presence.Beat]


@dataclass
class BotHealth:
    """Whether anybody serves a bot: its workers' last heartbeat and its waiting turns."""

    bot: str
    workers: int
    last_seen_ms: int | None
    pending_turns: int
    undelivered_turns: int


class QueryClient:
    """Reads views, the game index, results, bot health and logs."""

    def __init__(self, redis: Client, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def view(self, game_id: str) -> StoredView | None:
        raw: Any = await self.redis.get(self.keys.view(game_id))
        view: StoredView | None = None if raw is None else json.loads(raw)
        return view

    async def views(self, game_ids: Sequence[str]) -> list[StoredView | None]:
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.get(self.keys.view(gid))
        return [None if raw is None else json.loads(raw) for raw in await pipe.execute()]

    async def log(
        self, game_id: str, from_seq: int = 1, to_seq: int | None = None
    ) -> list[LogEntry]:
        """The stored events of a game from `from_seq` on (to `to_seq`, when given), as bytes
        with their seqs."""
        end = "+" if to_seq is None else str(to_seq)
        rows: Any = await self.redis.xrange(self.keys.log(game_id), f"{max(from_seq, 1)}-0", end)
        return log_entries(rows)

    async def events(self, game_id: str, from_seq: int = 1) -> list[Event]:
        return [decode_event(e.data) for e in await self.log(game_id, from_seq)]

    async def head(self, game_id: str) -> int:
        n: int = await self.redis.xlen(self.keys.log(game_id))
        return n

    async def heads(self, game_ids: Sequence[str]) -> list[int]:
        """The seq of each game's last event, in one round trip (0: no such game)."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.xlen(self.keys.log(gid))
        return [int(n) for n in await pipe.execute()]

    async def newest(self, game_ids: Sequence[str]) -> list[LogEntry | None]:
        """Each game's last stored event, in one round trip (None: the game has no log)."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.xrevrange(self.keys.log(gid), "+", "-", count=1)
        return [log_entries(rows)[0] if rows else None for rows in await pipe.execute()]

    async def recent_turns(self, bot: str, count: int) -> list[Any]:
        """The newest `count` entries of `bot`'s turn inbox, newest first (entry id, fields)."""
        rows: Any = await self.redis.xrevrange(self.keys.bot_turns(bot), count=count)
        return list(rows)

    async def game_ids(self) -> list[str]:
        """Every registered game id, partition by partition, in creation order."""
        pipe = self.redis.pipeline(transaction=False)
        for p in self.keys.all_partitions():
            pipe.zrange(self.keys.games(p), 0, -1)
        return [as_text(g) for ids in await pipe.execute() for g in ids]

    async def ended(self, game_ids: Sequence[str]) -> list[bool]:
        """Whether the index lists each game as ended."""
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.zscore(self.keys.index_status(self.keys.partition(gid), "ended"), gid)
        return [score is not None for score in await pipe.execute()]

    async def games(
        self,
        *,
        status: str | None = None,
        game: str | None = None,
        player: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> GamePage:
        """Games newest first across every partition, filtered; `cursor` continues a page."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
        before = parse_cursor(cursor)
        found, floor = await self._walk(
            [self._index_keys(p, status, game, player) for p in self.keys.all_partitions()],
            before,
            limit,
        )
        # A partition walked only down to `floor` may hold more games below it: the page
        # stops there (maybe short, or empty with a cursor) rather than skip them.
        listed = [k for k in found if floor is None or k >= floor]
        listed.sort(reverse=True)
        chosen = listed[:limit]
        views = await self.views([gid for _, gid in chosen])
        page = GamePage(games=[v for v in views if v is not None])
        last = chosen[-1] if chosen else floor
        if last is not None and (len(listed) > limit or floor is not None):
            page.cursor = f"{int(last[0])}:{last[1]}"
        return page

    async def _walk(
        self, names: list[list[str]], before: tuple[float, str] | None, limit: int
    ) -> tuple[list[tuple[float, str]], tuple[float, str] | None]:
        """Each partition's games below `before`, newest first, in every index of its
        `names`: a page's worth, read in O(page) whatever the indexes hold. The last index
        (the most selective filter named) is walked in chunks, the others only asked
        about the chunk's games (ZMSCORE), for at most `WALK_ROUNDS` chunks, each 4 times
        the last: a page and one the first (all a partition needs when every game
        matches), more while a sparse filter needs them. Returns what matched and the
        lowest game a partition cut short was walked to (None: none was)."""
        top = "+inf" if before is None else before[0]
        found: list[tuple[float, str]] = []
        floor: tuple[float, str] | None = None
        walking = {p: 0 for p in range(len(names))}  # partition -> how many it has walked
        matched = dict.fromkeys(walking, 0)
        for round_ in range(WALK_ROUNDS):
            chunk = (limit + 1) * 4**round_
            pipe = self.redis.pipeline(transaction=False)
            for p, offset in walking.items():
                pipe.zrange(
                    names[p][-1], top, "-inf", desc=True, byscore=True, offset=offset,
                    num=chunk, withscores=True,
                )  # fmt: skip
            chunks = dict(zip(walking, await pipe.execute(), strict=True))
            candidates = {
                p: [
                    key
                    for key in ((float(s), as_text(m)) for m, s in rows)
                    if before is None or key < before
                ]
                for p, rows in chunks.items()
            }
            pipe = self.redis.pipeline(transaction=False)
            asked = [(p, name) for p in chunks for name in names[p][:-1] if candidates[p]]
            for p, name in asked:
                pipe.zmscore(name, [gid for _, gid in candidates[p]])
            answers: dict[int, list[list[Any]]] = {}
            for (p, _), scores in zip(asked, await pipe.execute(), strict=True):
                answers.setdefault(p, []).append(scores)
            for p, rows in chunks.items():
                keep = [
                    key
                    for i, key in enumerate(candidates[p])
                    if all(scores[i] is not None for scores in answers.get(p, []))
                ]
                found += keep
                matched[p] += len(keep)
                walking[p] += len(rows)
                if len(rows) < chunk or matched[p] > limit:
                    del walking[p]  # walked to its end, or walked enough for a page
                elif round_ == WALK_ROUNDS - 1 and candidates[p]:
                    low = candidates[p][-1]
                    floor = low if floor is None else max(floor, low)
            if not walking:
                break
        return found, floor

    def _index_keys(
        self, p: int, status: str | None, game: str | None, player: str | None
    ) -> list[str]:
        names = []
        if status:
            names.append(self.keys.index_status(p, status))
        if game:
            names.append(self.keys.index_game(p, game))
        if player:
            names.append(self.keys.index_player(p, player))
        return names or [self.keys.index_time(p)]

    async def bot_results(self, bot: str) -> dict[str, int]:
        """A bot's finished games by outcome: games, wins, losses, draws, aborted."""
        pipe = self.redis.pipeline(transaction=False)
        for p in self.keys.all_partitions():
            pipe.hvals(self.keys.bot_results(p, bot))
        totals = {"games": 0, "wins": 0, "losses": 0, "draws": 0, "aborted": 0}
        for values in await pipe.execute():
            for value in values:
                totals["games"] += 1
                totals[as_text(value)] = totals.get(as_text(value), 0) + 1
        return totals

    async def results(self, game: str) -> list[bytes]:
        """Every result record (JSON) of the rules `game`: its finished games between two
        named players, from every partition, in no order."""
        return await self._values([self.keys.results(p, game) for p in self.keys.all_partitions()])

    async def tournament_results(self, tournament_id: str) -> list[bytes]:
        """Every result record (JSON) of a game naming the tournament, in no order (which
        of them it scheduled is the tournament's log to say)."""
        names = [self.keys.tournament_results(p, tournament_id) for p in self.keys.all_partitions()]
        return await self._values(names)

    async def results_version(self, game: str) -> tuple[int, ...]:
        """The version of the rules `game`'s results: how many records each partition holds
        (one HLEN each, whatever their number). A record is written once, when its game ends,
        and kept (`agon archive` keeps it too); only a rebuild that drops imported games'
        records takes any away, so the counts change whenever the records do."""
        pipe = self.redis.pipeline(transaction=False)
        for p in self.keys.all_partitions():
            pipe.hlen(self.keys.results(p, game))
        return tuple(int(n) for n in await pipe.execute())

    async def _values(self, hashes: Sequence[str]) -> list[bytes]:
        pipe = self.redis.pipeline(transaction=False)
        for name in hashes:
            pipe.hvals(name)
        return [v for values in await pipe.execute() for v in values]

    async def processes(self) -> dict[str, presence.Beat]:
        """Every process's last beat, by process name."""
        return await presence.processes(self.redis, self.keys)

    async def ping(self) -> None:
        """Raise if Redis does not answer (a gateway's health)."""
        await self.redis.ping()

    async def gauges(self) -> Gauges:
        """What a metrics scrape shows, in one pipeline: each group's lag and pending
        entries over the command streams and feeds, the games being played, every beat."""
        k = self.keys
        streams = [k.commands(p) for p in k.all_partitions()]
        streams += [k.feed(p) for p in k.all_partitions()]
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            pipe.xinfo_groups(stream)
        for p in k.all_partitions():
            pipe.zcard(k.index_status(p, "playing"))
        copies = presence.beat_keys(self.redis, k)
        for key in copies:
            pipe.hgetall(key)
        answers: list[Any] = await pipe.execute(raise_on_error=False)
        beats = presence.newest(a for a in answers[-len(copies) :] if not isinstance(a, Exception))
        del answers[-len(copies) :]
        return Gauges(
            groups=presence.group_totals(presence.rows_of(streams, answers[: len(streams)])),
            live_games=sum(int(n) for n in answers[len(streams) :] if isinstance(n, int)),
            beats=presence.beats_of(beats),
        )

    async def inboxes(
        self, positions: dict[str, str], count: int, block_ms: int, poll_s: float
    ) -> list[tuple[str, list[Any]]]:
        """New turns in the bots' inboxes after each bot's last seen entry id (`positions`),
        as (bot, entries); a single server waits up to `block_ms` for one, a cluster (one
        read per slot) polls and sleeps `poll_s` when there is none."""
        streams: dict[Any, Any] = {self.keys.bot_turns(b): at for b, at in positions.items()}
        bots = dict(zip(streams, positions, strict=True))
        replies: Any
        if is_cluster(self.redis):
            pipe = self.redis.pipeline(transaction=False)
            for inbox, at in streams.items():
                pipe.xread({inbox: at}, count=count)
            replies = [r for reply in await pipe.execute() for r in reply or ()]
            if not replies:
                await asyncio.sleep(poll_s)
        else:
            replies = await self.redis.xread(streams, count=count, block=block_ms) or []
        return [(bots[as_text(stream)], entries) for stream, entries in replies]

    async def bot_health(self, bot: str) -> BotHealth:
        """Who serves `bot`: live workers, their last beat, turns waiting in its inbox."""
        role = f"bot-{bot}"
        beats = await self.processes()
        workers = [b for b in beats.values() if b.group == WORKERS_GROUP and b.role == role]
        now = now_ms()
        inbox = self.keys.bot_turns(bot)
        pending = undelivered = 0
        with contextlib.suppress(Exception):
            rows = await presence.group_rows(self.redis, [inbox])
            undelivered, pending = presence.group_totals(rows).get(WORKERS_GROUP, (0, 0))
        if not workers:
            with contextlib.suppress(Exception):
                undelivered = max(undelivered, int(await self.redis.xlen(inbox)))
        return BotHealth(
            bot=bot,
            workers=sum(presence.alive(b, now) for b in workers),
            last_seen_ms=max((b.time for b in workers), default=None),
            pending_turns=pending,
            undelivered_turns=undelivered,
        )


#: Chunks of one index a page walks in a partition at most (`QueryClient._walk`).
WALK_ROUNDS = 4


def parse_cursor(cursor: str | None) -> tuple[int, str] | None:
    """A page's cursor, `<created ms>:<game id>` (the live list's and the archive's), as
    (created, game id); None for the first page, ValueError for anything else."""
    if not cursor:
        return None
    created, sep, game_id = cursor.partition(":")
    if not sep or not created.isdecimal():
        raise ValueError(f"bad cursor {cursor!r}: pass the cursor of the previous page")
    return int(created), game_id
