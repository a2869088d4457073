"""Clock and text helpers every reader of Redis uses: wall-clock ms, entry-id ms, bytes as str.

Most services, the bench and the tests need only these three from the bus: the time in
the unit of event times and deadlines (`now_ms`), when Redis received a stream entry
(`id_ms`, from its id), and a name, id or member as str (`as_text`, since redis-py
returns bytes). They live apart from the consumer loop (`services.bus.consumer`) so that
importing them loads nothing else: standard library only.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, the unit of event times and deadlines."""
    return time.time_ns() // 1_000_000


def as_text(value: bytes | str) -> str:
    """A stream name, entry id or member as str (redis-py returns bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def id_ms(entry_id: bytes | str) -> int:
    """The millisecond part of a stream entry id: when Redis received the entry."""
    if isinstance(entry_id, bytes):  # as redis-py returns it: no decoding on the hot path
        return int(entry_id[: entry_id.index(b"-")])
    return int(entry_id.partition("-")[0])
