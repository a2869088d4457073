"""Counting what a real redis-server ran (`INFO commandstats`), to check round trips."""

from __future__ import annotations

from typing import Any


async def calls(redis: Any, *commands: str) -> int:
    """How many times the server ran these commands so far (lowercase names: "evalsha")."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in commands)
