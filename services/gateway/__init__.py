"""The aiohttp gateway: REST, WebSockets and NDJSON streams for people and outside bots.

It is thin: requests become commands through the command client, and views and logs are
read through the query client (and the gateway's own folds of the logs); the engine
service alone decides legality, seats and tokens. Any number of gateways run side by
side, each with its own reply stream and its own follower of every feed (while anybody
listens there).
"""

from services.gateway.app import init_app
from services.gateway.settings import GatewaySettings

__all__ = ["GatewaySettings", "init_app"]
