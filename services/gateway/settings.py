"""The gateway's settings: where Redis is, limits, and timings."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.bus.keys import Keys
from services.bus.quotas import Quota

#: A gateway's Redis connections at most. Bot streams hold none (one reader serves them
#: all, services.gateway.turns), but redis-py's pool refuses a command beyond its size
#: rather than queue it, so a burst of requests still needs room.
REDIS_CONNECTIONS = 4_096
#: Games one client address may create, and one registered bot may import, shared by every
#: gateway (`services.bus.quotas`): far above what a person, the demo or a test does.
CREATE_QUOTA = Quota(per_hour=600, burst=200)
IMPORT_QUOTA = Quota(per_hour=60, burst=20)
#: Bots one client address may register (names are kept for good), in every gateway.
REGISTER_QUOTA = Quota(per_hour=20, burst=10)


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
    #: open client connections in all (0: as many as the file limit leaves, guard.py) and
    #: per client address (0: no cap, for a gateway behind a proxy that is its only client)
    max_connections: int = 0
    max_connections_per_address: int = 256
    #: a connection silent or idle between requests this long is closed (keep-alive)
    idle_timeout_s: float = 15.0
    #: a request's headers must arrive within this of its first byte, its body within
    #: this of its headers, or the connection is closed (slowloris)
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    #: serve /metrics on this address and port instead of the gateway's own (0: on its own)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    #: a bearer token /metrics asks for ("": none); kept out of the settings' repr
    metrics_token: str = field(default="", repr=False)
    #: games each client address may create (creators are anonymous), in every gateway
    create_quota: Quota = CREATE_QUOTA
    #: games each registered bot may import, in every gateway
    import_quota: Quota = IMPORT_QUOTA
    #: bots each client address may register, in every gateway
    register_quota: Quota = REGISTER_QUOTA
