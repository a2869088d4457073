"""The gateway's settings: where Redis is, limits, and timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.bus.keys import Keys

#: A gateway's Redis connections: each open bot stream holds one in a blocking read, so
#: the client's default (100) would refuse commands under load rather than queue them.
REDIS_CONNECTIONS = 4_096


@dataclass(frozen=True)
class GatewaySettings:
    redis_url: str = ""
    keys: Keys = field(default_factory=Keys)
    #: names this gateway's reply stream and heartbeats; random when ""
    name: str = ""
    max_body_bytes: int = 1 << 20
    max_message_bytes: int = 16 << 10
    #: origins a browser may open sockets from, besides the gateway's own
    allowed_origins: tuple[str, ...] = ()
    #: requests per second allowed per key and per address, and the burst above it
    rate_per_s: float = 100.0
    burst: int = 200
    keepalive_s: float = 5.0
    #: a socket this many events behind gets a snapshot instead of the events
    snapshot_gap: int = 200
    command_timeout_s: float = 10.0
    #: an archive directory (`agon archive`) whose games the gateway lists and serves; "": none
    archive: str = ""
