"""The gateway's door: who may hold a connection, for how long, and what every answer says.

A client can make the gateway hold a file for every TCP connection it opens, so
connections are bounded twice: per client address (one address holding thousands of
sockets leaves room for everybody else) and in all, below the process's file limit with
room left for Redis connections and files (`connection_cap`). A connection over a cap is
closed at once, before aiohttp parses a byte and without a log line (a counter in
`/metrics` says how many). An admitted connection has deadlines: silent or idle between
requests for `idle_timeout_s` (aiohttp's keep-alive), a request's headers within
`header_timeout_s` of its first byte, its body within `body_timeout_s` of its headers; a
request that misses one is closed (slowloris). When the process runs out of files anyway,
asyncio's accept loop reports it every second with a traceback: `quiet_accept_errors`
logs it in one line at most once per interval. `secure_headers` gives every answer (API,
pages, static files, errors, streams) the browser policy: the page's own scripts and
styles only, never framed, no type sniffing, no referrer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import resource
import time
from collections.abc import Iterator
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader

from services.gateway.metrics import Metrics

log = logging.getLogger("agon.gateway")

#: Files the process keeps for itself beside client connections: Redis connections, the
#: page's files, logs (a quarter of the limit, at least this many).
RESERVED_FILES = 256
#: The most connections counted when the file limit is unlimited.
UNLIMITED_CAP = 65_536
#: How often an accept error may be logged.
ACCEPT_LOG_EVERY_S = 10.0

#: The page is plain ES modules and one style sheet from `/web/`; nothing inline, nothing
#: from elsewhere (the icon is a `data:` image). WebSockets go back to the same host.
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def secure_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the browser policy on every answer, whoever made it."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


# -- caps ------------------------------------------------------------------------------
def file_limit() -> int:
    """The process's soft limit on open files (RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNLIMITED_CAP if soft == resource.RLIM_INFINITY else int(soft)


def connection_cap(files: int, asked: int = 0) -> int:
    """Client connections allowed in all: `asked` (0: as many as fit), never more than the
    file limit leaves after its reserve."""
    fits = max(16, files - max(RESERVED_FILES, files // 4))
    return min(asked, fits) if asked > 0 else fits


#: Peer addresses whose `client_address` is remembered: it is asked on every request (rate
#: limits), and parsing an address costs more than the rest of the limit's work.
ADDRESSES_REMEMBERED = 4_096


@functools.lru_cache(maxsize=ADDRESSES_REMEMBERED)
def client_address(host: str) -> str:
    """Whom a peer address counts as: itself, or an IPv6 address's /64, which one host
    commonly holds whole (so a cap or quota per address is not one per /128)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def address_cap(total: int, asked: int) -> int:
    """Connections one address may hold: `asked` (0: no cap), never more than a quarter of
    `total`, so that one address can never fill the gateway by itself."""
    return min(asked, max(1, total // 4)) if asked > 0 else 0


class Door:
    """Counts open connections per client address and in all; admits below both caps
    (`per_address` 0: no cap per address, e.g. behind a proxy that is the only client)."""

    def __init__(self, total: int, per_address: int, metrics: Metrics | None = None) -> None:
        self.total = total
        self.per_address = per_address
        self.open = 0
        self.by_address: dict[str, int] = {}
        self.metrics = metrics

    def admit(self, address: str) -> bool:
        held = self.by_address.get(address, 0)
        if self.open >= self.total:
            self.refuse("total")
            return False
        if self.per_address and held >= self.per_address:
            self.refuse("per_address")
            return False
        self.open += 1
        self.by_address[address] = held + 1
        return True

    def leave(self, address: str) -> None:
        self.open -= 1
        held = self.by_address.pop(address, 1) - 1
        if held > 0:
            self.by_address[address] = held

    def refuse(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_refused.labels(reason=reason).inc()


# -- one connection --------------------------------------------------------------------
class GuardedHandler(web.RequestHandler):
    """aiohttp's connection protocol, admitted by the door and held to read deadlines.

    aiohttp itself closes a connection that stays silent (or idle after an answer) for
    its keep-alive timeout; it has no deadline for headers or a body that trickle in.
    Those are timed here from the bytes that arrive: the header clock starts at a
    request's first byte and stops when aiohttp has parsed its headers; the body clock
    then runs until its payload is complete. Upgraded connections (WebSockets) are left
    to their own heartbeats."""

    __slots__ = ("_address", "_admitted", "_body", "_deadlines", "_door", "_timer")

    def __init__(
        self, manager: web.Server, door: Door, deadlines: tuple[float, float], **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._door = door
        self._address = ""
        self._admitted = False
        self._deadlines = deadlines  # (headers, body), seconds
        self._timer: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self._address = client_address(str(peer[0])) if peer else ""
        if not self._door.admit(self._address):
            cast(asyncio.Transport, transport).abort()  # over a cap: no parsing, no log line
            return
        self._admitted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._admitted:
            return
        self._admitted = False
        self._door.leave(self._address)
        self._stop_clock()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._upgraded or self._payload_parser is not None:
            super().data_received(data)
            return
        parsed = self._request_count
        super().data_received(data)
        if self._request_count > parsed and self._messages:  # headers in
            self._stop_clock()
            payload = self._messages[-1][1]
            if isinstance(payload, StreamReader) and not payload.is_eof():
                self._body = payload
                self._start_clock(self._deadlines[1], "body_timeout")
        elif self._body is not None:
            if self._body.is_eof():
                self._body = None
                self._stop_clock()
        elif data and self._timer is None:
            self._start_clock(self._deadlines[0], "header_timeout")

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """A client that went away or sent no HTTP is one debug line, not a traceback."""
        exc = kw.get("exc_info")
        if isinstance(exc, (ConnectionError, HttpProcessingError)):
            log.debug("gateway: %s from %s: %s", type(exc).__name__, self._address, exc)
            return
        super().log_exception(*args, **kw)

    def _start_clock(self, seconds: float, reason: str) -> None:
        self._stop_clock()
        self._timer = self._loop.call_later(seconds, self._expire, reason)

    def _stop_clock(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, reason: str) -> None:
        self._timer = None
        self._door.refuse(reason)
        self.force_close()


def guarded_factory(
    server: web.Server,
    door: Door,
    *,
    idle_s: float,
    header_s: float,
    body_s: float,
    loop: asyncio.AbstractEventLoop,
) -> Any:
    """The protocol factory for `loop.create_server`: aiohttp's `Server` makes the request
    handling, each connection is a `GuardedHandler`."""

    def make() -> GuardedHandler:
        return GuardedHandler(
            server, door, (header_s, body_s), loop=loop, keepalive_timeout=idle_s,
            access_log=None,
        )  # fmt: skip

    return make


# -- accept errors ---------------------------------------------------------------------
class AcceptErrors:
    """A loop exception handler that logs accept failures (EMFILE, ENFILE...) in one line
    at most once per `every_s`, with how many were not logged; anything else goes on to
    the handler it replaced."""

    def __init__(self, previous: Any = None, every_s: float = ACCEPT_LOG_EVERY_S) -> None:
        self.previous = previous
        self.every_s = every_s
        self.last = -every_s
        self.unlogged = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not str(context.get("message", "")).startswith("socket.accept()"):
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self.last < self.every_s:
            self.unlogged += 1
            return
        more = f" ({self.unlogged} more since the last line)" if self.unlogged else ""
        log.warning("gateway: cannot accept a connection: %s%s", context.get("exception"), more)
        self.last, self.unlogged = now, 0


@contextlib.contextmanager
def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> Iterator[AcceptErrors]:
    """Throttle accept errors while the block runs (the loop's previous handler after)."""
    previous = loop.get_exception_handler()
    handler = AcceptErrors(previous)
    loop.set_exception_handler(handler)
    try:
        yield handler
    finally:
        loop.set_exception_handler(previous)
