"""A running arena for gateway tests: every service as tasks, and gateways over real HTTP.

`arena` starts the engine, projector, dispatcher and a random-bot worker on the test's
Redis database, and `gateway()` serves a gateway on a free port of the loopback (real
sockets, as a browser or an outside bot would reach it); everything stops when the test
ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from services.bus.keys import Keys
from services.cli.pipeline import ServiceSet
from services.gateway import GatewaySettings, init_app


@dataclass
class Arena:
    redis: Any
    keys: Keys
    services: ServiceSet
    clients: list[TestClient] = field(default_factory=list)

    async def gateway(self, **settings: Any) -> TestClient:
        """A gateway on its own port, with its own reply stream and feed follower."""
        app = init_app(GatewaySettings(keys=self.keys, **settings), redis=self.redis)
        client = TestClient(TestServer(app, host="127.0.0.1"))
        await client.start_server()
        self.clients.append(client)
        return client


@contextlib.asynccontextmanager
async def running_arena(redis: Any, keys: Keys, bots: list[str]) -> AsyncIterator[Arena]:
    services = ServiceSet(redis, keys, bots, block_ms=50)
    await services.start()
    arena = Arena(redis, keys, services)
    try:
        yield arena
    finally:
        for client in arena.clients:
            await client.close()
        await services.stop()


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float = 20.0) -> Any:
    """Poll `check` until it returns something true; its last answer."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        got = await check()
        if got or asyncio.get_running_loop().time() > deadline:
            return got
        await asyncio.sleep(0.02)


async def new_game(client: TestClient, game: str = "teeko", **body: Any) -> dict[str, Any]:
    payload = {"game": game, "seats": [{"human": {}}, {"bot": "random"}], **body}
    resp = await client.post("/api/games", json=payload)
    assert resp.status == 201, await resp.text()
    created: dict[str, Any] = await resp.json()
    return created


async def view(client: TestClient, game_id: str, **params: Any) -> dict[str, Any]:
    resp = await client.get(f"/api/games/{game_id}", params=params)
    assert resp.status == 200, await resp.text()
    got: dict[str, Any] = await resp.json()
    return got


async def ended(client: TestClient, game_id: str, timeout_s: float = 90.0) -> dict[str, Any]:
    """The game's view once it ended; fails the test when it does not within `timeout_s`."""

    async def check() -> dict[str, Any] | None:
        v = await view(client, game_id)
        return v if v["status"] == "ended" else None

    final: dict[str, Any] = await until(check, timeout_s=timeout_s)
    assert final, f"game {game_id} did not end"
    return final


async def play_out(client: TestClient, game_id: str, token: str, seat: int = 1) -> dict[str, Any]:
    """Play `seat`'s first legal move whenever it is to move, until the game ends."""
    while True:
        v = await until(lambda: _ready(client, game_id, seat))
        if v["status"] == "ended":
            return v
        resp = await client.post(
            f"/api/games/{game_id}/moves",
            json={"move": v["legal_moves"][0], "seq": v["seq"], "token": token},
        )
        assert resp.status == 200, await resp.text()


async def _ready(client: TestClient, game_id: str, seat: int) -> dict[str, Any] | None:
    v = await view(client, game_id)
    return v if v["status"] == "ended" or v["to_move"] == seat else None


__all__ = ["Arena", "new_game", "play_out", "running_arena", "until", "view"]
