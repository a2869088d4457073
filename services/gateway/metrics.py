"""`/metrics`: the gateway's own counters, and the pipeline's lag read from Redis on scrape.

Counters and histograms live in a registry per application (never the process-global
one, so two gateways in one process, as in tests, do not collide). Consumer lag and
pending entries per group (`services.bus.presence`), and live games, are read from Redis
when Prometheus scrapes: they are the pipeline's state, not this process's.

By default `/metrics` is served on the gateway's own site to anyone, as before. An operator
can serve it on a port of its own instead (`--metrics-host/--metrics-port`; the main site
then answers 404) or ask for a bearer token (`--metrics-token`, compared in constant time,
never logged).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.bus.admission import platform_lag
from services.bus.clients import QueryClient
from services.bus.presence import Beat

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.latency = Histogram(
            "agon_command_seconds",
            "Command sent to the engine's reply (the events are appended by then)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.commands = Counter("agon_commands", "Commands by result code", ["code"], registry=r)
        self.sockets = Gauge("agon_open_sockets", "Open WebSockets", ["kind"], registry=r)
        self.streams = Gauge("agon_open_streams", "Open NDJSON streams", ["kind"], registry=r)
        self.lag = Gauge(
            "agon_consumer_lag", "Entries not yet delivered to a group", ["group"], registry=r
        )
        self.pending = Gauge(
            "agon_consumer_pending", "Entries delivered, not yet acknowledged", ["group"],
            registry=r,
        )  # fmt: skip
        self.live_games = Gauge("agon_live_games", "Games being played", registry=r)
        self.turn_lag = Gauge(
            "agon_turn_lag_ms",
            "The platform's lag on bots' turns, p99 over the last seconds, worst process:"
            " from the turn's event to the bot (delivery), from its answer to the engine (send)",
            ["stage"], registry=r,
        )  # fmt: skip
        self.undelivered = Gauge(
            "agon_turns_undelivered",
            "Bot turns the platform did not deliver before their clocks ran out (interrupted)",
            registry=r,
        )
        self.connections_refused = Counter(
            "agon_connections_refused", "Connections refused over a cap or closed at a deadline",
            ["reason"], registry=r,
        )  # fmt: skip
        #: `commands` by code, looked up once per code rather than per command
        self._commands_by_code: dict[str, Any] = {}

    def count_command(self, code: str) -> None:
        """One more command answered with `code` ("accepted", a refusal, "timeout")."""
        child = self._commands_by_code.get(code)
        if child is None:
            child = self._commands_by_code[code] = self.commands.labels(code=code)
        child.inc()

    async def refresh(self, query: QueryClient) -> None:
        """Read lag, pending entries, live games and the bots' lag (one pipeline)."""
        gauges = await query.gauges()
        if gauges.beats:
            self._turns(gauges.beats)
        for name, (lag, pending) in gauges.groups.items():
            self.lag.labels(group=name).set(lag)
            self.pending.labels(group=name).set(pending)
        self.live_games.set(gauges.live_games)

    def _turns(self, beats: dict[str, Beat]) -> None:
        lag = platform_lag(beats)
        self.turn_lag.labels(stage="delivery").set(lag.lag_ms)
        self.turn_lag.labels(stage="send").set(lag.send_ms)
        self.undelivered.set(lag.late)

    def text(self) -> bytes:
        return generate_latest(self.registry)
