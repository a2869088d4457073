"""The gateway's typed application keys, in one place."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from aiohttp import web

from services.bus.cache import LRU
from services.bus.clients import CommandClient, QueryClient
from services.bus.delivery import Deliveries
from services.bus.registry import BotRegistry
from services.tournament.store import TournamentStore

if TYPE_CHECKING:
    from services.gateway.botstreams import BotStreams
    from services.gateway.leaderboards import Leaderboards
    from services.gateway.limits import RateLimiter
    from services.gateway.live import Hub, TurnReader
    from services.gateway.metrics import Metrics
    from services.gateway.settings import GatewaySettings
    from services.gateway.views import GameStates

SETTINGS: web.AppKey[GatewaySettings] = web.AppKey("settings")
NAME: web.AppKey[str] = web.AppKey("name", str)
REDIS: web.AppKey[Any] = web.AppKey("redis")
SECRET: web.AppKey[bytes] = web.AppKey("secret", bytes)
COMMANDS: web.AppKey[CommandClient] = web.AppKey("commands", CommandClient)
#: Outside bots' names, keys and consent (`services.bus.registry`).
BOT_REGISTRY: web.AppKey[BotRegistry] = web.AppKey("bot_registry", BotRegistry)
QUERY: web.AppKey[QueryClient] = web.AppKey("query", QueryClient)
#: tournaments' logs and the list of them (`services.tournament.store`), one per gateway
TOURNAMENTS: web.AppKey[TournamentStore] = web.AppKey("tournaments", TournamentStore)
STATES: web.AppKey[GameStates] = web.AppKey("states")
HUB: web.AppKey[Hub] = web.AppKey("hub")
TURNS: web.AppKey[TurnReader] = web.AppKey("turns")
#: starts an outside bot's clock when its turn is written to its stream or socket
DELIVERIES: web.AppKey[Deliveries] = web.AppKey("deliveries", Deliveries)
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
LIMITER: web.AppKey[RateLimiter] = web.AppKey("limiter")
#: each rules' leaderboards, computed once per version of the results
LEADERBOARDS: web.AppKey[Leaderboards] = web.AppKey("leaderboards")


class OpenSockets(set[web.WebSocketResponse]):
    """The open WebSockets, closed when the gateway stops."""


SOCKETS: web.AppKey[OpenSockets] = web.AppKey("sockets", OpenSockets)
#: open turn streams per outside bot on this gateway
BOT_CONNECTIONS: web.AppKey[Counter[str]] = web.AppKey("bot_connections", Counter)
#: outside bots' turn streams on this gateway, and the positions their turns' legal moves
#: come from (`services.gateway.turns`)
BOT_STREAMS: web.AppKey[BotStreams] = web.AppKey("bot_streams")
#: bot key hash -> (bot name, when to ask Redis again): a bot's every move is authenticated
BOT_KEYS: web.AppKey[LRU[str, tuple[str, float]]] = web.AppKey("bot_keys", LRU)
