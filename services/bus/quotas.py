"""Quotas: a token bucket per (principal, action) in Redis, shared by every gateway.

A gateway's own rate limit (`services.gateway.http.limited`) bounds requests per second in
one process; a quota bounds what one principal may make the deployment hold (games created,
games imported, bots registered) per hour, whichever gateway it asks. Each bucket is one
small hash (`Keys.quota`) updated by one Lua script that refills it at `Quota.per_hour`
tokens an hour up to `Quota.burst`, on the Redis server's clock (gateways' clocks may
disagree), and takes a token if there is one. The key carries a hash tag, so the script
touches one slot on a Redis Cluster, and it expires once the bucket would be full again:
a bucket left alone costs nothing, and an expired one is exactly a full one.

Use: `wait = await take(redis, keys, "create", f"addr:{address}", Quota(600, 200))`; 0
means go on, anything else is the seconds until a token is there (the gateway answers 429
`quota_exceeded` with `Retry-After`). A principal is a short name of whom the action counts
against, with its kind first (`addr:`, `bot:`): an authenticated bot, or an address when
the caller is anonymous.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.bus.connection import Client
from services.bus.keys import Keys
from services.bus.scripts import Script

__all__ = ["Quota", "take"]


@dataclass(frozen=True, slots=True)
class Quota:
    """At most `burst` actions at once, refilled at `per_hour` actions an hour."""

    per_hour: float
    burst: int

    def __post_init__(self) -> None:
        if self.per_hour <= 0 or self.burst < 1:
            raise ValueError(f"a quota needs per_hour > 0 and burst >= 1, not {self}")


# KEYS[1]: the bucket (hash: tokens, at = server ms of the last take).
# ARGV: tokens per ms, burst. Returns 0 (a token taken) or the ms until one is there.
_TAKE = Script("""
local now_s = redis.call('TIME')
local now = tonumber(now_s[1]) * 1000 + math.floor(tonumber(now_s[2]) / 1000)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(held[1]) or burst
local at = tonumber(held[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then
    tokens = tokens - 1
else
    wait = math.max(1, math.ceil((1 - tokens) / rate))
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'at', now)
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate) + 1000)
return wait
""")


async def take(redis: Client, keys: Keys, action: str, principal: str, quota: Quota) -> float:
    """Take one `action` from `principal`'s bucket: 0.0 if allowed, else the seconds to wait
    until it would be (nothing is taken then)."""
    per_ms = quota.per_hour / 3_600_000
    wait_ms = await _TAKE(redis, [keys.quota(action, principal)], [repr(per_ms), quota.burst])
    return int(wait_ms) / 1000
