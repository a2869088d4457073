"""Outside bots, as Lichess's bot API has them: register, stream turns, answer them.

`POST /api/bots` registers a name and returns its key once; only the key's sha256 is
kept (`services.bus.registry`), so the gateway knows who knocks and nobody can read a key
back. Registration spends the client address's `register` quota, shared by every gateway;
names are unique whatever their case, and the platform's own (built-in bots, system actors)
are reserved. A bot rotates its key with `POST /api/bots/{name}/key` (the old one stops
working at once on this gateway, within `KEY_CACHE_S` on every other, and ends the streams
it opened), the operator revokes one with `agon bots revoke NAME`, and `PATCH
/api/bots/{name}` sets whether the bot accepts challenges: a game may seat an outside bot
only if its creator bears that bot's key or the bot accepts challenges
(`services.gateway.games.check_bot`).

A registered bot is seated like a built-in one: the dispatcher writes its turns to its
inbox, and the gateway's one reader of inboxes sends them on the bot's streams
(`/api/bot/stream` NDJSON, or `/ws/bot`; `services.gateway.turns`), with a `prepare`
before the first turn of a game type the stream did not say it is ready for (`?ready=`),
answered by `ready` (on the socket, or `POST /api/bot/ready`). A move (`POST
/api/bot/games/{id}/moves` or a `move` on the socket) gets the command id
"<bot>:<game>:<seq>" that built-in workers use: answering one turn twice changes nothing. A
bot resigns with `POST /api/bot/games/{id}/resign` or a `resign` on the socket (command id
"<bot>:<game>:resign"): the gateway signs the engine's `Resign` with the seat's token, which
it derives from the secret as the dispatcher does. No game of the arena (RULES.md) ends in a
draw by agreement, so there are no draw offers.
"""

from __future__ import annotations

import time

from aiohttp import web
from pydantic import BaseModel

from bots.base import bot_names
from schemas.api import (
    BotKeyBody,
    BotMoveBody,
    BotMoveMessage,
    BotResignMessage,
    BotSettingsBody,
    HeldBody,
    NewBot,
    PingMessage,
    ReadyBody,
    ReadyMessage,
    decode_bot_message,
)
from schemas.commands import PlayMove, Resign
from schemas.replies import Reply
from schemas.tokens import bot_token, token_hash
from services.bus.registry import Refused, reserved
from services.gamelog.fold import GameFold
from services.gateway import appkeys
from services.gateway.games import within_quota
from services.gateway.http import (
    ApiError,
    Write,
    bearer,
    client_keys,
    ndjson,
    operator,
    read_body,
    refused,
    respond,
    submit,
)
from services.gateway.live import KEY_CACHE_S
from services.gateway.sockets import send, socket_loop
from services.gateway.turns import Turns, ready_param, serve_turns, stream_slot

#: The status of each refusal of the registry.
REGISTRY_STATUS = {"name_taken": 409, "name_reserved": 409}


async def register(request: web.Request) -> web.Response:
    body = await read_body(request, NewBot)
    if reserved(body.name, bot_names()):  # refused before it spends any quota
        raise ApiError("name_reserved", f"{body.name} is the platform's; pick another", status=409)
    # Registrants are anonymous: the quota is their address's (the first of `client_keys`).
    await within_quota(request, "register", client_keys(request)[0])
    try:
        key = await request.app[appkeys.BOT_REGISTRY].register(
            body.name, bot_names(), accept_challenges=body.accept_challenges
        )
    except Refused as exc:
        raise ApiError(exc.code, exc.message, status=REGISTRY_STATUS[exc.code]) from None
    return respond(request, BotKeyBody(name=body.name, key=key).model_dump(), 201)


def _bearer_hash(request: web.Request) -> str:
    if not (key := bearer(request)):
        raise ApiError("bad_key", "send the bot's key as 'Authorization: Bearer KEY'")
    return token_hash(key)


async def authenticate(request: web.Request) -> str:
    """The name of the bot whose key the request bears; 401 otherwise. A key found in
    Redis is remembered for `KEY_CACHE_S` (a bot authenticates every move it sends)."""
    name = await bot_of_key(request.app, _bearer_hash(request))
    if name is None:
        raise ApiError(
            "bad_key", "no bot has this key (revoked or rotated?); register one with POST /api/bots"
        )
    return name


async def bot_of_key(app: web.Application, key_hash: str) -> str | None:
    """The bot a key hash belongs to, from this gateway's cache while it is fresh."""
    known = app[appkeys.BOT_KEYS].get(key_hash)
    if known is not None and known[1] > time.monotonic():
        return known[0]
    name = await app[appkeys.BOT_REGISTRY].bot_of(key_hash)
    if name is None:
        app[appkeys.BOT_KEYS].pop(key_hash)
        return None
    app[appkeys.BOT_KEYS].put(key_hash, (name, time.monotonic() + KEY_CACHE_S))
    return name


async def _owner(request: web.Request) -> tuple[str, str]:
    """The bot named in the path, when the request bears its key; with that key's hash."""
    key_hash = _bearer_hash(request)
    bot = await bot_of_key(request.app, key_hash)
    if bot is None:
        raise ApiError("bad_key", "no bot has this key (rotated or revoked?)")
    name = request.match_info["name"]
    if bot != name:
        raise ApiError("not_your_bot", f"this key is {bot}'s, not {name}'s", status=403)
    return bot, key_hash


async def rotate_key(request: web.Request) -> web.Response:
    bot, key_hash = await _owner(request)
    key = await request.app[appkeys.BOT_REGISTRY].rotate(bot, key_hash)
    request.app[appkeys.BOT_KEYS].pop(key_hash)  # here it stops now; elsewhere within the cache
    if key is None:
        raise ApiError("bad_key", "this key was rotated already; use the new one")
    return respond(request, BotKeyBody(name=bot, key=key).model_dump(), 201)


async def revoke_keys(request: web.Request) -> web.Response:
    """The operator's (admin token), as `agon bots revoke`: every key of the bot stops
    working, here at once and on every other gateway within `KEY_CACHE_S`. Its name stays
    registered, so nobody else takes it (its games and results keep it)."""
    operator(request)
    name = request.match_info["name"]
    revoked = await request.app[appkeys.BOT_REGISTRY].revoke(name)
    request.app[appkeys.BOT_KEYS].clear()
    return respond(request, {"name": name, "revoked": revoked})


async def update_bot(request: web.Request) -> web.Response:
    bot, _ = await _owner(request)
    body = await read_body(request, BotSettingsBody)
    await request.app[appkeys.BOT_REGISTRY].set_accept_challenges(bot, body.accept_challenges)
    return respond(request, {"name": bot, "accept_challenges": body.accept_challenges})


# -- answering a turn --------------------------------------------------------------------
async def bot_move(request: web.Request) -> web.Response:
    bot = await authenticate(request)
    body = await read_body(request, BotMoveBody)
    reply = await answer(
        request.app, bot, request.match_info["id"], body.move, body.seq, body.clock
    )
    return _answered(request, reply)


async def answer(
    app: web.Application, bot: str, game_id: str, move: str, seq: int, clock: str = ""
) -> Reply:
    seat, token = await _as_seat(app, bot, game_id)
    command = PlayMove(
        command_id=f"{bot}:{game_id}:{seq}", game_id=game_id, seat=seat, token=token,
        move=move, expected_seq=seq, clock=clock,
    )  # fmt: skip
    return await submit(app, command)


async def bot_resign(request: web.Request) -> web.Response:
    bot = await authenticate(request)
    return _answered(request, await resign(request.app, bot, request.match_info["id"]))


async def resign(app: web.Application, bot: str, game_id: str) -> Reply:
    """The engine's `Resign` for the bot's seat, signed with the seat's token."""
    seat, token = await _as_seat(app, bot, game_id)
    command = Resign(command_id=f"{bot}:{game_id}:resign", game_id=game_id, seat=seat, token=token)
    return await submit(app, command)


async def _as_seat(app: web.Application, bot: str, game_id: str) -> tuple[int, str]:
    """The bot's seat in the game, and the token that speaks for it."""
    seat = await _seat_of(app, bot, game_id)
    return seat, bot_token(app[appkeys.SECRET], game_id, seat)


def _answered(request: web.Request, reply: Reply) -> web.Response:
    """The engine's reply to a bot's command: its refusal, or the seq it reached."""
    if (error := refused(reply)) is not None:
        raise error
    return respond(request, {"seq": reply.seq})


async def bot_ready(request: web.Request) -> web.Response:
    """A bot answers `prepare` on its NDJSON streams: every stream of it on this gateway is
    ready for the game type, and the turns they held for it go now."""
    bot = await authenticate(request)
    body = await read_body(request, ReadyBody)
    released = request.app[appkeys.BOT_STREAMS].ready(bot, body.game, body.options)
    return respond(request, HeldBody(released=released).model_dump())


async def _seat_of(app: web.Application, bot: str, game_id: str) -> int:
    states = app[appkeys.STATES]
    game = await states.known(game_id)  # for its seats: the engine checks the rest
    if game is None:
        raise ApiError("unknown_game", f"no game {game_id}")
    if all(s["kind"] == "bot" and s["name"] == bot for s in game.seats):
        game = await states.current(game_id) or game  # both seats: which is to move now?
    return bot_seat(game, bot)


def bot_seat(game: GameFold, bot: str) -> int:
    """The seat `bot` plays in `game` (the one to move if it plays both)."""
    mine = [s["seat"] for s in game.seats if s["kind"] == "bot" and s["name"] == bot]
    if not mine:
        raise ApiError("not_your_game", f"{bot} has no seat in game {game.game_id}")
    return game.to_move if game.to_move in mine else int(mine[0])


async def _stream_bot(request: web.Request) -> tuple[str, str]:
    """The bot opening a stream, and its key's hash. A burst of connecting streams takes its
    turn with their searches (`TurnReader.opening`)."""
    async with request.app[appkeys.TURNS].opening:
        bot = await authenticate(request)
    return bot, _bearer_hash(request)


async def bot_stream(request: web.Request) -> web.StreamResponse:
    bot, key_hash = await _stream_bot(request)

    def alive() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()

    async def produce(write: Write) -> None:
        async def emit(message: BaseModel | None) -> None:
            await write(b"\n" if message is None else message.model_dump_json().encode() + b"\n")

        await serve_turns(
            request.app, bot, emit, key_hash=key_hash, alive=alive, ready=ready_param(request)
        )

    with stream_slot(request.app, bot):
        return await ndjson(request, "bot", produce)


async def bot_socket(request: web.Request) -> web.WebSocketResponse:
    bot, key_hash = await _stream_bot(request)
    ready = ready_param(request)
    mine: list[Turns] = []  # this socket's stream, once it opened

    async def feed(ws: web.WebSocketResponse) -> None:
        async def emit(message: BaseModel | None) -> None:
            await send(ws, PingMessage() if message is None else message)

        await serve_turns(
            request.app, bot, emit, key_hash=key_hash, alive=lambda: not ws.closed,
            ready=ready, opened=mine.append,
        )  # fmt: skip
        await ws.close(code=1000, message=b"stream ended")

    async def handle(message: BotMoveMessage | BotResignMessage | ReadyMessage) -> Reply | None:
        if isinstance(message, ReadyMessage):
            for turns in mine:  # this socket's alone: another may not have prepared
                turns.ready_for(message.game, message.options)
            return None
        if isinstance(message, BotResignMessage):
            return await resign(request.app, bot, message.game_id)
        return await answer(
            request.app, bot, message.game_id, message.move, message.seq, message.clock
        )

    with stream_slot(request.app, bot):
        return await socket_loop(request, "bot", decode_bot_message, feed, handle)
