"""Serving the gateway on a host and port until stopped (`agon gateway`, `agon up`).

The listening socket is made here rather than by aiohttp's `TCPSite` so that every
connection goes through the door of `guard.py` (caps per address and in all, read
deadlines); aiohttp's `AppRunner` still runs the application and closes its connections.
With `metrics_port`, `/metrics` is served on a site of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from services.bus.connection import Client
from services.gateway import appkeys
from services.gateway.app import init_app
from services.gateway.guard import (
    Door,
    address_cap,
    connection_cap,
    file_limit,
    guarded_factory,
    quiet_accept_errors,
)
from services.gateway.routes import metrics_app
from services.gateway.settings import GatewaySettings

#: How long a stopping gateway lets its handlers finish.
SHUTDOWN_S = 2.0

log = logging.getLogger("agon.gateway")

#: Connections the kernel completes before the gateway accepts them (capped by the kernel's
#: somaxconn). Larger than aiohttp's 128: when a burst of connections overflows it, the
#: kernel drops new handshakes and every other client waits a second to retry.
BACKLOG = 2048


@contextlib.asynccontextmanager
async def serving(
    settings: GatewaySettings, host: str, port: int, *, redis: Client | None = None
) -> AsyncIterator[str]:
    """Serve the gateway while the block runs; yields its URL."""
    app = init_app(settings, redis=redis)
    # Handlers still running at a stop (spectators' streams) get SHUTDOWN_S, not aiohttp's
    # 60 s: a gateway stops within seconds of SIGTERM in every state.
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=settings.idle_timeout_s,
        shutdown_timeout=SHUTDOWN_S,
    )
    await runner.setup()
    loop = asyncio.get_running_loop()
    files = file_limit()
    total = connection_cap(files, settings.max_connections)
    door = Door(
        total, address_cap(total, settings.max_connections_per_address), app[appkeys.METRICS]
    )
    assert runner.server is not None
    factory = guarded_factory(
        runner.server, door, idle_s=settings.idle_timeout_s,
        header_s=settings.header_timeout_s, body_s=settings.body_timeout_s, loop=loop,
    )  # fmt: skip
    listening: asyncio.Server | None = None
    try:
        with quiet_accept_errors(loop):
            try:
                listening = await loop.create_server(factory, host, port, backlog=BACKLOG)
            except OSError as exc:
                raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
            log.info(
                "gateway: at most %d connections (file limit %d), %s per address",
                door.total, files, door.per_address or "no cap",
            )  # fmt: skip
            async with _metrics_site(settings, app):
                shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
                log.warning("%s ready: serving http://%s:%d", app[appkeys.NAME], shown, port)
                yield f"http://{shown}:{port}"
    finally:
        if listening is not None:
            listening.close()
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _metrics_site(settings: GatewaySettings, main: web.Application) -> AsyncIterator[None]:
    """`/metrics` on `metrics_host:metrics_port` while the block runs, if asked for."""
    if not settings.metrics_port:
        yield
        return
    runner = web.AppRunner(metrics_app(main), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.metrics_host, settings.metrics_port)
        try:
            await site.start()
        except OSError as exc:
            where = f"{settings.metrics_host}:{settings.metrics_port}"
            raise OSError(f"cannot serve metrics on {where}: {exc.strerror}") from None
        yield
    finally:
        await runner.cleanup()


async def serve_until(
    settings: GatewaySettings, host: str, port: int, stop: asyncio.Event, redis: Client
) -> None:
    async with serving(settings, host, port, redis=redis) as url:
        print(f"agon gateway: serving {url} (API {url}/api/games, docs {url}/openapi.json)",
              flush=True)  # fmt: skip
        await stop.wait()
