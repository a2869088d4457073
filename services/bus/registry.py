"""The outside bots' registry in Redis: names, keys and consent, for gateways and the CLI.

A bot's name is claimed case-insensitively (`Keys.bot_names` maps the case-folded name to
the name as registered, so `Alpha` and `ALPHA` are one bot), and names the platform speaks
in are reserved: every built-in bot (and `<bot>.<label>`), and the system actors whose
command ids begin with their name (`timeout:`, `unserved:`, `cancel:`...). Only the sha256
of a key is kept (`Keys.bot_key_hashes`, hash -> name); rotating a key deletes the old hash
as it adds the new one, and revoking deletes every hash of the bot. The bot's record
(`Keys.registered_bots`, name -> JSON) says when it registered and whether it accepts
challenges: whether anyone may seat it in a game, or only a creator bearing its key.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from schemas.tokens import token_hash
from services.bus.connection import Client
from services.bus.keys import Keys
from services.bus.text import as_text, now_ms

#: Names of the platform's own actors and roles: system command ids start with some of
#: them (`timeout:<game>:<seq>`, `unserved:...`, `cancel:...`, `tour:...`, `create:...`,
#: `selfplay:...`), and the rest name services or would pass for them.
SYSTEM_NAMES = frozenset({
    "timeout", "unserved", "abandoned", "cancel", "tour", "create", "selfplay", "import",
    "imported",
    "admin", "administrator", "system", "root", "operator", "agon", "platform", "server",
    "engine", "dispatcher", "gateway", "projector", "director", "worker", "workers", "bots",
    "bot", "human", "player", "anonymous", "nobody", "null", "none",
})  # fmt: skip


class Refused(ValueError):
    """A registry request refused, with the gateway's code for it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def reserved(name: str, built_in: Iterable[str]) -> bool:
    """Whether `name` (in any case, and as `<name>.<label>`) is the platform's own: a system
    name or one of the `built_in` bots (the bus does not import `bots`; its caller names them)."""
    base = name.casefold().partition(".")[0]
    taken = {b.casefold() for b in built_in} | SYSTEM_NAMES
    return name.casefold() in taken or base in taken


def new_key() -> str:
    return f"agon_{secrets.token_urlsafe(32)}"


class BotRegistry:
    """Registration, keys and consent of outside bots."""

    def __init__(self, redis: Client, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def register(
        self, name: str, built_in: Iterable[str], *, accept_challenges: bool = False
    ) -> str:
        """Claim `name` and return its new key (shown once), or raise `Refused`."""
        if reserved(name, built_in):
            raise Refused("name_reserved", f"{name} is reserved for the platform; pick another")
        taken = f"a bot called {name} (in any case) is registered already"
        if not await self.redis.hsetnx(self.keys.bot_names(), name.casefold(), name):
            raise Refused("name_taken", taken)
        record = json.dumps({"registered": now_ms(), "accept_challenges": accept_challenges})
        if not await self.redis.hsetnx(self.keys.registered_bots(), name, record):
            raise Refused("name_taken", taken)  # registered before names were case-folded
        key = new_key()
        await self.redis.hset(self.keys.bot_key_hashes(), token_hash(key), name)
        return key

    async def fold_names(self) -> int:
        """Claim the case-folded name of every bot registered before names were folded, so
        that none can be registered again in another case; how many were claimed now."""
        claimed = 0
        async for name, _ in self.redis.hscan_iter(self.keys.registered_bots()):
            text = as_text(name)
            claimed += int(await self.redis.hsetnx(self.keys.bot_names(), text.casefold(), text))
        return claimed

    async def names(self, limit: int, *, skip: Collection[str] = ()) -> list[str]:
        """Up to `limit` registered names not in `skip`, in the hash's order (a scan, in
        batches of `limit`: never the whole registry at once)."""
        found: list[str] = []
        async for raw, _ in self.redis.hscan_iter(self.keys.registered_bots(), count=limit):
            name = as_text(raw)
            if name not in skip:
                found.append(name)
            if len(found) >= limit:
                break
        return found

    async def is_bot_name(self, name: str, built_in: Iterable[str]) -> bool:
        """Whether `name`, in any case, is the platform's or a registered bot's."""
        return reserved(name, built_in) or bool(
            await self.redis.hexists(self.keys.bot_names(), name.casefold())
        )

    async def bot_of(self, key_hash: str) -> str | None:
        """The bot whose key hashes to `key_hash`, if the key is valid."""
        name = await self.redis.hget(self.keys.bot_key_hashes(), key_hash)
        return as_text(name) if name else None

    async def owners(self, key_hashes: Sequence[str]) -> list[str | None]:
        """The bot of each key hash, in one HMGET (None: no longer a valid key)."""
        if not key_hashes:
            return []
        names = await self.redis.hmget(self.keys.bot_key_hashes(), list(key_hashes))
        return [as_text(n) if n else None for n in names]

    async def record(self, name: str) -> dict[str, Any] | None:
        """The bot's record, None when no outside bot has this name."""
        raw = await self.redis.hget(self.keys.registered_bots(), name)
        return None if raw is None else dict(json.loads(raw or "{}"))

    async def rotate(self, name: str, key_hash: str) -> str | None:
        """A new key for `name` in place of the one hashing to `key_hash`, which stops
        working now; None if that key was no longer valid (rotated by another request)."""
        if not await self.redis.hdel(self.keys.bot_key_hashes(), key_hash):
            return None
        key = new_key()
        await self.redis.hset(self.keys.bot_key_hashes(), token_hash(key), name)
        return key

    async def revoke(self, name: str) -> int:
        """Delete every key of `name`: the number deleted. The name stays registered (its
        games and results keep it); `agon bots revoke` is the operator's way in."""
        gone = [
            as_text(key_hash)
            async for key_hash, owner in self.redis.hscan_iter(self.keys.bot_key_hashes())
            if as_text(owner) == name
        ]
        return int(await self.redis.hdel(self.keys.bot_key_hashes(), *gone)) if gone else 0

    async def set_accept_challenges(self, name: str, accept: bool) -> None:
        record = await self.record(name) or {}
        record["accept_challenges"] = accept
        await self.redis.hset(self.keys.registered_bots(), name, json.dumps(record))
