"""`/ws/games/{id}?since=SEQ`: a game's live events for spectators, and play for a seat.

The socket first sends what the client missed: the events after `since` from the log,
or, when it is more than `snapshot_gap` events behind, one `snapshot` (the view at the
log's head) instead. From then on every new event, in seq order, each once: the hub
wakes the socket, which reads the log from the seq after the last one it sent. A client
that reconnects with the last seq it saw therefore gets exactly what it missed. A seat
plays through the same socket (`move`, `resign` with its token) and gets a `reply`.

`socket_loop` is the life of every socket, this one and a bot's (`/ws/bot`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import WSMsgType, web
from pydantic import BaseModel, ValidationError

from schemas.api import (
    ErrorMessage,
    MoveMessage,
    PingMessage,
    ReplyMessage,
    ResignMessage,
    SnapshotMessage,
    decode_client_message,
)
from schemas.replies import Accepted, Rejected, Reply
from services.gateway import appkeys
from services.gateway.games import game_or_404, human_command
from services.gateway.http import UNAVAILABLE, ApiError, int_param, limited, summary
from services.gateway.live import LiveEvent, follow
from services.gateway.views import api_view

log = logging.getLogger("agon.gateway")

#: Messages of one socket being answered at once.
IN_FLIGHT = 64


def check_origin(request: web.Request) -> None:
    """A browser may open a socket only from this gateway's own page or an allowed origin
    (programs send no Origin)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return
    allowed = request.app[appkeys.SETTINGS].allowed_origins
    own = {f"{scheme}://{request.host}" for scheme in ("http", "https")}
    if origin not in own and origin not in allowed:
        raise ApiError("forbidden_origin", f"sockets are not open to pages from {origin}")


async def send(ws: web.WebSocketResponse, message: BaseModel) -> None:
    await ws.send_str(message.model_dump_json())


def reply_message(reply: Reply) -> ReplyMessage:
    """The engine's reply to a command sent on a socket."""
    if isinstance(reply, Rejected):
        return ReplyMessage(
            command_id=reply.command_id, ok=False, seq=reply.seq, code=reply.code,
            message=reply.message,
        )  # fmt: skip
    return ReplyMessage(command_id=reply.command_id, ok=True, seq=reply.seq)


async def socket_loop(
    request: web.Request,
    kind: str,
    decode: Callable[[str], BaseModel],
    feed: Callable[[web.WebSocketResponse], Coroutine[Any, Any, None]],
    answer: Callable[[Any], Awaitable[Reply | BaseModel | None]],
) -> web.WebSocketResponse:
    """The life of a socket of either kind: `feed` sends while each message from the
    client is decoded and answered in a task of its own (a ping with a ping; a command with
    the engine's `reply`, so one slow game holds up no other; another message with what
    `answer` returns, or nothing when it returns None), at most `IN_FLIGHT` at once;
    a bad message gets an `error` and is dropped. A feed that fails closes the socket
    (1011) so the client reconnects with its last seq. Ends when the client goes or the
    gateway stops."""
    check_origin(request)
    app = request.app
    settings = app[appkeys.SETTINGS]
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=settings.max_message_bytes)
    await ws.prepare(request)
    app[appkeys.SOCKETS].add(ws)
    gauge = app[appkeys.METRICS].sockets.labels(kind=kind)
    gauge.inc()
    feeding = asyncio.create_task(_feed(feed, ws))
    handling: set[asyncio.Task[None]] = set()

    async def handle(text: str) -> None:
        out: BaseModel | None
        try:
            message = decode(text)
            out = message if isinstance(message, PingMessage) else await answer(message)
            if isinstance(out, Accepted | Rejected):
                out = reply_message(out)
        except ValidationError as exc:
            out = ErrorMessage(code="invalid_request", message=summary(exc))
        except ApiError as exc:
            out = ErrorMessage(code=exc.code, message=exc.message)
        except Exception as exc:  # Redis away, a bug: an answer, not a stray traceback
            log.warning("socket message failed: %s", exc)
            out = ErrorMessage(code="unavailable", message=UNAVAILABLE)
        if out is not None:
            with contextlib.suppress(ConnectionResetError):
                await send(ws, out)

    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                if msg.type == WSMsgType.BINARY:
                    await send(ws, ErrorMessage(code="bad_request", message="send JSON text"))
                continue
            wait = limited(request)
            if wait:
                late = f"too many messages; retry in {wait:.1f} s"
                await send(ws, ErrorMessage(code="rate_limited", message=late))
                continue
            if len(handling) >= IN_FLIGHT:
                busy = f"more than {IN_FLIGHT} messages unanswered; wait for the replies"
                await send(ws, ErrorMessage(code="rate_limited", message=busy))
                continue
            task = asyncio.create_task(handle(msg.data))
            handling.add(task)
            task.add_done_callback(handling.discard)
    finally:
        for task in (feeding, *handling):
            task.cancel()
        # The feed also stops by itself once the socket is closed (within a keep-alive).
        limit = settings.keepalive_s + 1.0
        _, stuck = await asyncio.wait([feeding, *handling], timeout=limit)
        if stuck:
            log.warning("%d tasks of a closed socket did not stop in %.0f s", len(stuck), limit)
        app[appkeys.SOCKETS].discard(ws)
        gauge.dec()
    return ws


async def _feed(
    feed: Callable[[web.WebSocketResponse], Coroutine[Any, Any, None]], ws: web.WebSocketResponse
) -> None:
    try:
        await feed(ws)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:
        log.warning("socket feed failed (%s); closing it for the client to resume", exc)
        await ws.close(code=1011, message=b"resume with ?since=<last seq>")


async def game_socket(request: web.Request) -> web.WebSocketResponse:
    app = request.app
    game = await game_or_404(request)
    since = int_param(request, "since", 0, 0, 1 << 40)
    hub = app[appkeys.HUB]
    listener = hub.listen(game.game_id)  # before reading the log: nothing falls in between

    async def feed(ws: web.WebSocketResponse) -> None:
        last = since
        if game.seq - since > app[appkeys.SETTINGS].snapshot_gap:
            await send(ws, SnapshotMessage(seq=game.seq, view=api_view(game)))
            last = game.seq

        async def send_event(event: LiveEvent) -> None:
            await ws.send_str(event.socket_text)

        keepalive = app[appkeys.SETTINGS].keepalive_s
        with contextlib.suppress(ConnectionResetError):
            await follow(
                listener, app[appkeys.QUERY], last, send_event, keepalive_s=keepalive,
                alive=lambda: not ws.closed,
            )  # fmt: skip

    async def answer(message: MoveMessage | ResignMessage) -> Reply:
        current = await app[appkeys.STATES].current(game.game_id)
        assert current is not None  # the socket opened on it
        move = message.move if isinstance(message, MoveMessage) else None
        seq = message.seq if isinstance(message, MoveMessage) else 0
        return await human_command(app, current, message.command_id, message.token, move, seq)

    try:
        return await socket_loop(request, "game", decode_client_message, feed, answer)
    finally:
        hub.unlisten(listener)
