"""Fault suite, fuzz: a flood of malformed, oversized and forged input while honest players play.

Honest drivers play Teeko through a command client as people do (tests/bus/test_failover.py's
`drive`), bots play bot-vs-bot games and a small tournament, and meanwhile Hypothesis makes
the bad input, the same on every run (`AGON_FAULTS=full`: 10,000 items; else 1,000, the
short form CI runs):

- entries XADDed straight into the partition command streams: random bytes, entries without
  the model's field, truncated msgpack, msgpack that is no map, maps of the wrong schema or
  with a field of the wrong type, commands with forged tokens (random, another seat's or
  another game's, a bot token of another game, the admin token's form under another secret),
  real tokens with stale or future seqs, unknown games, bad creations and imports, huge
  fields, entries over the size limits, and `reply_to` naming no reply stream (a log, the
  feed, a hash...), and forgeries sent with no reply address at all;
- HTTP requests to a gateway over real HTTP: random paths under /api, random, truncated and
  mutated bodies in all sorts of content types, moves and resignations with forged tokens,
  forged bearer keys, bodies over 1 MiB, bad query parameters, malformed HTTP on a raw
  socket, socket handshakes that must be refused;
- messages on live game sockets: garbage text, JSON of the wrong shape, forged moves and
  resignations, binary frames, messages over the size limit.

Afterwards: every honest game has ended (each driver plays its last game to the end, after
the flood), no acknowledged event is lost or doubled and no driver ever found its game moved
by someone else, `verify` finds nothing, every service still runs and every consumer of every
group belongs to a live process, each bad entry got exactly one of a rejection with a known
code, a dead letter or (sent with no reply address) nothing at all, not even a memory of its
refusal, no game but the
honest ones exists and no log holds an event of a forged command, the gateway answered every
request with a 4xx and every socket message with a refusal, and it still serves /health.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import random
import string
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack
import pytest
import redis.asyncio as aioredis
from aiohttp import ClientError, ClientTimeout, WSMsgType, WSServerHandshakeError
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bots.base import bot_names
from schemas.api import PingMessage, decode_client_message, decode_server_message
from schemas.base import new_command_id
from schemas.codec import FIELD, FIELD_BYTES, MAX_ENTRY_BYTES, MAX_IMPORT_BYTES, decode_reply
from schemas.commands import (
    Abort,
    ClaimTimeout,
    Command,
    CreateGame,
    ImportGame,
    PlayMove,
    Resign,
    SeatPlayer,
    SeatSpec,
)
from schemas.replies import Accepted, Rejected, Reply
from schemas.tokens import admin_token, bot_token
from schemas.tournaments import TournamentSpec, new_tournament_id
from services.bus.clients import CommandClient, QueryClient
from services.bus.keys import ENGINE_GROUP, Keys
from services.bus.presence import ALIVE_MS
from services.bus.secret import shared_secret
from services.bus.text import as_text, now_ms
from services.cli.pipeline import GameSpec, ServiceSet, create_games, wait_until_ended
from services.gateway.games import MAX_PAGE, MAX_PLY, PLIES_PER_PAGE
from services.projector import verify
from services.tournament.store import TournamentStore
from tests.support.faults import (
    FaultLine,
    Tally,
    beating,
    drive,
    group_consumers,
    lost_and_doubled,
    record,
    settle,
)
from tests.support.gateway import running_arena, until

FULL = os.environ.get("AGON_FAULTS") == "full"
TOTAL = 10_000 if FULL else 1_000
#: Shares of the total: entries XADDed into command streams, HTTP requests; the rest are
#: socket messages.
STREAM_SHARE, HTTP_SHARE = 0.55, 0.35
BOTS = ["random", "random.2", "random.3"]
BOT_GAMES: list[GameSpec] = [("teeko", {}), ("hexade", {}), ("overflow", {"size": "5"})]
DRIVERS = 3
#: Every forged command's id starts with this: no log may hold an event with such an id.
FORGED = "fz-"
#: Entries per pipeline; HTTP requests and sockets in flight at once.
BATCH, HTTP_AT_ONCE, SOCKETS_AT_ONCE = 25, 8, 2
#: Messages per socket (one over the size limit ends its socket sooner).
PER_SOCKET = 6
#: How long an answer may take before it counts as a hang (s).
ANSWER_S = 30.0
#: The reply streams the bad entries name (each must get its rejections, and only those).
REPLY_STREAMS = 4
#: How long the honest games may take to end once the flood is over (s).
WIND_DOWN_S = 300.0

pytestmark = pytest.mark.timeout(2400 if FULL else 900)

T = TypeVar("T")


# -- the bad input, as Hypothesis makes it ----------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """One bad item: its kind and the values drawn for it (resolved against the live games
    only when it is sent, since it may aim at games created meanwhile)."""

    kind: str
    args: tuple[Any, ...]


def examples(strategy: st.SearchStrategy[T], count: int) -> list[T]:
    """`count` examples of `strategy`, the same ones on every run (derandomized, no database)."""
    found: list[T] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def take(example: T) -> None:
        found.append(example)

    take()
    return found[:count]


def kind_plans(
    kinds: dict[str, tuple[int, st.SearchStrategy[tuple[Any, ...]]]], count: int
) -> list[Plan]:
    """`count` plans, the kinds in turn as often as their weights say (Hypothesis favours its
    first branches when it picks them itself), each kind's values drawn by Hypothesis."""
    turns = [name for name, (weight, _) in kinds.items() for _ in range(weight)]
    names = [turns[i % len(turns)] for i in range(count)]
    drawn = {name: examples(kinds[name][1], names.count(name)) for name in set(names)}
    short = {name: len(v) for name, v in drawn.items() if len(v) < names.count(name)}
    assert not short, f"Hypothesis made too few examples of {short}"
    taken = {name: iter(values) for name, values in drawn.items()}
    return [Plan(name, next(taken[name])) for name in names]


TEXT = st.text(max_size=40)
#: Text that may go into a header: printable Latin-1 without line breaks.
HEADER_TEXT = st.text(
    alphabet=string.ascii_letters + string.digits + string.punctuation + " éüßñ±°", max_size=40
)
ALNUM = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=12)
N = st.integers(0, 2**31)
WHERE = st.sampled_from(["human", "bot", "tournament", "unknown"])
KNOWN = st.sampled_from(["human", "bot", "tournament"])
TOKENS = st.sampled_from(["random", "other_seat", "other_game", "bot_of_other_game", "admin_like"])
#: Through the gateway a token chooses its seat, so another seat's token of the same game is
#: that seat's real token there: only tokens of no seat of the game are forgeries.
#: JSON may also carry a lone surrogate, which no msgpack map (no command) can hold.
GATEWAY_TOKENS = st.sampled_from(
    ["random", "other_game", "bot_of_other_game", "admin_like", "lone_surrogate"]
)
SEQS = st.sampled_from(["stale", "future", "any"])
SHAPES = (
    "play_move", "resign", "abort", "seat_player", "claim_timeout", "create_game", "import_game"
)  # fmt: skip
TOKEN_SHAPES = ("play_move", "resign", "abort", "seat_player")
#: The arguments of `forged`.
FORGERY = st.tuples(st.sampled_from(SHAPES), WHERE, N, TOKENS, TEXT, SEQS)
SCALAR = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20)
)  # fmt: skip
#: Anything msgpack packs (maps with text keys: the codec reads no other).
VALUE = st.recursive(
    SCALAR,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)  # fmt: skip
HUGE_FIELDS = ("token", "move", "name", "game_id", "command_id", "reply_to", "~junk")
BAD_ADDRESSES = (
    "log", "feed", "commands", "games", "processes", "dead", "prefix", "other_prefix",
    "partition_tagged", "random",
)  # fmt: skip
CREATE_DEFECTS = (
    "taken_id", "unknown_game", "unknown_option", "bad_option_value", "bad_bot_name",
    "seat_count", "negative_clock",
)  # fmt: skip

STREAM_KINDS: dict[str, tuple[int, st.SearchStrategy[tuple[Any, ...]]]] = {
    "random_bytes": (3, st.tuples(st.binary(max_size=300))),
    "no_field": (2, st.tuples(st.dictionaries(
        st.text(min_size=1, max_size=10).filter(lambda k: k != FIELD), st.binary(max_size=50),
        min_size=1, max_size=4,
    ))),
    "truncated": (3, st.tuples(FORGERY, N)),
    "not_a_map": (2, st.tuples(VALUE.filter(lambda v: not isinstance(v, dict)))),
    "wrong_schema": (3, st.tuples(
        st.sampled_from([*SHAPES, "~"]), st.dictionaries(st.text(max_size=12), VALUE, max_size=6),
        TEXT,
    )),
    "wrong_types": (4, st.tuples(FORGERY, N, VALUE)),
    "forged_token": (5, st.tuples(
        st.sampled_from(TOKEN_SHAPES), WHERE, N, TOKENS, TEXT, SEQS, st.booleans()
    )),
    "real_token_bad_seq": (3, st.tuples(KNOWN, N, st.sampled_from(["stale", "future"]), TEXT)),
    "unknown_game": (3, st.tuples(
        st.sampled_from([*TOKEN_SHAPES, "claim_timeout"]), N, TOKENS, TEXT, SEQS
    )),
    "bad_create": (3, st.tuples(st.sampled_from(CREATE_DEFECTS), N, TEXT)),
    "bad_import": (2, st.tuples(
        N,
        st.lists(st.dictionaries(st.text(max_size=12), VALUE, max_size=5), min_size=1, max_size=5),
        st.booleans(),
    )),
    "claim_timeout": (2, st.tuples(st.sampled_from(["human", "bot", "unknown"]), N, SEQS)),
    "huge_field": (2, st.tuples(FORGERY, st.sampled_from(HUGE_FIELDS), st.integers(300, 60_000))),
    "oversized": (1, st.tuples(
        st.sampled_from(["plain", "plain", "plain_no_reply", "import", "import_over"]),
        st.integers(1, 200_000), N,
    )),
    "bad_reply_to": (3, st.tuples(FORGERY, st.sampled_from(BAD_ADDRESSES), st.booleans())),
    "no_reply_to": (3, st.tuples(st.sampled_from(TOKEN_SHAPES), KNOWN, N, TOKENS, TEXT, SEQS)),
}  # fmt: skip

#: First segments of random paths under /api (followed by at least one random segment).
PATH_HEADS = ("games", "bots", "bot", "tournaments", "boards", "leaderboards", "catalogue", "~")
PATH_TAILS = ("", "moves", "resign", "events", "export", "plies", "standings.csv", "cancel")
#: A random segment: an id nobody has (reaching the handlers), or text no route takes. Never
#: a bare word, so that no random path is a route that answers 200.
SEGMENT = ALNUM.map(lambda s: "nx" + s) | st.text(max_size=12).map(lambda s: "~" + s)
BODY_ROUTES = ("create", "move", "resign", "bots", "import", "bot_move", "tournament")
BODY = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=300)),
    st.tuples(st.just("json"), JSON),
    st.tuples(st.just("cut"), N),
)
CONTENT_TYPES = (
    None, "application/json", "text/plain", "application/x-www-form-urlencoded",
    "application/msgpack", "multipart/form-data; boundary=zz", "application/json; charset=utf-16",
    "~/~",
)  # fmt: skip
MUTATIONS = (
    "create_unknown_game", "create_unknown_option", "create_unknown_bot", "create_seat_count",
    "create_extra", "create_wrong_type", "create_bad_clock", "move_no_token", "move_long",
    "move_negative_seq", "move_extra", "resign_empty_token", "bot_bad_name", "bot_extra",
    "bot_builtin", "tournament_unsigned",
)  # fmt: skip
BEARER_ROUTES = ("stream", "bot_move", "tournament", "cancel", "bot_socket")
AUTHS = (
    "none",
    "bearer_random",
    "bearer_latin1",
    "bearer_empty",
    "basic",
    "no_scheme",
    "admin_like",
    "bot_key_like",
)
QUERIES = (
    "limit", "status", "cursor", "long_game", "long_player", "ply", "from_ply", "to_ply",
    "since", "format", "socket_since",
)  # fmt: skip
RAW_SHAPES = (
    "junk", "bad_version", "long_header", "many_headers", "bad_header", "bad_length",
    "length_and_chunked", "bad_chunk", "long_url", "raw_admin_key", "raw_bot_key",
)  # fmt: skip

HTTP_KINDS: dict[str, tuple[int, st.SearchStrategy[tuple[Any, ...]]]] = {
    "random_path": (5, st.tuples(
        st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]), st.sampled_from(PATH_HEADS),
        st.lists(SEGMENT, min_size=1, max_size=3), st.sampled_from(PATH_TAILS),
    )),
    "bad_body": (5, st.tuples(
        st.sampled_from(BODY_ROUTES), KNOWN, N, BODY, st.sampled_from(CONTENT_TYPES)
    )),
    "mutated_body": (4, st.tuples(st.sampled_from(MUTATIONS), KNOWN, N, TEXT, JSON)),
    "forged_move": (4, st.tuples(
        st.sampled_from(["moves", "resign"]), KNOWN, N, GATEWAY_TOKENS, TEXT, st.integers(0, 10**6)
    )),
    "forged_bearer": (3, st.tuples(
        st.sampled_from(BEARER_ROUTES), st.sampled_from(AUTHS), HEADER_TEXT, KNOWN, N
    )),
    "oversized": (1, st.tuples(
        st.sampled_from(["create", "move", "resign", "bots", "import"]), KNOWN, N,
        st.integers(1, 65_536), st.booleans(),
    )),
    "bad_query": (4, st.tuples(st.sampled_from(QUERIES), KNOWN, N, TEXT)),
    "raw": (2, st.tuples(st.sampled_from(RAW_SHAPES), st.binary(max_size=200), N)),
    "socket_handshake": (1, st.tuples(
        st.sampled_from(["bot", "unknown_game", "bad_since"]), st.sampled_from(AUTHS), HEADER_TEXT,
        KNOWN, N,
    )),
}  # fmt: skip

SOCKET_KINDS: dict[str, tuple[int, st.SearchStrategy[tuple[Any, ...]]]] = {
    "text": (3, st.tuples(st.text(max_size=200))),
    "json": (3, st.tuples(JSON | st.fixed_dictionaries(
        {"type": st.sampled_from(["move", "resign", "ping", "event", "~"])},
        optional={"move": JSON, "seq": JSON, "token": JSON, "command_id": JSON, "~": JSON},
    ))),
    "forged_move": (3, st.tuples(GATEWAY_TOKENS, TEXT, N)),
    "forged_resign": (1, st.tuples(GATEWAY_TOKENS, TEXT, N)),
    "binary": (2, st.tuples(st.binary(max_size=200))),
    "oversized": (1, st.tuples(st.integers(16 * 1024 + 1, 64 * 1024))),
}  # fmt: skip


@dataclass
class Plans:
    stream: list[Plan]
    http: list[Plan]
    sockets: list[Plan]

    @classmethod
    def make(cls, total: int) -> Plans:
        streams, requests = round(total * STREAM_SHARE), round(total * HTTP_SHARE)
        return cls(
            kind_plans(STREAM_KINDS, streams),
            kind_plans(HTTP_KINDS, requests),
            kind_plans(SOCKET_KINDS, total - streams - requests),
        )

    def __len__(self) -> int:
        return len(self.stream) + len(self.http) + len(self.sockets)


# -- the honest side -------------------------------------------------------------------------
class Players(CommandClient):
    """The drivers' command client. It keeps every seat token the engine hands them (the
    forgeries use tokens of other seats and games), and once `closing` is set it holds a
    driver that starts a new game, so that every game a driver began is played to its end."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        super().__init__(redis, keys, name="fuzz-players", timeout_s=1.0)
        self.tokens: dict[tuple[str, int], str] = {}
        #: (game, token) in the order the seats were taken
        self.token_list: list[tuple[str, str]] = []
        self.created: list[str] = []
        self.closing = asyncio.Event()
        self.parked = 0
        self._sent: set[str] = set()

    async def submit(self, command: Command, *, timeout_s: float | None = None) -> Reply:
        if isinstance(command, CreateGame):
            # A create sent before (its reply was late) is a game begun: it goes through.
            if self.closing.is_set() and command.command_id not in self._sent:
                self.parked += 1
                await asyncio.get_running_loop().create_future()  # until cancelled
            if command.command_id not in self._sent:
                self.created.append(command.game_id)
        self._sent.add(command.command_id)
        reply = await super().submit(command, timeout_s=timeout_s)
        if isinstance(command, SeatPlayer) and isinstance(reply, Accepted) and reply.token:
            self.tokens[command.game_id, command.seat] = reply.token
            self.token_list.append((command.game_id, reply.token))
        return reply

    def seated(self) -> list[str]:
        """The drivers' games whose two seats are taken (so no forgery can take one)."""
        return [g for g in self.created if (g, 1) in self.tokens and (g, 2) in self.tokens]


@dataclass
class World:
    """What the flood knows of the honest games, to aim its forgeries at them."""

    keys: Keys
    secret: bytes
    players: Players
    bot_games: list[str]
    tournament_games: list[str] = field(default_factory=list)
    tournament_id: str = ""

    def game(self, where: str, n: int) -> str:
        """A game of that kind (another honest one if there is none yet), or one nobody has."""
        if where != "unknown":
            pools = {"human": self.players.seated(), "bot": self.bot_games}
            pools["tournament"] = self.tournament_games
            for pool in (pools[where], self.bot_games, pools["human"]):
                if pool:
                    return pool[n % len(pool)]
        return f"nx{n}"

    def token(self, how: str, text: str, n: int, game_id: str, seat: int) -> str:
        """A token that is not `seat`'s of `game_id`."""
        if how == "other_seat" and seat in (1, 2):
            other = self.players.tokens.get((game_id, 3 - seat))
            if other is not None:
                return other
            if game_id in self.bot_games or game_id in self.tournament_games:
                return bot_token(self.secret, game_id, 3 - seat)
        elif how == "other_game":
            pool = [t for g, t in self.players.token_list if g != game_id]
            if pool:
                return pool[n % len(pool)]
        elif how == "bot_of_other_game":
            others = [g for g in self.bot_games + self.tournament_games if g != game_id]
            if others:
                return bot_token(self.secret, others[n % len(others)], 1 + n % 2)
        elif how == "admin_like":
            return admin_token(b"not the secret " + text.encode())  # its form, another secret
        elif how == "lone_surrogate":
            return f"\udc80{text}"[:256]
        return text[:256]

    @staticmethod
    def seq(how: str, n: int) -> int:
        """A seq: long gone (the seats were taken after it), never reached, or anything."""
        return {"stale": 1 + n % 2, "future": 10**6 + n}.get(how, n)

    def real_token(self, game_id: str, seat: int) -> str:
        return self.players.tokens.get((game_id, seat)) or bot_token(self.secret, game_id, seat)


SEATS = [SeatSpec(kind="human"), SeatSpec(kind="bot", name="random")]


def forged(
    world: World,
    command_id: str,
    reply_to: str,
    shape: str,
    where: str,
    n: int,
    how: str,
    text: str,
    seq: str,
    *,
    mutable: bool = False,
) -> Command:
    """A command that decodes and that the engine must refuse: its token is of no seat it
    names, its game is unknown or its seats are taken, its creation or import is bad."""
    if mutable and how == "other_seat":
        how = "random"  # a mutated seat number would make another seat's token the right one
    if shape == "claim_timeout" and where == "tournament":
        where = "bot"  # tournament games have clocks: a claim may be due there
    game_id = world.game(where, n)
    seat = n % 3 if shape == "abort" else 1 + n % 2
    token = world.token(how, text, n, game_id, seat)
    head: dict[str, Any] = {"command_id": command_id, "reply_to": reply_to}
    if shape == "play_move":
        move = text[:32] or "A1"
        return PlayMove(**head, game_id=game_id, seat=seat, token=token, move=move,
                        expected_seq=world.seq(seq, n))  # fmt: skip
    if shape == "resign":
        return Resign(**head, game_id=game_id, seat=seat, token=token)
    if shape == "abort":
        reason = ("aborted", "interrupted", "no_reply")[n % 3]
        return Abort(**head, game_id=game_id, seat=seat, token=token, reason=reason)
    if shape == "seat_player":
        return SeatPlayer(**head, game_id=game_id, seat=seat, name=text[:64])
    if shape == "claim_timeout":
        return ClaimTimeout(**head, game_id=game_id, expected_seq=world.seq(seq, n))
    if shape == "create_game":
        # Two faults, so that no single mutation makes it a good creation: the id is taken,
        # and nobody knows the game.
        taken = world.game("bot", n)
        return CreateGame(**head, game_id=taken, game=f"no-such-{text}"[:64], seats=SEATS)
    events = [{"type": "game_created", "seq": 1, "junk": text}]
    return ImportGame(**head, game_id=f"nx{n}", events=events)


# -- entries into the command streams ---------------------------------------------------------
@dataclass
class Sent:
    """An entry XADDed and what must come of it: `reply` (a rejection carrying `reply_id`,
    "" when its id cannot be read), `dead` (a dead letter, and no reply to `reply_id`) or
    `unanswered` (sent with no reply address: refused, with no reply and no reply memory)."""

    kind: str
    stream: str
    fields: dict[Any, Any]
    expect: str
    reply_id: str = ""
    game_id: str = ""
    entry_id: str = ""


def stream_entry(world: World, i: int, plan: Plan) -> Sent:
    keys, kind, a = world.keys, plan.kind, plan.args
    cid = f"{FORGED}{i}"
    reply_to = keys.reply_stream(f"fuzz-{i % REPLY_STREAMS}")
    anywhere = keys.commands(i % keys.partitions)

    def of(command: Command | dict[str, Any], expect: str = "reply", **more: Any) -> Sent:
        body = command.model_dump() if not isinstance(command, dict) else command
        game_id = body.get("game_id")
        stream = keys.commands_for(game_id) if isinstance(game_id, str) else anywhere
        data = msgpack.packb(body, use_bin_type=True)
        return Sent(kind, stream, {FIELD: data}, expect, **({"reply_id": cid} | more))

    if kind == "random_bytes":
        return Sent(kind, anywhere, {FIELD: a[0]}, "dead")
    if kind == "no_field":
        return Sent(kind, anywhere, a[0], "dead")
    if kind == "not_a_map":
        return Sent(kind, anywhere, {FIELD: msgpack.packb(a[0], use_bin_type=True)}, "dead")
    if kind == "truncated":  # a proper prefix of a map never unpacks
        sent = of(forged(world, cid, reply_to, *a[0]), "dead")
        data = sent.fields[FIELD]
        sent.fields = {FIELD: data[: a[1] % len(data)]}
        return sent
    if kind == "wrong_schema":  # an unknown type, or a field no command has
        return of({**a[1], "type": a[0], "command_id": cid, "reply_to": reply_to, f"~{a[2]}": 1})
    if kind == "wrong_types":
        body = forged(world, cid, reply_to, *a[0], mutable=True).model_dump()
        names = sorted(set(body) - {"command_id", "reply_to"})
        body[names[a[1] % len(names)]] = a[2]
        return of(body)
    if kind == "forged_token":
        sent = of(forged(world, cid, reply_to, *a[:6]))
        if a[6]:
            sent.stream = anywhere  # a stream of another partition than its game's
        return sent
    if kind == "real_token_bad_seq":
        where, n, seq, text = a
        game_id, seat = world.game(where, n), 1 + n % 2
        return of(PlayMove(command_id=cid, reply_to=reply_to, game_id=game_id, seat=seat,
                           token=world.real_token(game_id, seat), move=text[:32] or "A1",
                           expected_seq=world.seq(seq, n)))  # fmt: skip
    if kind == "unknown_game":
        shape, n, how, text, seq = a
        return of(forged(world, cid, reply_to, shape, "unknown", n, how, text, seq))
    if kind == "bad_create":
        return of(bad_creation(world, cid, reply_to, *a))
    if kind == "bad_import":
        n, events, as_list = a
        body = ImportGame(command_id=cid, reply_to=reply_to, game_id=f"nx{n}", events=events)
        dumped = body.model_dump()
        if not as_list:
            dumped["events"] = events[0]
        return of(dumped)
    if kind == "claim_timeout":
        where, n, seq = a
        return of(forged(world, cid, reply_to, "claim_timeout", where, n, "random", "", seq))
    if kind == "huge_field":
        body = forged(world, cid, reply_to, *a[0], mutable=True).model_dump()
        body[a[1]] = "x" * a[2]
        if a[1] == "reply_to":  # no readable address: set aside
            return of(body, "dead")
        return of(body, reply_id="" if a[1] == "command_id" else cid)
    if kind == "oversized":
        return oversized_entry(world, i, cid, reply_to, *a)
    if kind == "bad_reply_to":
        forgery, target, decodable = a
        address = bad_address(world, target, forgery[2], forgery[4])
        if decodable:
            return of(forged(world, cid, address, *forgery), "dead")
        return of({"type": "~", "command_id": cid, "reply_to": address}, "dead")
    if kind == "no_reply_to":
        command = forged(world, cid, "", *a)
        return of(command, "unanswered", game_id=command.game_id)
    raise AssertionError(f"no stream kind {kind}")


def bad_creation(world: World, cid: str, reply_to: str, defect: str, n: int, text: str) -> Any:
    body = CreateGame(command_id=cid, reply_to=reply_to, game_id=f"nx{n}", game="teeko",
                      seats=SEATS).model_dump()  # fmt: skip
    if defect == "taken_id":
        body["game_id"] = world.game("human" if n % 2 else "bot", n)
    elif defect == "unknown_game":
        body["game"] = f"no-such-{text}"[:64]
    elif defect == "unknown_option":
        body["options"] = {f"zz{text}": "1"}
    elif defect == "bad_option_value":
        body["game"], body["options"] = "overflow", {"size": f"~{text}"}
    elif defect == "bad_bot_name":
        body["seats"] = [{"kind": "bot", "name": f"~{text}"}, {"kind": "human", "name": ""}]
    elif defect == "seat_count":
        body["seats"] = (body["seats"] * 2)[: (0, 1, 3)[n % 3]]
    else:
        body["move_time_ms"] = -1 - n
    return body


def oversized_entry(
    world: World, i: int, cid: str, reply_to: str, variant: str, extra: int, seed: int
) -> Sent:
    """Over `MAX_ENTRY_BYTES` (`too_large`), but for an import up to `MAX_IMPORT_BYTES`,
    which is read (and refused for what it holds); over that, `too_large` again."""
    size = (
        (MAX_IMPORT_BYTES + extra % 100_000)
        if variant == "import_over"
        else MAX_ENTRY_BYTES + extra
    )
    pad = random.Random(seed).randbytes(size)
    body: dict[str, Any] = {"type": "play_move", "command_id": cid, "reply_to": reply_to}
    if variant.startswith("import"):
        body.update(type="import_game", game_id=f"nx{seed}", events=[{"pad": pad}])
    else:
        body["pad"] = pad
    expect = "reply"
    if variant == "plain_no_reply":
        del body["reply_to"]
        expect = "dead"
    data = msgpack.packb(body, use_bin_type=True)
    stream = world.keys.commands(i % world.keys.partitions)
    return Sent("oversized", stream, {FIELD: data}, expect, cid)


def bad_address(world: World, target: str, n: int, text: str) -> str:
    """A `reply_to` that names no reply stream: the engine must write nothing there."""
    keys, p = world.keys, n % world.keys.partitions
    return {
        "log": keys.log(world.game("bot", n)),
        "feed": keys.feed(p),
        "commands": keys.commands(p),
        "games": keys.games(p),
        "processes": keys.processes(),
        "dead": keys.dead_letter(p),
        "prefix": keys.reply_stream(""),
        "other_prefix": f"other:replies:{n}",
        "partition_tagged": f"{keys.prefix}:{{{p}}}:replies:{n}",
        "random": f"~{text}",
    }[target]


async def flood_streams(redis: aioredis.Redis, world: World, plans: list[Plan]) -> list[Sent]:
    """XADD every planned entry straight into the command streams, in small pipelines."""
    sent: list[Sent] = []
    for start in range(0, len(plans), BATCH):
        batch = [
            stream_entry(world, start + j, p) for j, p in enumerate(plans[start : start + BATCH])
        ]
        pipe = redis.pipeline(transaction=False)
        for s in batch:
            pipe.xadd(s.stream, s.fields)
        for s, entry_id in zip(batch, await pipe.execute(), strict=True):
            s.entry_id = as_text(entry_id)
            s.fields = {}  # what was sent is no longer needed (some are a megabyte)
        sent.extend(batch)
        await asyncio.sleep(0.005)
    return sent


async def stream_outcomes(
    redis: aioredis.Redis, keys: Keys, sent: list[Sent]
) -> tuple[Counter[str], list[str]]:
    """What came of each entry: (outcomes by kind, problems). Each must have exactly the one
    outcome expected of it, and nothing else may be in the reply streams or dead letters."""
    replies: dict[str, list[Reply]] = {}
    problems: list[str] = []
    for k in range(REPLY_STREAMS):
        for _, fields in await redis.xrange(keys.reply_stream(f"fuzz-{k}")):
            reply = decode_reply(fields[FIELD_BYTES])  # a code outside the closed set fails here
            replies.setdefault(reply.command_id, []).append(reply)
    dead: dict[tuple[str, str], str] = {}
    for p in keys.all_partitions():
        for _, fields in await redis.xrange(keys.dead_letter(p)):
            where = (as_text(fields[b"stream"]), as_text(fields[b"id"]))
            dead[where] = as_text(fields[b"reason"])
    mine = {(s.stream, s.entry_id) for s in sent}
    if foreign := [reason for where, reason in dead.items() if where not in mine]:
        problems.append(f"{len(foreign)} entries not sent here were dead-lettered: {foreign[:3]}")
    if await redis.xlen(keys.reader_dead_letter()):
        problems.append("readers set entries aside (a reply written where readers read?)")
    outcomes: Counter[str] = Counter()
    anonymous = 0
    for s in sent:
        in_dead = (s.stream, s.entry_id) in dead
        got = replies.get(s.reply_id, []) if s.reply_id else []
        if s.expect == "dead":
            ok, outcome = in_dead and not got, "dead-lettered"
        elif s.expect == "reply":
            anonymous += not s.reply_id
            ok = not in_dead and (len(got) == 1 or not s.reply_id)
            outcome = f"refused {got[0].code}" if len(got) == 1 else "refused (no id)"
            ok = ok and all(isinstance(r, Rejected) for r in got)
        else:  # refused with nobody to tell: a refusal is never remembered
            memory = await redis.hkeys(keys.replies_memory(s.game_id))
            kept = [k for k in memory if k.decode().partition(" ")[2] == s.reply_id]
            ok = not in_dead and not got and not kept
            outcome = "refused, unanswered"
        outcomes[outcome] += 1
        if not ok:
            problems.append(
                f"{s.kind} entry {s.entry_id}: expected {s.expect}, dead={in_dead}, replies={got}"
            )
    unread = replies.get("", [])
    if len(unread) != anonymous:
        problems.append(f"{len(unread)} replies without an id, {anonymous} expected")
    expected_ids = {s.reply_id for s in sent if s.expect == "reply" and s.reply_id}
    strays = sum(len(v) for cid, v in replies.items() if cid and cid not in expected_ids)
    if strays:
        problems.append(f"{strays} replies to entries that must have none")
    for p in keys.all_partitions():
        pending = (await redis.xpending(keys.commands(p), ENGINE_GROUP))["pending"]
        if pending:
            problems.append(f"{pending} command entries still pending in partition {p}")
    return outcomes, problems


# -- HTTP requests ---------------------------------------------------------------------------
@dataclass
class Request:
    kind: str
    method: str = "GET"
    path: str = "/"
    params: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    chunked: bool = False
    raw: bytes | None = None
    socket: bool = False


def route_body(world: World, route: str, where: str, n: int) -> tuple[str, Any]:
    """A route that reads a body, and a body of the right shape (that must still fail)."""
    game_id = world.game(where, n)
    return {
        "create": ("/api/games", {"game": "teeko", "seats": [{"human": {}}, {"bot": "random"}]}),
        "move": (f"/api/games/{game_id}/moves", {"move": "A1", "seq": 3, "token": "forged"}),
        "resign": (f"/api/games/{game_id}/resign", {"token": "forged"}),
        "bots": ("/api/bots", {"name": f"nx{n}"}),
        "import": ("/api/games/import", {"type": "game_created", "seq": 1}),
        "bot_move": (f"/api/bot/games/{game_id}/moves", {"move": "A1", "seq": 3}),
        "tournament": ("/api/tournaments", TOURNAMENT),
    }[route]


TOURNAMENT = {"format": "round-robin", "game": "teeko", "bots": ["random", "random.2"]}


def auth_header(auth: str, text: str) -> dict[str, str]:
    value = {
        "none": None,
        "bearer_random": f"Bearer {text}",
        "bearer_latin1": f"Bearer \u00e9{text}",  # a key beyond ASCII, as HTTP allows
        "bearer_empty": "Bearer ",
        "basic": "Basic " + base64.b64encode(text.encode()).decode(),
        "no_scheme": text,
        "admin_like": "Bearer " + admin_token(b"not the secret " + text.encode()),
        "bot_key_like": f"Bearer agon_{text}",
    }[auth]
    return {} if value is None else {"Authorization": value}


#: A forged body declares itself JSON, so that it reaches the checks behind the gateway's 415.
JSON_BODY = {"Content-Type": "application/json"}


def http_request(world: World, i: int, plan: Plan) -> Request:
    kind, a = plan.kind, plan.args
    if kind == "random_path":
        method, head, segments, tail = a
        path = "/api/" + "/".join([head, *segments, *([tail] if tail else [])])
        return Request(kind, method, path)
    if kind == "bad_body":
        route, where, n, (how, body), content_type = a
        path, good = route_body(world, route, where, n)
        if how == "bytes":
            data = body
        elif how == "json":
            if route == "bots" and isinstance(body, dict):
                body = {**body, "~": 1}  # a random {"name": ...} would register a bot
            data = json.dumps(body).encode()
        else:  # a proper prefix of an object is never JSON
            text = json.dumps(good).encode()
            data = text[: body % len(text)]
        headers = {"Content-Type": content_type} if content_type else {}
        return Request(kind, "POST", path, headers=headers, body=data)
    if kind == "mutated_body":
        path, body = mutated(world, *a)
        return Request(kind, "POST", path, body=json.dumps(body).encode(), headers=JSON_BODY)
    if kind == "forged_move":
        action, where, n, how, text, seq = a
        game_id = world.game(where, n)
        token = world.token(how, text, n, game_id, 0) or "x"
        body: dict[str, Any] = {"token": token, "command_id": f"{FORGED}h{i}"}
        if action == "moves":
            body.update(move=text[:32] or "A1", seq=seq)
        return Request(kind, "POST", f"/api/games/{game_id}/{action}", headers=JSON_BODY,
                       body=json.dumps(body).encode())  # fmt: skip
    if kind == "forged_bearer":
        route, auth, text, where, n = a
        headers = auth_header(auth, text)
        game_id = world.game(where, n)
        method, path, body = {
            "stream": ("GET", "/api/bot/stream", None),
            "bot_move": ("POST", f"/api/bot/games/{game_id}/moves", {"move": "A1", "seq": 3}),
            "tournament": ("POST", "/api/tournaments", TOURNAMENT),
            "cancel": ("POST", f"/api/tournaments/{world.tournament_id}/cancel", None),
            "bot_socket": ("GET", "/ws/bot", None),
        }[route]
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers = {**headers, **JSON_BODY}
        return Request(kind, method, path, headers=headers, body=data)
    if kind == "oversized":
        route, where, n, extra, chunked = a
        path, _ = route_body(world, route, where, n)
        size = (1 << 20) + extra
        return Request(kind, "POST", path, body=b"x" * size, chunked=chunked)
    if kind == "bad_query":
        return bad_query(world, *a)
    if kind == "raw":
        return Request(kind, raw=raw_request(*a))
    if kind == "socket_handshake":
        variant, auth, text, where, n = a
        if variant == "bot":
            return Request(kind, path="/ws/bot", headers=auth_header(auth, text), socket=True)
        if variant == "unknown_game":
            return Request(kind, path=f"/ws/games/nx{n}", socket=True)
        return Request(kind, path=f"/ws/games/{world.game(where, n)}", params={"since": f"~{text}"},
                       socket=True)  # fmt: skip
    raise AssertionError(f"no HTTP kind {kind}")


def mutated(
    world: World, mutation: str, where: str, n: int, text: str, value: Any
) -> tuple[str, Any]:
    """A body of the right shape with one fault that every gateway must refuse."""
    seats: list[Any] = [{"human": {}}, {"bot": "random"}]
    create: dict[str, Any] = {"game": "teeko", "seats": seats}
    game_id = world.game(where, n)
    move: dict[str, Any] = {"move": "A1", "seq": n, "token": "x"}
    cases: dict[str, tuple[str, Any]] = {
        "create_unknown_game": ("/api/games", {**create, "game": f"no-such-{text}"[:64]}),
        "create_unknown_option": ("/api/games", {**create, "options": {f"zz{text}"[:32]: "1"}}),
        "create_unknown_bot": ("/api/games", {**create, "seats": [seats[0], {"bot": f"nobot{n}"}]}),
        "create_seat_count": ("/api/games", {**create, "seats": (seats * 2)[: (0, 1, 3)[n % 3]]}),
        "create_extra": ("/api/games", {**create, f"~{text}": value}),
        "create_wrong_type": ("/api/games", {**create, **[
            {"game": [value]}, {"seats": {"~": value}}, {"move_time": f"~{text}"},
            {"seed": f"~{text}"},
        ][n % 4]}),
        "create_bad_clock": ("/api/games", {**create, "move_time": (0, -1 - n, 86_401 + n)[n % 3]}),
        "move_no_token": (f"/api/games/{game_id}/moves", {"move": "A1", "seq": n}),
        "move_long": (f"/api/games/{game_id}/moves", {**move, "move": "A" * 33 + text}),
        "move_negative_seq": (f"/api/games/{game_id}/moves", {**move, "seq": -1 - n}),
        "move_extra": (f"/api/games/{game_id}/moves", {**move, f"~{text}": value}),
        "resign_empty_token": (f"/api/games/{game_id}/resign", {"token": ""}),
        "bot_bad_name": ("/api/bots", {"name": (f"~{text}", "", "b" * (65 + n % 100))[n % 3]}),
        "bot_extra": ("/api/bots", {"name": f"nx{n}", f"~{text}": value}),
        "bot_builtin": ("/api/bots", {"name": bot_names()[n % len(bot_names())]}),
        "tournament_unsigned": ("/api/tournaments", TOURNAMENT),
    }  # fmt: skip
    return cases[mutation]


def bad_query(world: World, case: str, where: str, n: int, text: str) -> Request:
    game = f"/api/games/{world.game(where, n)}"

    def bad_int(lo: int, hi: int) -> str:
        return (f"~{text}", str(lo - 1 - n), str(hi + 1 + n))[n % 3]

    path, name, value = {
        "limit": ("/api/games", "limit", bad_int(1, MAX_PAGE)),
        "status": ("/api/games", "status", f"~{text}"),
        "cursor": ("/api/games", "cursor", f"~{text}"),
        "long_game": ("/api/games", "game", "g" * (65 + n % 200)),
        "long_player": ("/api/games", "player", "p" * (65 + n % 200)),
        "ply": (game, "ply", bad_int(0, MAX_PLY)),
        "from_ply": (f"{game}/plies", "from_ply", bad_int(0, MAX_PLY)),
        "to_ply": (f"{game}/plies", "to_ply", bad_int(0, PLIES_PER_PAGE - 1)),
        "since": (f"{game}/events", "since", bad_int(0, 1 << 40)),
        "format": (f"{game}/export", "format", f"~{text}"),
        "socket_since": (game.replace("/api/", "/ws/"), "since", bad_int(0, 1 << 40)),
    }[case]
    return Request("bad_query", "GET", path, params={name: value})


def raw_request(shape: str, junk: bytes, n: int) -> bytes:
    """Bytes on a socket that are no HTTP request the server may serve (its path, if one is
    read at all, is no route)."""
    line = junk.replace(b"\r", b"").replace(b"\n", b"")
    host = b"Host: fuzz\r\n"
    get = b"GET /api/~ HTTP/1.1\r\n" + host
    return {
        "junk": b"\x00" + junk + b"\r\n\r\n",
        "bad_version": b"GET /api/~ HTTP/7." + str(n % 10).encode() + b"\r\n" + host + b"\r\n",
        "long_header": get + b"X-J: " + b"a" * (8191 + n % 20_000) + b"\r\n\r\n",
        "many_headers": get + b"X-J: v\r\n" * (200 + n % 300) + b"\r\n",
        "bad_header": get + b"B@d Header " + line + b"\r\n\r\n",
        "bad_length": b"POST /api/games HTTP/1.1\r\n" + host + b"Content-Length: ~" + line[:50]
        + b"\r\n\r\n",
        "length_and_chunked": b"POST /api/games HTTP/1.1\r\n" + host
        + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc",
        "bad_chunk": b"POST /api/games HTTP/1.1\r\n" + host
        + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + line + b"\r\n0\r\n\r\n",
        "long_url": b"GET /api/" + b"a" * (8200 + n % 10_000) + b" HTTP/1.1\r\n" + host + b"\r\n",
        # bytes beyond ASCII in a bearer key, which no client library would send
        "raw_admin_key": b"POST /api/tournaments/" + str(n).encode() + b"/cancel HTTP/1.1\r\n"
        + host + b"Authorization: Bearer \xc3\xa9" + line + b"\r\nContent-Length: 0\r\n\r\n",
        "raw_bot_key": b"GET /api/bot/stream HTTP/1.1\r\n" + host
        + b"Authorization: Bearer \xe2\x82\xac" + line + b"\r\n\r\n",
    }[shape]  # fmt: skip


async def send_request(client: TestClient, req: Request) -> str:
    """The status the gateway answered with, or what happened instead."""
    timeout = ClientTimeout(total=ANSWER_S)
    try:
        if req.raw is not None:
            return await raw_status(client, req.raw)
        if req.socket:
            try:
                async with asyncio.timeout(ANSWER_S):
                    async with client.ws_connect(req.path, params=req.params, headers=req.headers):
                        return "101 (a socket opened)"
            except WSServerHandshakeError as exc:
                return str(exc.status)
        data: Any = req.body
        if req.chunked and data is not None:
            data = chunks(data)
        elif data is not None and len(data) > 1 << 16:
            data = io.BytesIO(data)  # with its length, without holding up the event loop
        async with client.session.request(
            req.method, client.make_url(req.path), params=req.params, headers=req.headers,
            data=data, timeout=timeout,
        ) as resp:  # fmt: skip
            await resp.read()
            return str(resp.status)
    except TimeoutError:
        return "hang"
    except ClientError as exc:
        return f"no answer ({type(exc).__name__})"


async def chunks(data: bytes) -> Any:
    for at in range(0, len(data), 1 << 16):
        yield data[at : at + (1 << 16)]


async def raw_status(client: TestClient, data: bytes) -> str:
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(data)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        line = await asyncio.wait_for(reader.readline(), ANSWER_S)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    parts = line.split()
    return as_text(parts[1]) if len(parts) > 1 and line.startswith(b"HTTP/") else "closed"


async def flood_http(
    client: TestClient, world: World, plans: list[Plan]
) -> Counter[tuple[str, str]]:
    """Every planned request, `HTTP_AT_ONCE` at a time; (kind, status) counted."""
    answers: Counter[tuple[str, str]] = Counter()
    todo = iter(enumerate(plans))

    async def worker() -> None:
        for i, plan in todo:
            req = http_request(world, i, plan)
            answers[req.kind, await send_request(client, req)] += 1

    await asyncio.gather(*(worker() for _ in range(HTTP_AT_ONCE)))
    return answers


# -- socket messages -------------------------------------------------------------------------
def socket_message(world: World, i: int, plan: Plan, game_id: str) -> tuple[str, str | bytes]:
    """(how to send it, what): "text", "binary" or "oversized"."""
    kind, a = plan.kind, plan.args
    if kind == "binary":
        return "binary", a[0]
    if kind == "oversized":
        return "oversized", "x" * a[0]
    if kind in ("forged_move", "forged_resign"):
        how, text, n = a
        message: dict[str, Any] = {
            "type": "move" if kind == "forged_move" else "resign",
            "token": world.token(how, text, n, game_id, 0) or "x",
            "command_id": f"{FORGED}w{i}",
        }
        if kind == "forged_move":
            message.update(move=text[:32] or "A1", seq=n % 10**6)
        return "text", json.dumps(message)
    text = a[0] if kind == "text" else json.dumps(a[0])
    try:
        if isinstance(decode_client_message(text), PingMessage):
            text = "~" + text  # a ping is answered with a ping: garbage, not a ping
    except ValueError:
        pass
    return "text", text


async def socket_session(
    client: TestClient, world: World, s: int, messages: list[tuple[int, Plan]]
) -> Counter[str]:
    """One socket on an honest game: every message answered with a refusal, and one over the
    size limit (always the last) closes the socket (1009, or 1006 when the drop resets)."""
    outcomes: Counter[str] = Counter()
    game_id = world.game(("human", "bot", "tournament")[s % 3], s)
    sends = [socket_message(world, i, plan, game_id) for i, plan in messages]
    try:
        async with (
            asyncio.timeout(ANSWER_S * (2 + len(sends))),
            client.ws_connect(f"/ws/games/{game_id}", params={"since": str(s % 40)}) as ws,
        ):
            normal = [(how, what) for how, what in sends if how != "oversized"]
            for how, what in normal:
                if how == "binary":
                    await ws.send_bytes(bytes(what) if isinstance(what, bytes) else what.encode())
                else:
                    await ws.send_str(str(what))
            answered = 0
            while answered < len(normal):
                msg = await ws.receive(timeout=ANSWER_S)
                if msg.type != WSMsgType.TEXT:
                    break
                got = decode_server_message(msg.data)
                if got.type == "error":
                    outcomes[f"error {got.code}"] += 1
                elif got.type == "reply":
                    outcomes[f"refused {got.code}" if not got.ok else "ACCEPTED"] += 1
                else:
                    continue  # the game's own events
                answered += 1
            if answered < len(normal):
                outcomes["unanswered"] += len(normal) - answered
            if len(normal) < len(sends):
                await ws.send_str(str(sends[-1][1]))
                while not ws.closed:
                    msg = await ws.receive(timeout=ANSWER_S)
                    if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.ERROR):
                        break
                outcomes[f"closed {ws.close_code}"] += 1
    except TimeoutError:
        outcomes["hang"] += len(sends) - sum(outcomes.values())
    except WSServerHandshakeError as exc:
        outcomes[f"unanswered (socket refused: {exc.status})"] += len(sends)
    return outcomes


async def flood_sockets(client: TestClient, world: World, plans: list[Plan]) -> Counter[str]:
    sessions: list[list[tuple[int, Plan]]] = [[]]
    for i, plan in enumerate(plans):
        sessions[-1].append((i, plan))
        if plan.kind == "oversized" or len(sessions[-1]) == PER_SOCKET:
            sessions.append([])
    todo = iter(enumerate(s for s in sessions if s))
    outcomes: Counter[str] = Counter()

    async def worker() -> None:
        for s, session in todo:
            outcomes.update(await socket_session(client, world, s, session))

    await asyncio.gather(*(worker() for _ in range(SOCKETS_AT_ONCE)))
    return outcomes


# -- what must hold afterwards -----------------------------------------------------------------
async def dead_consumers(redis: aioredis.Redis, keys: Keys, services: ServiceSet) -> list[str]:
    """Service tasks that ended, services without a fresh heartbeat, and consumers in any group
    whose process does not beat (`Keys.processes`)."""
    alive = await beating(redis, keys, ALIVE_MS)
    dead = [f"a service ended: {services.failed()!r}"] if services.failed() is not None else []
    names = [s.reader.consumer for s in services.services()]
    names += [services.director.name] if services.director is not None else []
    dead += [f"{name} does not beat" for name in names if name not in alive]
    for stream, group, c in await group_consumers(redis, keys, BOTS):
        if isinstance(c, Exception):
            dead.append(f"group {group} of {stream}: {c}")
        elif c["name"] not in alive:
            dead.append(f"{c['name']} in group {group} of {stream}")
    return dead


async def engine_idle(redis: aioredis.Redis, keys: Keys) -> bool:
    """Whether every command entry was delivered to the engine and acknowledged."""
    for p in keys.all_partitions():
        for g in await redis.xinfo_groups(keys.commands(p)):
            if as_text(g["name"]) == ENGINE_GROUP and (g["pending"] or g.get("lag")):
                return False
    return True


async def forged_events(redis: aioredis.Redis, keys: Keys, game_ids: Iterable[str]) -> int:
    """Events in these logs that a forged command (by its id) brought about."""
    query, found = QueryClient(redis, keys), 0
    for gid in game_ids:
        for entry in await query.log(gid):
            found += str(msgpack.unpackb(entry.data).get("command_id", "")).startswith(FORGED)
    return found


def kinds(plans: list[Plan]) -> str:
    return counts(Counter(p.kind for p in plans))


def counts(counter: Counter[Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counter.items(), key=lambda kv: str(kv[0])))


# -- the scenario -------------------------------------------------------------------------------
@dataclass
class Honest:
    """The honest side: drivers playing Teeko through `Players`, bot games started every
    quarter second while the flood lasts, and a tournament the arena's director runs."""

    redis: aioredis.Redis
    keys: Keys
    world: World
    store: TournamentStore
    tally: Tally = field(default_factory=Tally)
    #: every bot game started (`World.bot_games`: those that exist)
    bot_games: list[str] = field(default_factory=list)
    drivers: list[asyncio.Task[None]] = field(default_factory=list)
    feeding: asyncio.Task[None] | None = None
    flooding: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        spec = TournamentSpec(format="round-robin", game="teeko", bots=BOTS, rounds=2,
                              move_time_ms=5000, concurrency=2)  # fmt: skip
        await self.store.create(self.world.tournament_id, spec, now_ms())
        never = time.monotonic() + 10**6  # drivers stop by parking (`Players.closing`)
        players = self.world.players
        self.drivers = [
            asyncio.create_task(drive(self.redis, self.keys, players, n, never, self.tally))
            for n in range(DRIVERS)
        ]
        self.flooding.set()
        self.feeding = asyncio.create_task(self._bot_games())
        ready = await until(self._ready, 60)
        assert ready, "no honest games to aim at"

    async def _bot_games(self) -> None:
        world, query, k = self.world, QueryClient(self.redis, self.keys), 0
        while self.flooding.is_set():
            spec = [BOT_GAMES[k % len(BOT_GAMES)]]
            self.bot_games += await create_games(
                self.redis, self.keys, spec, 1, BOTS[:2], run_id=f"h{k}"
            )
            t = await self.store.load(world.tournament_id)
            scheduled = list(t.games) if t is not None else []
            # Games are aimed at only once they exist: a forged creation with the id of one
            # still on its way would be a good creation.
            heads = await query.heads(self.bot_games)
            world.bot_games = [g for g, h in zip(self.bot_games, heads, strict=True) if h]
            heads = await query.heads(scheduled)
            world.tournament_games = [g for g, h in zip(scheduled, heads, strict=True) if h]
            k += 1
            await asyncio.sleep(0.25)

    async def _ready(self) -> bool:
        return len(self.world.players.seated()) >= DRIVERS and bool(self.world.bot_games)

    async def wind_down(self) -> tuple[bool, list[str]]:
        """Stop starting games; let each driver play its game to the end. (Whether every
        driver did, and the drivers' failures.)"""
        self.flooding.clear()
        if self.feeding is not None:
            await self.feeding
        players = self.world.players
        players.closing.set()

        async def parked() -> bool:
            return players.parked >= DRIVERS or any(t.done() for t in self.drivers)

        done = await until(parked, WIND_DOWN_S)
        return done, await self.stop()

    async def stop(self) -> list[str]:
        tasks = [*self.drivers, *([self.feeding] if self.feeding is not None else [])]
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        return [
            f"an honest task failed: {o!r}" for o in outcomes if isinstance(o, BaseException)
            and not isinstance(o, asyncio.CancelledError)
        ]  # fmt: skip

    async def games(self) -> tuple[list[str], bool]:
        """Every honest game, once the tournament ended (and whether it did)."""
        t = None
        deadline = time.monotonic() + WIND_DOWN_S
        while time.monotonic() < deadline:
            t = await self.store.load(self.world.tournament_id)
            if t is not None and t.ended is not None:
                break
            await asyncio.sleep(0.5)
        assert t is not None
        games = {*self.world.players.created, *self.bot_games, *self.world.bot_games, *t.games}
        return sorted(games), t.ended is not None


async def play_one_more(redis: aioredis.Redis, keys: Keys, world: World) -> list[str]:
    """The engine answers a fresh command after the flood: one more bot game (played to its
    end with the others)."""
    seats = [SeatSpec(kind="bot", name=b) for b in BOTS[:2]]
    create = CreateGame(command_id=new_command_id(), game_id="after-the-flood", game="teeko",
                        seats=seats)  # fmt: skip
    async with CommandClient(redis, keys, name="fuzz-after") as client:
        reply = await client.submit(create, timeout_s=10)
    world.bot_games.append(create.game_id)
    return [] if isinstance(reply, Accepted) else [f"a fresh command was refused: {reply}"]


def running_reply_readers() -> int:
    """Reply readers still running once every `CommandClient` was closed (should be none:
    a reader that outlives its client would keep the event loop from ever closing)."""
    reader = "CommandClient._read_replies"
    tasks = asyncio.all_tasks()
    return sum(1 for t in tasks if not t.done() and t.get_coro().__qualname__ == reader)


async def test_a_flood_of_bad_input_harms_no_honest_game(
    redis: aioredis.Redis, namespace: str
) -> None:
    began = time.monotonic()
    plans = Plans.make(TOTAL)
    generated_s = time.monotonic() - began
    assert len(plans) == TOTAL, f"Hypothesis made {len(plans)} items, not {TOTAL}"
    keys = Keys(prefix=namespace)
    problems: list[str] = []
    try:
        async with running_arena(redis, keys, BOTS) as arena, Players(redis, keys) as players:
            services = arena.services
            gateway = await arena.gateway(rate_per_s=1e9, burst=10**9)  # past the rate limiter
            world = World(keys, await shared_secret(redis, keys), players, [])
            world.tournament_id = new_tournament_id()
            honest = Honest(redis, keys, world, TournamentStore(redis, keys))
            try:
                await honest.start()
                started = time.monotonic()
                sent, answers, socket_outcomes = await asyncio.gather(
                    flood_streams(redis, world, plans.stream),
                    flood_http(gateway, world, plans.http),
                    flood_sockets(gateway, world, plans.sockets),
                )
                flood_s = time.monotonic() - started
                parked, failures = await honest.wind_down()
            finally:
                await honest.stop()
            problems += failures + await play_one_more(redis, keys, world)
            game_ids, tournament_ended = await honest.games()
            unfinished = await wait_until_ended(redis, keys, game_ids, WIND_DOWN_S, services.failed)
            wedged = len(unfinished) + (not tournament_ended) + (not parked)
            if not await until(lambda: engine_idle(redis, keys), 60):
                problems.append("the engine did not work through the command streams")
            await settle(redis, keys, set(game_ids))
            dead = await dead_consumers(redis, keys, services)

            stream_counts, stream_problems = await stream_outcomes(redis, keys, sent)
            problems += stream_problems
            statuses = Counter(status for (_, status) in answers.elements())
            problems += [f"HTTP {s} x{c}" for s, c in statuses.items() if not s.startswith("4")]
            problems += [
                f"socket {o} x{c}" for o, c in socket_outcomes.items()
                if o.startswith(("ACCEPTED", "unanswered", "hang"))
                # The server answers an oversized frame with close 1009 and drops the
                # connection; when the unread rest of the frame makes the drop a TCP reset,
                # the client may lose the close frame and see 1006. Both are a refusal.
                or (o.startswith("closed") and o not in ("closed 1009", "closed 1006"))
            ]  # fmt: skip
            health = await gateway.get("/health")
            if health.status != 200:
                problems.append(f"/health answered {health.status}")
            registered = await QueryClient(redis, keys).game_ids()
            if strangers := set(registered) - set(game_ids):
                problems.append(
                    f"{len(strangers)} games nobody honest made: {sorted(strangers)[:5]}"
                )
            if (tournaments := await honest.store.ids()) != [world.tournament_id]:
                problems.append(f"tournaments nobody honest made: {tournaments}")
            if found := await forged_events(redis, keys, registered):
                problems.append(f"{found} events of forged commands in the logs")
            if honest.tally.resyncs:
                problems.append(
                    f"a driver found its game moved by another {honest.tally.resyncs} times"
                )
            lost, doubled = await lost_and_doubled(redis, keys, honest.tally)
            report = await verify(redis, keys)
    finally:
        stray_readers = running_reply_readers()

    note = (
        f"{flood_s:.0f} s flood after {generated_s:.0f} s generating; "
        f"streams {len(plans.stream)}: {counts(stream_counts)} [{kinds(plans.stream)}]; "
        f"http {len(plans.http)}: {counts(statuses)} [{kinds(plans.http)}]; "
        f"sockets {len(plans.sockets)}: {counts(socket_outcomes)} [{kinds(plans.sockets)}]; "
        f"verify problems {len(report.problems)}, fuzz problems {len(problems)}, "
        f"reply readers left running {stray_readers}"
    )
    record(
        FaultLine(
            f"fuzz: {TOTAL} malformed/oversized/forged commands + HTTP",
            games=len(game_ids),
            acked=len(honest.tally.acked),
            lost=lost,
            doubled=doubled,
            dead_consumers=len(dead),
            wedged=wedged,
            problems=len(report.problems) + len(problems),
            note=note,
        )
    )
    assert problems == [], problems[:20]
    assert report.problems == [], report.problems[:10]
    assert dead == [], dead
    assert stray_readers == 0, f"{stray_readers} reply readers outlived their clients"
    assert (lost, doubled) == (0, 0)
    assert wedged == 0, (
        f"unfinished {unfinished[:10]}, tournament ended {tournament_ended}, parked {parked}"
    )
    assert len(honest.tally.acked) > 0 and len(game_ids) > DRIVERS
