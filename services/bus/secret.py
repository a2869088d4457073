"""The server secret every process of a deployment shares (bot seat tokens, the admin token).

`AGON_SECRET` when the operator sets it; otherwise the first process to ask generates a
random one and stores it in Redis (`SET NX`, so racing processes agree on the first), where
every other process finds it. Nothing in the code base knows a secret, so no one can forge
a token by reading it; whoever can read Redis could already rewrite every log. With the
Redis users of `agon acl`, no service may touch that key: each one that needs the secret
gets `AGON_SECRET` in its env file, and one started without it is told so.
"""

from __future__ import annotations

import os
from typing import Any

from redis.exceptions import NoPermissionError

from schemas.tokens import clock_key, new_secret, secret_from_env
from services.bus.connection import Client
from services.bus.keys import Keys


async def shared_secret(redis: Client, keys: Keys) -> bytes:
    """The deployment's secret: the environment's, else the one shared through Redis."""
    configured = secret_from_env()
    if configured is not None:
        return configured
    try:
        await redis.set(keys.secret(), new_secret(), nx=True)
        stored: Any = await redis.get(keys.secret())
    except NoPermissionError:
        raise NoPermissionError(
            f"this Redis user may not share the server secret through {keys.secret()}: set "
            "AGON_SECRET (agon acl writes it into the env file of each service that needs it)"
        ) from None
    return bytes(stored)


async def clock_signing_key(redis: Client, keys: Keys) -> bytes:
    """The key that signs move clocks (`schemas.tokens.clock_key`): env `AGON_CLOCK_KEY`
    (what `agon acl` gives bot workers, which hold no secret), else the secret's."""
    configured = os.environ.get("AGON_CLOCK_KEY", "")
    if configured:
        return configured.encode()
    return clock_key(await shared_secret(redis, keys))
