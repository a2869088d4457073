"""Outside bots, as Lichess's bot API has them: register, stream turns, answer them.

`POST /api/bots` registers a name and returns its key once; only the key's sha256 is
kept (`Keys.bot_key_hashes`), so the gateway knows who knocks and nobody can read a key
back. A registered bot is seated like a built-in one: the dispatcher writes its turns
to its inbox. A connected bot's stream (`/api/bot/stream` NDJSON, or `/ws/bot`) sends:

- on connect, every turn still waiting for it, found from the game index (games it
  plays that are going on with its seat to move), so nothing depends on what an earlier
  connection was sent;
- then each turn request from its inbox, read from where it stood before that search
  (a turn in both is sent once), without the seat token: the gateway answers for the
  bot it authenticated;
- `ended` with the result of each of its games as it ends, and a keep-alive every 5 s.

While a bot is connected the gateway writes a heartbeat for it as its workers would, so
the dispatcher does not abort its games as unserved. A move (`POST
/api/bot/games/{id}/moves` or a `move` on the socket) gets the command id
"<bot>:<game>:<seq>" that built-in workers use: answering one turn twice changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from bots.base import bot_names
from schemas.api import (
    BotKeyBody,
    BotMoveBody,
    BotMoveMessage,
    EndedMessage,
    NewBot,
    PingMessage,
    TurnMessage,
    decode_bot_message,
)
from schemas.codec import FIELD_BYTES, DecodeError, decode_turn
from schemas.commands import PlayMove
from schemas.replies import Reply
from schemas.tokens import bot_token, token_hash
from services.bus.connection import TRANSIENT_ERRORS
from services.bus.consumer import as_text, now_ms, write_heartbeat
from services.bus.keys import WORKERS_GROUP
from services.gateway import appkeys
from services.gateway.http import (
    ApiError,
    Write,
    ndjson,
    read_body,
    refused,
    respond,
    submit,
)
from services.gateway.live import EndedListener
from services.gateway.sockets import send, socket_loop
from services.projector.fold import GameFold

log = logging.getLogger("agon.gateway")

HEARTBEAT_S = 0.5
#: An inbox read blocks this long at most (well below any client's socket timeout).
BLOCK_MS = 1000
RETRY_PAUSE_S = 0.5
#: Games of one bot looked at for pending turns when it connects.
PENDING_LIMIT = 1_000
#: Open turn streams (NDJSON or socket) of one bot on one gateway: each holds a Redis
#: connection in a blocking read.
STREAMS_PER_BOT = 4
#: The newest inbox entries looked at for pending turns when a bot connects.
RECENT_TURNS = 200
#: How long a gateway trusts a bot key it has looked up (keys are never revoked yet).
KEY_CACHE_S = 30.0
#: What a turn request tells an outside bot: everything but its seat token.
TURN_FIELDS = {"game_id", "game", "options", "moves", "seq", "seat", "deadline", "clock"}


async def register(request: web.Request) -> web.Response:
    app = request.app
    body = await read_body(request, NewBot)
    base = body.name.partition(".")[0]
    if base in bot_names():  # "<bot>.<label>" names another of the built-in bot
        raise ApiError("name_taken", f"{body.name} names the built-in bot {base}; pick another")
    keys, redis = app[appkeys.SETTINGS].keys, app[appkeys.REDIS]
    record = json.dumps({"registered": now_ms()})
    if not await redis.hsetnx(keys.registered_bots(), body.name, record):
        raise ApiError("name_taken", f"a bot called {body.name} is registered already")
    key = f"agon_{secrets.token_urlsafe(32)}"
    await redis.hset(keys.bot_key_hashes(), token_hash(key), body.name)
    return respond(request, BotKeyBody(name=body.name, key=key).model_dump(), 201)


async def authenticate(request: web.Request) -> str:
    """The name of the bot whose key the request bears; 401 otherwise. A key found in
    Redis is remembered for `KEY_CACHE_S` (a bot authenticates every move it sends)."""
    auth = request.headers.get("Authorization", "")
    if not auth.startswith("Bearer ") or not auth[7:].strip():
        raise ApiError("bad_key", "send the bot's key as 'Authorization: Bearer KEY'")
    app = request.app
    hashed = token_hash(auth[7:].strip())
    known = app[appkeys.BOT_KEYS].get(hashed)
    if known is not None and known[1] > time.monotonic():
        return known[0]
    name = await app[appkeys.REDIS].hget(app[appkeys.SETTINGS].keys.bot_key_hashes(), hashed)
    if name is None:
        raise ApiError("bad_key", "no bot has this key; register one with POST /api/bots")
    app[appkeys.BOT_KEYS].put(hashed, (as_text(name), time.monotonic() + KEY_CACHE_S))
    return as_text(name)


# -- answering a turn --------------------------------------------------------------------
async def bot_move(request: web.Request) -> web.Response:
    bot = await authenticate(request)
    body = await read_body(request, BotMoveBody)
    reply = await answer(
        request.app, bot, request.match_info["id"], body.move, body.seq, body.clock
    )
    if (error := refused(reply)) is not None:
        raise error
    return respond(request, {"seq": reply.seq})


async def answer(
    app: web.Application, bot: str, game_id: str, move: str, seq: int, clock: str = ""
) -> Reply:
    states = app[appkeys.STATES]
    game = await states.known(game_id)  # for its seats: the engine checks the rest
    if game is None:
        raise ApiError("unknown_game", f"no game {game_id}")
    if all(s["kind"] == "bot" and s["name"] == bot for s in game.seats):
        game = await states.current(game_id) or game  # both seats: which is to move now?
    seat = bot_seat(game, bot)
    command = PlayMove(
        command_id=f"{bot}:{game_id}:{seq}",
        game_id=game_id,
        seat=seat,
        token=bot_token(app[appkeys.SECRET], game_id, seat),
        move=move,
        expected_seq=seq,
        clock=clock,
    )
    return await submit(app, command)


def bot_seat(game: GameFold, bot: str) -> int:
    """The seat `bot` plays in `game` (the one to move if it plays both)."""
    mine = [s["seat"] for s in game.seats if s["kind"] == "bot" and s["name"] == bot]
    if not mine:
        raise ApiError("not_your_game", f"{bot} has no seat in game {game.game_id}")
    return game.to_move if game.to_move in mine else int(mine[0])


# -- the turn stream -----------------------------------------------------------------------
class Turns:
    """What one connection of `bot` is sent: pending turns, inbox turns, ended games."""

    def __init__(self, app: web.Application, bot: str) -> None:
        self.app = app
        self.bot = bot
        self.sent: set[tuple[str, int]] = set()
        self.games: dict[str, int] = {}  # game id -> the seat it plays there
        self.inbox = app[appkeys.SETTINGS].keys.bot_turns(bot)
        self.last = "0-0"

    async def pending(self) -> list[TurnMessage]:
        """Turns waiting now; reading the inbox goes on from where it stood before this."""
        redis = self.app[appkeys.REDIS]
        recent: Any = await redis.xrevrange(self.inbox, count=RECENT_TURNS)
        self.last = as_text(recent[0][0]) if recent else "0-0"
        # The newest turn requests whose game has not moved on since: this finds a turn
        # sent just before the connection, which the index may not show yet.
        turns = self._turns(list(reversed(recent)))
        query = self.app[appkeys.QUERY]
        heads = await query.heads([t.game_id for t in turns]) if turns else []
        out = [t for t, head in zip(turns, heads, strict=True) if head == t.seq]
        self.sent.update((t.game_id, t.seq) for t in out)
        page = await query.games(status="playing", player=self.bot, limit=PENDING_LIMIT)
        for view in page.games:
            for s in view["seats"]:
                if s["kind"] == "bot" and s["name"] == self.bot:
                    self.games.setdefault(view["game_id"], s["seat"])  # to tell its end
            seat = view["seats"][view["to_move"] - 1] if view["to_move"] else None
            if seat is None or seat["kind"] != "bot" or seat["name"] != self.bot:
                continue
            game = await self.app[appkeys.STATES].current(view["game_id"])
            if game is not None and game.status == "playing":
                out.extend(self._turn_of(game))
        return out

    def _turn_of(self, game: GameFold) -> list[TurnMessage]:
        if (game.game_id, game.seq) in self.sent:
            return []
        self.sent.add((game.game_id, game.seq))
        self.games[game.game_id] = game.to_move
        created = game.created
        return [
            TurnMessage(
                game_id=game.game_id,
                game=created["game"],
                options=created["options"],
                moves=list(game.moves),
                seq=game.seq,
                seat=game.to_move,
                deadline=game.deadline,
            )
        ]

    async def next(self, block_ms: int) -> list[TurnMessage]:
        """Turns from the inbox after the last one read (waiting up to `block_ms`)."""
        redis = self.app[appkeys.REDIS]
        reply: Any = await redis.xread({self.inbox: self.last}, count=100, block=block_ms)
        out: list[TurnMessage] = []
        for _, entries in reply or ():
            if entries:
                self.last = as_text(entries[-1][0])
            out += self._turns(entries)
        self.sent.update((t.game_id, t.seq) for t in out)
        return out

    def _turns(self, entries: Any) -> list[TurnMessage]:
        """The turn requests among inbox `entries` not sent yet nor past their deadline."""
        out: list[TurnMessage] = []
        now = now_ms()
        for _, fields in entries:
            try:
                turn = decode_turn(fields[FIELD_BYTES])
            except (DecodeError, KeyError):
                continue
            if (turn.game_id, turn.seq) in self.sent or (turn.deadline and turn.deadline < now):
                continue
            self.games[turn.game_id] = turn.seat
            out.append(TurnMessage(**turn.model_dump(include=TURN_FIELDS)))
        return out

    def ended(self, listener: EndedListener) -> list[BaseModel]:
        out: list[BaseModel] = []
        while not listener.queue.empty():
            game_id, ev = listener.queue.get_nowait()
            seat = self.games.pop(game_id, None)
            self.sent = {turn for turn in self.sent if turn[0] != game_id} if seat else self.sent
            if seat is not None:
                out.append(
                    EndedMessage(
                        game_id=game_id,
                        seat=seat,
                        winner=int(str(ev["result"])),
                        reason=str(ev["reason"]),
                        detail=str(ev.get("detail", "")),
                    )
                )
        return out


@contextlib.contextmanager
def stream_slot(app: web.Application, bot: str) -> Iterator[None]:
    """One of the bot's `STREAMS_PER_BOT` turn streams on this gateway, or 429."""
    connected = app[appkeys.BOT_CONNECTIONS]
    if connected[bot] >= STREAMS_PER_BOT:
        raise ApiError(
            "rate_limited", f"{bot} has {STREAMS_PER_BOT} streams open here already; close one"
        )
    connected[bot] += 1
    try:
        yield
    finally:
        connected[bot] -= 1
        if not connected[bot]:
            del connected[bot]


async def serve_turns(
    app: web.Application, bot: str, emit: Callable[[BaseModel | None], Awaitable[None]]
) -> None:
    """Feed `emit` the bot's messages (None: a keep-alive) until the connection goes."""
    hub = app[appkeys.HUB]
    listener = EndedListener()
    hub.ended.add(listener)
    beating = asyncio.create_task(_heartbeat(app, bot))
    turns = Turns(app, bot)
    keepalive_s = app[appkeys.SETTINGS].keepalive_s
    try:
        for turn in await turns.pending():
            await emit(turn)
        quiet_since = time.monotonic()
        while True:
            try:
                messages: list[BaseModel] = [*await turns.next(BLOCK_MS)]
            except TRANSIENT_ERRORS as exc:
                log.warning("bot stream of %s: Redis unavailable (%s); retrying", bot, exc)
                await asyncio.sleep(RETRY_PAUSE_S)
                messages = []
            messages += turns.ended(listener)
            for message in messages:
                await emit(message)
            if messages:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= keepalive_s:
                await emit(None)
                quiet_since = time.monotonic()
    finally:
        hub.ended.discard(listener)
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await beating
        keys = app[appkeys.SETTINGS].keys
        with contextlib.suppress(Exception):
            await app[appkeys.REDIS].hdel(keys.processes(), _consumer(app, bot))


def _consumer(app: web.Application, bot: str) -> str:
    return f"{app[appkeys.NAME]}-bot-{bot}"


async def _heartbeat(app: web.Application, bot: str) -> None:
    """Beat as the bot's workers do, so the dispatcher sees it served."""
    keys, redis = app[appkeys.SETTINGS].keys, app[appkeys.REDIS]
    name = _consumer(app, bot)
    while True:
        with contextlib.suppress(Exception):
            await write_heartbeat(
                redis, keys.processes(), name, f"bot-{bot}", WORKERS_GROUP, via="gateway"
            )
        await asyncio.sleep(HEARTBEAT_S)


async def bot_stream(request: web.Request) -> web.StreamResponse:
    bot = await authenticate(request)

    async def produce(write: Write) -> None:
        async def emit(message: BaseModel | None) -> None:
            await write(b"\n" if message is None else message.model_dump_json().encode() + b"\n")

        await serve_turns(request.app, bot, emit)

    with stream_slot(request.app, bot):
        return await ndjson(request, "bot", produce)


async def bot_socket(request: web.Request) -> web.WebSocketResponse:
    bot = await authenticate(request)

    async def feed(ws: web.WebSocketResponse) -> None:
        async def emit(message: BaseModel | None) -> None:
            await send(ws, PingMessage() if message is None else message)

        await serve_turns(request.app, bot, emit)

    async def answer_move(message: BotMoveMessage) -> Reply:
        return await answer(
            request.app, bot, message.game_id, message.move, message.seq, message.clock
        )

    with stream_slot(request.app, bot):
        return await socket_loop(request, "bot", decode_bot_message, feed, answer_move)
