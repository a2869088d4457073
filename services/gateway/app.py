"""The gateway's application: `init_app(settings)` and its shared parts.

The shared parts live under typed app keys (`services.gateway.appkeys`) and are made and
closed by one cleanup context: the Redis connection (unless the caller lends one), a
command client with this gateway's own reply stream, the query client, the folds of
recently read games, the live hub following every feed (while anybody listens), and the
metrics. Every answer carries the browser policy (`guard.secure_headers`); connection caps
and read deadlines are the serving side's (`serve.py`, `guard.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from schemas.tokens import clock_key
from services.bus.cache import LRU
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import connect
from services.bus.delivery import Deliveries
from services.bus.feeds import FeedTail
from services.bus.registry import BotRegistry
from services.bus.secret import shared_secret
from services.gateway import appkeys, routes, tournaments
from services.gateway.botstreams import BotStreams
from services.gateway.guard import secure_headers
from services.gateway.http import errors, media_types, rate_limit
from services.gateway.limits import RateLimiter
from services.gateway.live import Hub, TurnReader
from services.gateway.metrics import Metrics
from services.gateway.settings import REDIS_CONNECTIONS, GatewaySettings
from services.gateway.views import GameStates
from services.tournament.store import TournamentStore


# -- the application -------------------------------------------------------------------
def init_app(settings: GatewaySettings, *, redis: Any = None) -> web.Application:
    """The gateway; `redis` lends a connection (closed by its owner), else one is opened."""
    app = web.Application(
        middlewares=[errors, rate_limit, media_types], client_max_size=settings.max_body_bytes
    )
    app.on_response_prepare.append(secure_headers)
    app[appkeys.SETTINGS] = settings
    app[appkeys.NAME] = settings.name or f"gateway-{uuid.uuid4().hex[:8]}"
    app[appkeys.LIMITER] = RateLimiter(settings.rate_per_s, settings.burst)
    app[appkeys.METRICS] = Metrics()
    app[appkeys.SOCKETS] = appkeys.OpenSockets()
    app[appkeys.BOT_CONNECTIONS] = Counter()
    app[appkeys.BOT_STREAMS] = BotStreams()
    app[appkeys.BOT_KEYS] = LRU(10_000)
    app.cleanup_ctx.append(_parts(redis))
    app.cleanup_ctx.append(tournaments.leaderboard_cache)
    app.on_shutdown.append(_closing)
    routes.add_routes(app)
    return app


def _parts(
    lent: Any,
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def parts(app: web.Application) -> AsyncIterator[None]:
        settings = app[appkeys.SETTINGS]
        keys = settings.keys
        redis = (
            lent
            if lent is not None
            else await connect(settings.redis_url, max_connections=REDIS_CONNECTIONS)
        )
        app[appkeys.REDIS] = redis
        app[appkeys.SECRET] = await shared_secret(redis, keys)
        app[appkeys.DELIVERIES] = Deliveries(redis, keys, clock_key(app[appkeys.SECRET]))
        app[appkeys.BOT_REGISTRY] = BotRegistry(redis, keys)
        await app[appkeys.BOT_REGISTRY].fold_names()
        commands = CommandClient(
            redis, keys, name=app[appkeys.NAME], timeout_s=settings.command_timeout_s
        )
        commands.start()
        app[appkeys.COMMANDS] = commands
        query = QueryClient(redis, keys)
        app[appkeys.QUERY] = query
        app[appkeys.TOURNAMENTS] = TournamentStore(redis, keys)
        app[appkeys.STATES] = GameStates(query)
        hub = Hub(FeedTail(redis, keys))
        app[appkeys.HUB] = hub
        stop = asyncio.Event()
        following = asyncio.create_task(hub.run(stop))
        # One reader of the inboxes of every bot streaming here (services.gateway.turns).
        app[appkeys.TURNS] = TurnReader(redis, keys, app[appkeys.NAME], app[appkeys.DELIVERIES].lag)
        reading = asyncio.create_task(app[appkeys.TURNS].run(stop))
        try:
            yield
        finally:
            stop.set()  # sockets and bot streams were ended first (`_closing`)
            for task in (following, reading):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await commands.close()
            if lent is None:
                await redis.aclose()

    return parts


#: How long a stopping gateway waits for its sockets' closing handshakes, all at once.
CLOSING_S = 2.0


async def _closing(app: web.Application) -> None:
    """Before the server waits for its handlers: end every bot stream and close every
    socket, so that a stopping gateway does not wait for clients that never leave."""
    if appkeys.TURNS in app:
        app[appkeys.TURNS].close()
    sockets = app[appkeys.SOCKETS]
    closing = [
        asyncio.create_task(ws.close(code=1001, message=b"gateway stopping"))
        for ws in list(sockets)
    ]
    if closing:
        _, late = await asyncio.wait(closing, timeout=CLOSING_S)
        for task in late:  # a peer that never answers the handshake
            task.cancel()
