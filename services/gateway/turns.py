"""Outside bots' turn streams: one inbox reader per gateway, fanned out to every stream.

A connected bot's stream (`/api/bot/stream` NDJSON, or `/ws/bot`) is sent, on connect,
every turn still waiting for it (found from the game index and the newest inbox entries),
then each turn request written to its inbox `agon:bot:{<bot>}:turns`, then `ended` as each
game it is seated in ends (a game created after the stream opened too, even one in which the
bot never got a turn), and a keep-alive every `keepalive_s`. A turn is self-sufficient
(`schemas.api.TurnMessage`): the gateway adds the legal moves, from a position per game it
keeps (`Positions`: only the moves played since replay), and drops the seat token.

A turn's clock starts when it is written to the stream: every turn goes through
`Deliveries.deliver` first (one call per batch), is sent with the deadline and signed clock
that gives, and is dropped when its clock was claimed before (delivery, not the dispatcher's
deadline, decides). Warm-up: a stream names the game types its bot is ready for
(`?ready=teeko,hexade`, `*` for all); before the first turn of any other type (game and
options) it is sent `prepare`, the turn's clock held (`hold`: only a seat's first turn in a
game; a later one is sent at once after its `prepare`), and the turn follows when the bot
answers `ready` (on the socket, or `POST /api/bot/ready`: every stream of the bot on this
gateway) with its clock started then, or after `PREPARE_CAP_S` without an answer.

No stream reads Redis itself. As lila-ws keeps one Redis subscription per process for
thousands of sockets, a gateway has one `TurnReader` (`services.gateway.live`): it reads
the inboxes of the bots that have a stream here (one blocking XREAD naming all of them
on a single server; on a Redis Cluster, where one command may not name two slots, one
pipelined non-blocking XREAD per inbox, a round trip per node, every `POLL_S`) and hands
each entry to that bot's listeners. It also writes, in one HSET, the heartbeat of every
bot served here, as its workers would, so the dispatcher does not abort its games as
unserved. So the Redis connections a gateway holds do not grow with its streams. A bot
may hold `STREAMS_PER_BOT` streams on a gateway; a stream ends when its client goes (its
transport closes), when its key stops being valid, and at once when the gateway shuts
down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from schemas.api import EndedMessage, ErrorMessage, PrepareMessage, TurnMessage
from schemas.codec import FIELD_BYTES, DecodeError, decode_turn
from schemas.events import NO_RESULT_REASONS
from schemas.turns import TurnRequest
from services.bus.delivery import Delivered, holdable
from services.bus.text import as_text
from services.gamelog.fold import GameFold
from services.gateway import appkeys
from services.gateway.botstreams import GameType, game_type
from services.gateway.http import ApiError
from services.gateway.live import EndedListener

log = logging.getLogger("agon.gateway")

#: Open turn streams (NDJSON or socket) of one bot on one gateway.
STREAMS_PER_BOT = 4
#: A stream whose client takes longer than this to take a message is closed: a bot must not
#: be counted as served (its undelivered turns the platform's fault) while it reads nothing.
EMIT_TIMEOUT_S = 5.0
#: How often a stream looks whether its client is still there.
ALIVE_CHECK_S = 0.5
#: Games of one bot looked at for pending turns when it connects.
PENDING_LIMIT = 1_000
#: The newest inbox entries looked at for pending turns when a bot connects.
RECENT_TURNS = 200
#: How long a turn held for a `prepare` waits for the bot's `ready` before it is sent anyway.
PREPARE_CAP_S = 10.0
#: In `?ready=`: every game type.
READY_FOR_ALL = "*"


# -- one stream ------------------------------------------------------------------------------
@dataclass
class Held:
    """The turns of one game type waiting for the bot to be ready for it."""

    since: float
    turns: list[TurnRequest] = field(default_factory=list)
    answered: bool = False


class Turns:
    """What one connection of `bot` is sent: pending turns, inbox turns, ended games."""

    def __init__(
        self,
        app: web.Application,
        bot: str,
        ready: Iterable[str] = (READY_FOR_ALL,),
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.app = app
        self.bot = bot
        self.sent: set[tuple[str, int]] = set()
        self.games: dict[str, int] = {}  # game id -> the seat it plays there
        self.last = "0-0"
        #: game names (every option set), game types, or `READY_FOR_ALL`
        self.ready: set[str | GameType] = set(ready)
        self.held: dict[GameType, Held] = {}
        self.wake = wake
        self.positions = app[appkeys.BOT_STREAMS].positions

    # -- finding turns -------------------------------------------------------------------
    async def pending(self) -> list[TurnRequest]:
        """Turns waiting now; `last` becomes the newest inbox entry this looked at."""
        query = self.app[appkeys.QUERY]
        recent = await query.recent_turns(self.bot, RECENT_TURNS)
        self.last = as_text(recent[0][0]) if recent else "0-0"
        # The newest turn requests whose game has not moved on since: this finds a turn
        # sent just before the connection, which the index may not show yet.
        turns = self.from_inbox(list(reversed(recent)))
        heads = await query.heads([t.game_id for t in turns]) if turns else []
        out = [t for t, head in zip(turns, heads, strict=True) if head == t.seq]
        self.sent.difference_update((t.game_id, t.seq) for t in turns)
        self.sent.update((t.game_id, t.seq) for t in out)
        for status in ("waiting", "playing"):  # to tell their ends, turn or not
            page = await query.games(status=status, player=self.bot, limit=PENDING_LIMIT)
            for view in page.games:
                for s in view["seats"]:
                    if s["kind"] == "bot" and s["name"] == self.bot:
                        self.games.setdefault(view["game_id"], s["seat"])
                seat = view["seats"][view["to_move"] - 1] if view["to_move"] else None
                if seat is None or seat["kind"] != "bot" or seat["name"] != self.bot:
                    continue
                game = await self.app[appkeys.STATES].current(view["game_id"])
                if game is not None and game.status == "playing":
                    out.extend(self._request_of(game))
        return out

    def _request_of(self, game: GameFold) -> list[TurnRequest]:
        if (game.game_id, game.seq) in self.sent:
            return []
        self.sent.add((game.game_id, game.seq))
        self.games[game.game_id] = game.to_move
        created = game.created
        self.positions.limits.put(game.game_id, created["move_time_ms"])
        deadline = game.deadline
        return [
            TurnRequest(
                game_id=game.game_id,
                game=created["game"],
                options=created["options"],
                moves=list(game.moves),
                seq=game.seq,
                seat=game.to_move,
                colour=game.colour_of(game.to_move),
                bot=self.bot,
                token="",
                since=game.updated,
                allowance=deadline - game.updated if deadline else 0,
            )
        ]

    def from_inbox(self, entries: Any) -> list[TurnRequest]:
        """The turn requests among inbox `entries` not sent yet (now counted as sent). One
        past its dispatcher deadline still goes: delivery says whether its clock is gone."""
        out: list[TurnRequest] = []
        for _, fields in entries:
            try:
                turn = decode_turn(fields[FIELD_BYTES])
            except (DecodeError, KeyError):
                continue
            if (turn.game_id, turn.seq) in self.sent:
                continue
            self.games[turn.game_id] = turn.seat
            self.sent.add((turn.game_id, turn.seq))
            out.append(turn)
        return out

    # -- handing them over ---------------------------------------------------------------
    async def hand_over(self, turns: Sequence[TurnRequest]) -> list[BaseModel]:
        """The messages that hand `turns` to the bot now: each turn whose game type it is
        ready for, with its clock started; for the others, one `prepare` per new type, their
        clocks held until it is ready (`released`)."""
        out: list[BaseModel] = []
        now_ready: list[TurnRequest] = []
        waiting: list[TurnRequest] = []
        for t in turns:
            if self.is_ready(t):
                now_ready.append(t)
            elif holdable(t):
                waiting.append(t)
            else:  # its seat moved before in this game: no hold, it is sent at once
                kind = game_type(t.game, t.options)
                if kind not in self.held:
                    out.append(PrepareMessage(game=t.game, options=t.options))
                    self.ready.add(kind)  # told once
                now_ready.append(t)
        if waiting:
            delivered = await self.app[appkeys.DELIVERIES].deliver(waiting, hold=True)
            for turn, handed in zip(waiting, delivered, strict=True):
                kind = game_type(turn.game, turn.options)
                if kind not in self.held:
                    self.held[kind] = Held(time.monotonic())
                    out.append(PrepareMessage(game=turn.game, options=turn.options))
                if handed is not None:
                    self.held[kind].turns.append(turn)
        return out + await self._sent(now_ready)

    async def released(self) -> list[BaseModel]:
        """The held turns whose type the bot said it is ready for, or that waited
        `PREPARE_CAP_S` (the type then counts as ready), their clocks started now."""
        if not self.held:
            return []
        cap = time.monotonic() - PREPARE_CAP_S
        due = [kind for kind, held in self.held.items() if held.answered or held.since <= cap]
        turns: list[TurnRequest] = []
        for kind in due:
            self.ready.add(kind)
            turns += self.held.pop(kind).turns
        return await self._sent(turns)

    def ready_for(self, game: str, options: dict[str, str]) -> int:
        """The bot is ready for this game type: the held turns this releases (now woken)."""
        kind = game_type(game, options)
        held = self.held.get(kind)
        if held is None:
            return 0  # nothing waits for it (kept nowhere: a client cannot grow the set)
        self.ready.add(kind)
        held.answered = True
        self.wake()
        return len(held.turns)

    def is_ready(self, turn: TurnRequest) -> bool:
        ready = self.ready
        return (
            READY_FOR_ALL in ready
            or turn.game in ready
            or game_type(turn.game, turn.options) in ready
        )

    async def _sent(self, turns: list[TurnRequest]) -> list[BaseModel]:
        if not turns:
            return []
        delivered = await self.app[appkeys.DELIVERIES].deliver(turns)
        out: list[BaseModel] = []
        for turn, handed in zip(turns, delivered, strict=True):
            if handed is None:
                log.info("game %s seq %d: its clock ran out before the turn reached %s",
                         turn.game_id, turn.seq, self.bot)  # fmt: skip
                continue
            out.append(await self._message(turn, handed))
        return out

    async def _message(self, turn: TurnRequest, handed: Delivered) -> TurnMessage:
        limit = await self._move_limit(turn.game_id) if turn.allowance else 0
        return TurnMessage(
            game_id=turn.game_id,
            game=turn.game,
            options=turn.options,
            seat=turn.seat,
            colour=turn.colour,
            ply=len(turn.moves),
            seq=turn.seq,
            moves=turn.moves,
            legal_moves=self.positions.legal_moves(turn),
            allowance=turn.allowance,
            move_time_ms=limit,
            bank_ms=max(0, turn.allowance - limit),
            deadline=handed.deadline,
            clock=handed.clock,
        )

    async def _move_limit(self, game_id: str) -> int:
        """The game's per-move limit in ms, from its created event (read once per game)."""
        limit = self.positions.limits.get(game_id)
        if limit is None:
            game = await self.app[appkeys.STATES].known(game_id)
            limit = game.created["move_time_ms"] if game is not None else 0
            self.positions.limits.put(game_id, limit)
        return limit

    # -- games starting and ending -------------------------------------------------------
    async def ended(self, listener: EndedListener) -> list[BaseModel]:
        """`ended` for each game of the bot that ended (the hub knows the games created that
        seat it, so their ends are told even if the bot never got a turn); after an
        overflow, for each of its games whose view says it ended."""
        out: list[BaseModel] = []
        ends = []
        while not listener.queue.empty():
            ends.append(listener.queue.get_nowait())
        if listener.overflowed:
            listener.overflowed = False
            ids = list(self.games)
            views = await self.app[appkeys.QUERY].views(ids) if ids else []
            ends += [
                (gid, {"result": end["winner"], **end})
                for gid, v in zip(ids, views, strict=True)
                if v is not None and (end := v["result"]) is not None
            ]
        for game_id, ev in ends:
            seat = self.games.pop(game_id, None)
            if seat is None:
                continue
            self.sent = {turn for turn in self.sent if turn[0] != game_id}
            for held in self.held.values():
                held.turns = [t for t in held.turns if t.game_id != game_id]
            self.positions.forget(game_id)
            out.append(ended_message(game_id, seat, ev))
        return out


def _within(
    seconds: float, emit: Callable[[BaseModel | None], Awaitable[None]]
) -> Callable[[BaseModel | None], Awaitable[None]]:
    """`emit`, failing with TimeoutError when a write takes longer than `seconds`."""

    async def bounded(message: BaseModel | None) -> None:
        await asyncio.wait_for(emit(message), seconds)

    return bounded


def ended_message(game_id: str, seat: int, ev: dict[str, Any]) -> EndedMessage:
    """A game's end as the bot in `seat` is told it: the winner and draw as its view says."""
    winner = int(ev["result"])
    reason = str(ev["reason"])
    return EndedMessage(
        game_id=game_id,
        seat=seat,
        winner=winner or None,
        draw=not winner and reason not in NO_RESULT_REASONS,
        reason=reason,
        detail=str(ev.get("detail", "")),
    )


@contextlib.contextmanager
def stream_slot(app: web.Application, bot: str) -> Iterator[None]:
    """One of the bot's `STREAMS_PER_BOT` turn streams on this gateway, or 429."""
    connected = app[appkeys.BOT_CONNECTIONS]
    if connected[bot] >= STREAMS_PER_BOT:
        raise ApiError(
            "too_many_streams",
            f"{bot} has {STREAMS_PER_BOT} turn streams open on this gateway; close one first",
            status=429,
            headers={"Retry-After": "5"},
        )
    connected[bot] += 1
    try:
        yield
    finally:
        connected[bot] -= 1
        if not connected[bot]:
            del connected[bot]


def ready_param(request: web.Request) -> list[str]:
    """The game names (or `*`) of `?ready=teeko,hexade`: the types the stream is ready for."""
    return [name.strip() for name in request.query.get("ready", "").split(",") if name.strip()]


async def serve_turns(
    app: web.Application,
    bot: str,
    emit: Callable[[BaseModel | None], Awaitable[None]],
    *,
    key_hash: str,
    alive: Callable[[], bool],
    ready: Iterable[str] = (READY_FOR_ALL,),
    opened: Callable[[Turns], None] = lambda turns: None,
) -> None:
    """Feed `emit` the bot's messages (None: a keep-alive) until its client goes (`alive()`
    false), the key the stream was opened with (hashing to `key_hash`) is no longer valid
    (told as an `error`; the reader checks every `KEY_CACHE_S`), or the gateway stops.
    `ready`: the game types the bot is ready for (`ready_param`); `opened` is given the
    stream's `Turns` (a socket tells it of its bot's `ready`)."""
    reader, hub, streams = app[appkeys.TURNS], app[appkeys.HUB], app[appkeys.BOT_STREAMS]
    settings = app[appkeys.SETTINGS]
    emit = _within(EMIT_TIMEOUT_S, emit)
    inbox = reader.listen(bot, key_hash)  # before the search: nothing falls in between
    turns = Turns(app, bot, ready, wake=inbox.woken.set)
    ended = EndedListener(bot, turns.games)  # the hub adds the games created from now on
    streams.add(turns)
    opened(turns)
    try:
        await hub.listen_ended(ended)
        async with reader.opening:
            waiting = await turns.pending()
        reader.start(bot, turns.last)
        for message in await turns.hand_over(waiting):
            await emit(message)
        quiet_since = time.monotonic()
        while alive() and not inbox.closed:
            entries, overflowed = await inbox.take(ALIVE_CHECK_S)
            found = turns.from_inbox(entries)
            if overflowed:
                async with reader.opening:
                    found += await turns.pending()
            messages = [*await turns.hand_over(found), *await turns.released()]
            messages += await turns.ended(ended)
            for message in messages:
                await emit(message)
            now = time.monotonic()
            if messages:
                quiet_since = now
            elif now - quiet_since >= settings.keepalive_s:
                await emit(None)
                quiet_since = now
        if inbox.revoked:
            gone = f"the key of {bot} was rotated or revoked; connect with its new key"
            await emit(ErrorMessage(code="bad_key", message=gone))
    except TimeoutError:
        # A client that does not read holds no turn: its stream ends, so its bot is no
        # longer served here and its turns' clocks become its own again.
        log.info("%s: a turn stream that stopped reading was closed", bot)
    finally:
        streams.discard(turns)
        hub.ended.discard(ended)
        reader.unlisten(inbox)
