"""Serving the gateway on a host and port until stopped (`agon gateway`, `agon up`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from services.bus.connection import Client
from services.gateway.app import init_app
from services.gateway.settings import GatewaySettings


@contextlib.asynccontextmanager
async def serving(
    settings: GatewaySettings, host: str, port: int, *, redis: Client | None = None
) -> AsyncIterator[str]:
    """Serve the gateway while the block runs; yields its URL."""
    runner = web.AppRunner(init_app(settings, redis=redis), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        yield f"http://{shown}:{port}"
    finally:
        await runner.cleanup()


async def serve_until(
    settings: GatewaySettings, host: str, port: int, stop: asyncio.Event, redis: Client
) -> None:
    async with serving(settings, host, port, redis=redis) as url:
        print(f"agon gateway: serving {url} (API {url}/api/games, docs {url}/openapi.json)",
              flush=True)  # fmt: skip
        await stop.wait()
