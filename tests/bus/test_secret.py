"""The server secret: never a constant in the code; generated once per deployment and
shared through Redis, unless the operator sets AGON_SECRET."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from schemas.tokens import admin_token, bot_token
from services.bus.keys import Keys
from services.bus.secret import shared_secret
from services.dispatcher import Dispatcher
from services.engine_service import EngineService


async def test_a_deployment_without_agon_secret_shares_one_it_generated(
    redis: aioredis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGON_SECRET", raising=False)
    keys = Keys(prefix=namespace)
    racing = await asyncio.gather(*(shared_secret(redis, keys) for _ in range(8)))
    assert len(set(racing)) == 1  # racing processes agree on the first one written
    secret = racing[0]
    assert len(secret) == 64 and await redis.get(keys.secret()) == secret
    engine, dispatcher = EngineService(redis, keys), Dispatcher(redis, keys)
    await engine.setup()
    await dispatcher.setup()
    assert engine.rules is not None and engine.rules.secret == secret == dispatcher.secret
    # Another deployment (prefix) has a secret of its own, so tokens do not carry over.
    other = await shared_secret(redis, Keys(prefix=f"{namespace}-other"))
    assert other != secret
    assert bot_token(other, "g", 1) != bot_token(secret, "g", 1)
    assert admin_token(other) != admin_token(secret)


async def test_agon_secret_wins_and_nothing_is_stored(
    redis: aioredis.Redis, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGON_SECRET", "from-the-operator")
    keys = Keys(prefix=namespace)
    assert await shared_secret(redis, keys) == b"from-the-operator"
    assert await redis.exists(keys.secret()) == 0
