"""Least-privilege Redis users (`agon acl`), against a real redis-server started with them.

Every service kind runs as its own Redis user, each with its own client: an engine, a
projector, a dispatcher, bot workers, a tournament director and a gateway over real HTTP.
They play whole games (bots against bots, a person's seat through the REST API, an outside
bot through the SDK, a tournament, a move clock that runs out), `agon verify` passes as the
operator, and Redis denied nobody anything on the way (its ACL LOG stays empty). Then each
forbidden write is tried as the user it is forbidden to and must be refused with NOPERM,
while `ACL DRYRUN` shows the user meant to do it may. The server runs with one extra user
of the test's own (`acl-test-admin`) to read the ACL LOG and ask DRYRUN.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis as redis_sync
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.retry import Retry

from bots.sdk.client import register_bot, run_bot
from bots.sdk.example import choose
from bots.worker import BotWorker
from schemas.codec import encode, unpack
from schemas.commands import CreateGame, SeatSpec
from schemas.events import GameCreated
from schemas.tokens import admin_token, clock_key
from schemas.tournaments import TournamentSpec, new_tournament_id
from services.bus.clients import CommandClient
from services.bus.connection import Client, connect
from services.bus.embedded import EmbeddedRedis, free_port
from services.bus.keys import Keys
from services.bus.text import now_ms
from services.cli import main as agon
from services.cli.acl import USERS, grants
from services.dispatcher import Dispatcher
from services.engine_service import EngineService
from services.engine_service.store import Commit, EventStore
from services.gamelog.fold import GameFold
from services.gateway import GatewaySettings, init_app
from services.projector import Projector
from services.projector.write import Write, write
from services.tournament.director import Director
from services.tournament.store import TournamentStore
from tests.support.gateway import new_game, play_out, until, view

pytestmark = pytest.mark.timeout(180)

PREFIX = "agon-acl"
ADMIN = "acl-test-admin"
#: A game id for the denied writes: Redis checks a user's rights before it looks at a key.
GAME = "teeko-acl-1"


@dataclass
class Deployment:
    """A redis-server started with the users `agon acl` wrote, and their env files."""

    server: EmbeddedRedis
    out: Path
    urls: dict[str, str]
    secret: str
    admin_url: str

    @property
    def keys(self) -> Keys:
        return Keys(PREFIX)


def env_values(path: Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in path.read_text().splitlines())
    return {k: v for k, _, v in pairs if k and not k.startswith("#")}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    out = tmp_path_factory.mktemp("acl") / "users"
    port = free_port()
    argv = ["acl", "--out", str(out), "--prefix", PREFIX, "--host", "127.0.0.1"]
    assert agon([*argv, "--port", str(port)]) == 0
    admin_password = "test-admin-" + os.urandom(8).hex()
    digest = hashlib.sha256(admin_password.encode()).hexdigest()
    with (out / "users.acl").open("a") as f:
        f.write(f"user {ADMIN} on #{digest} ~* &* +@all\n")
    server = EmbeddedRedis(port=port, aclfile=out / "users.acl")
    server.start()
    try:
        envs = {user: env_values(out / f"{user}.env") for user in USERS}
        yield Deployment(
            server=server,
            out=out,
            urls={user: env["REDIS_URL"] for user, env in envs.items()},
            secret=envs["engine"]["AGON_SECRET"],
            admin_url=f"redis://{ADMIN}:{admin_password}@127.0.0.1:{port}/0",
        )
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def clients(deployment: Deployment) -> Any:
    """A client per user (each closed at the end), and the test's admin client."""
    made = {user: await connect(url, wait_s=5.0) for user, url in deployment.urls.items()}
    admin = aioredis.Redis.from_url(deployment.admin_url)
    try:
        yield made, admin
    finally:
        for client in made.values():
            await client.aclose()
        await admin.aclose()


# -- the files ------------------------------------------------------------------------------
def test_files_are_private_and_the_acl_file_holds_only_password_hashes(
    deployment: Deployment,
) -> None:
    acl = (deployment.out / "users.acl").read_text()
    assert acl.startswith("user default off ")
    for user in USERS:
        path = deployment.out / f"{user}.env"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        url = urlsplit(deployment.urls[user])
        assert (url.username, url.hostname, url.port) == (user, "127.0.0.1", deployment.server.port)
        password = url.password or ""
        assert len(password) >= 40 and password not in acl
        assert f"user {user} on #{hashlib.sha256(password.encode()).hexdigest()} " in acl
        env = env_values(path)
        # Only the services that sign or check tokens get the secret.
        assert env.get("AGON_SECRET") == (
            None if user in ("projector", "bots") else deployment.secret
        )
        # Bot workers sign the clocks of the turns they deliver, with a key good for nothing else.
        clock = clock_key(deployment.secret.encode()).decode()
        assert env.get("AGON_CLOCK_KEY") == (clock if user == "bots" else None)
    assert stat.S_IMODE((deployment.out / "users.acl").stat().st_mode) == 0o600
    # Every key pattern of every user is under the deployment's prefix.
    patterns = [
        w.split("~", 1)[1] for w in acl.replace("(", " ").replace(")", " ").split() if "~" in w
    ]
    assert patterns and all(p.startswith(f"{PREFIX}:") for p in patterns if p != "*")


# -- the services, each as its own user ----------------------------------------------------
async def test_every_service_runs_as_its_own_user_and_plays_whole_games(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGON_SECRET", deployment.secret)
    keys = deployment.keys
    async with clients(deployment) as (users, admin):
        await admin.acl_log_reset()
        stop = asyncio.Event()
        services: list[Any] = [
            EngineService(users["engine"], keys, block_ms=50),
            Projector(users["projector"], keys, block_ms=50),
            Dispatcher(users["dispatcher"], keys, block_ms=50),
            *(
                BotWorker(users["bots"], b, keys, block_ms=50)
                for b in ("random", "greedy", "random.2")
            ),
        ]
        for service in services:
            await service.setup()
        director = Director(users["director"], keys, every_s=0.05)
        await director.setup()
        tasks = [asyncio.create_task(s.run(stop)) for s in [*services, director]]
        app = init_app(GatewaySettings(redis_url=deployment.urls["gateway"], keys=keys))
        http = TestClient(TestServer(app, host="127.0.0.1"))
        await http.start_server()
        url = str(http.make_url("/"))
        outsider_stop = asyncio.Event()
        outsider: asyncio.Task[None] | None = None
        try:
            # Bots against bots, and an outside bot, created through the gateway.
            bots_game = await new_game(http, seats=[{"bot": "random"}, {"bot": "greedy"}])
            key = await register_bot(url, "outsider")
            outsider = asyncio.create_task(run_bot(url, key, choose, stop=outsider_stop))
            # Seated with its consent: the game is created with its key.
            made = await http.post(
                "/api/games",
                json={"game": "teeko", "seats": [{"bot": "outsider"}, {"bot": "random"}]},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert made.status == 201, await made.text()
            outside_game = await made.json()
            # A person's seat played through the REST API.
            person = await new_game(http)
            # A person who never moves: the dispatcher's clock claims the timeout.
            sleeper = await new_game(http, move_time=0.3)
            # A tournament the operator creates and the director plays.
            tid = new_tournament_id()
            spec = TournamentSpec(
                format="round-robin", game="teeko", bots=["random.2", "greedy"], concurrency=2
            )
            await TournamentStore(users["operator"], keys).create(tid, spec, now_ms())
            # Games the operator starts with its own command client (as `agon selfplay` does).
            seats = [SeatSpec(kind="bot", name="greedy"), SeatSpec(kind="bot", name="random")]
            async with CommandClient(users["operator"], keys) as operator:
                reply = await operator.submit(
                    CreateGame(command_id="op-1", game_id="op-game-1", game="teeko", seats=seats)
                )
            assert reply.type == "accepted", reply

            final = await play_out(http, person["id"], person["tokens"][0])
            assert final["status"] == "ended"
            ids = [bots_game["id"], outside_game["id"], sleeper["id"], "op-game-1"]
            for gid in ids:
                v = await until(lambda gid=gid: _ended(http, gid), timeout_s=60)
                assert v, f"game {gid} did not end"
            assert (await view(http, sleeper["id"]))["result"]["reason"] == "time_forfeit"
            store = TournamentStore(users["operator"], keys)
            t = await until(lambda: _tournament_ended(store, tid), timeout_s=60)
            assert t is not None and t.ended is not None and t.ended.reason == "completed"

            # What the gateway reads: the list, a tournament, its leaderboard, metrics, export.
            reads = ["/api/games?status=ended", f"/api/tournaments/{tid}", "/api/tournaments"]
            reads += ["/api/leaderboards/teeko", "/metrics", "/api/catalogue", "/health"]
            reads += [f"/api/games/{person['id']}/export?format=jsonl"]
            for path in reads:
                resp = await http.get(path)
                assert resp.status == 200, (path, await resp.text())
            # The health check every service container runs, as that service's user.
            for user in USERS:
                argv = ["status", "--check", "--redis-url", deployment.urls[user]]
                assert await asyncio.to_thread(agon, [*argv, "--prefix", PREFIX]) == 0, user
            argv = ["status", "--json", "--redis-url", deployment.urls["operator"]]
            assert await asyncio.to_thread(agon, [*argv, "--prefix", PREFIX]) == 0
        finally:
            outsider_stop.set()
            if outsider is not None:
                await asyncio.wait([outsider], timeout=5)
            await http.close()
            stop.set()
            await asyncio.wait(tasks, timeout=10)
        assert not [t for t in tasks if not t.done() or t.exception()], "a service failed"
        # Nothing any service did on the way was refused, background work included.
        denied = await admin.acl_log()
        assert denied == [], [(d["username"], d["object"], d["context"]) for d in denied]

        # The operator verifies every log against the read models: `agon verify`.
        capsys.readouterr()
        argv = ["verify", "--redis-url", deployment.urls["operator"], "--prefix", PREFIX]
        status = await asyncio.to_thread(agon, argv)
        printed = capsys.readouterr()
        assert status == 0, printed
        assert printed.out.startswith("verify: 7 games, ") and printed.out.endswith(": OK\n")


async def _ended(http: TestClient, game_id: str) -> dict[str, Any] | None:
    v = await view(http, game_id)
    return v if v["status"] == "ended" else None


async def _tournament_ended(store: TournamentStore, tid: str) -> Any:
    t = await store.load(tid)
    return t if t is not None and t.ended is not None else None


async def test_the_gateway_may_not_create_tournaments_and_says_so(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGON_SECRET", deployment.secret)
    app = init_app(GatewaySettings(redis_url=deployment.urls["gateway"], keys=deployment.keys))
    async with TestClient(TestServer(app, host="127.0.0.1")) as http:
        token = admin_token(deployment.secret.encode())
        spec = {"format": "round-robin", "game": "teeko", "bots": ["random", "greedy"]}
        resp = await http.post(
            "/api/tournaments", json=spec, headers={"Authorization": f"Bearer {token}"}
        )
        body = await resp.json()
        assert resp.status == 403 and body["code"] == "forbidden", body
        assert "agon tournament" in body["message"]


def test_a_service_without_agon_secret_is_told_to_set_it(
    deployment: Deployment, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dispatcher may not create the shared secret in Redis: one line says what to do."""
    monkeypatch.delenv("AGON_SECRET", raising=False)
    url = deployment.urls["dispatcher"]
    assert agon(["dispatcher", "--drain", "--redis-url", url, "--prefix", PREFIX]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agon dispatcher: "), lines
    assert "set AGON_SECRET" in lines[0]


# -- forbidden writes ----------------------------------------------------------------------
Attempt = Callable[[Client, Keys], Awaitable[Any]]


async def _commit(client: Client, keys: Keys) -> Any:
    """The engine's commit script (EVALSHA), appending an event to a game's log."""
    return await EventStore(client, keys).commit(
        Commit(game_id=GAME, head=0, memory="forged", reply=b"r", events=[b"e"])
    )


async def _project(client: Client, keys: Keys) -> Any:
    """The projector's guarded read-model write (EVALSHA), of a game's first event."""
    seats = [SeatSpec(kind="bot", name="random"), SeatSpec(kind="bot", name="greedy")]
    created = GameCreated(
        game_id=GAME, seq=1, time=1, command_id="c", prev_hash="", game="teeko", options={},
        seats=seats, move_time_ms=0, seed=1, engine_version="test",
    )  # fmt: skip
    game = GameFold.start(unpack(encode(created)))  # type: ignore[arg-type]
    return await write(client, keys, [Write(game, 0, 0)])


async def _append(client: Client, keys: Keys) -> Any:
    """A script of the caller's own (SCRIPT LOAD, EVALSHA) that appends to a game's log."""
    sha = await client.script_load("return redis.call('XADD', KEYS[1], '*', 'm', 'x')")
    return await client.evalsha(sha, 1, keys.log(GAME))


#: The attempts that are code paths, with the key each would write.
SCRIPTED: dict[Any, Callable[[Keys], str]] = {
    _commit: lambda k: k.log(GAME),
    _project: lambda k: k.view(GAME),
    _append: lambda k: k.log(GAME),
}

#: (user, what, the attempt, the user whom the ACL lets do it (None: nobody but the operator)).
#: Each attempt is a plain command (the rightful user's right checked with ACL DRYRUN) or
#: the real code path that writes it (a script call).
CASES: list[tuple[str, str, Any, str | None]] = [
    ("gateway", "XADD to a game log", lambda k: ("XADD", k.log(GAME), "*", "m", "x"), "engine"),
    ("gateway", "SET a game view", lambda k: ("SET", k.view(GAME), "{}"), "projector"),
    ("gateway", "HSET a results read model",
     lambda k: ("HSET", k.results(k.partition(GAME), "teeko"), GAME, "x"), "projector"),
    ("gateway", "ZADD the game index",
     lambda k: ("ZADD", k.index_time(k.partition(GAME)), 1, GAME), "projector"),
    ("gateway", "HSET the projector's seen seqs",
     lambda k: ("HSET", k.projector_seen(k.partition(GAME)), GAME, 9), "projector"),
    ("gateway", "the read-model write script", _project, "projector"),
    ("gateway", "XADD to a feed", lambda k: ("XADD", k.feed(0), "*", "m", "x"), "engine"),
    ("gateway", "XADD to a tournament log",
     lambda k: ("XADD", k.tournament_log("t1"), "*", "m", "x"), "director"),
    ("gateway", "XADD a turn into a bot's inbox",
     lambda k: ("XADD", k.bot_turns("random"), "*", "m", "x"), "dispatcher"),
    ("gateway", "read the shared secret", lambda k: ("GET", k.secret()), None),
    ("bots", "XADD to a game log", lambda k: ("XADD", k.log(GAME), "*", "m", "x"), "engine"),
    ("bots", "SET a game view", lambda k: ("SET", k.view(GAME), "{}"), "projector"),
    ("bots", "XADD a forged turn into its inbox",
     lambda k: ("XADD", k.bot_turns("random"), "*", "m", "x"), "dispatcher"),
    ("bots", "read an outside bot's inbox (its tokens)",
     lambda k: ("XREVRANGE", k.bot_turns("outsider"), "+", "-"), "gateway"),
    ("bots", "read the shared secret", lambda k: ("GET", k.secret()), None),
    ("projector", "XADD to a game log", lambda k: ("XADD", k.log(GAME), "*", "m", "x"), "engine"),
    ("projector", "the commit script (append to a log)", _commit, "engine"),
    # The projector's own script declares logs (it checks their heads), so EVALSHA may
    # name one; what a script does is checked command by command.
    ("projector", "its own script appending to a log", _append, "engine"),
    ("projector", "DEL a game log", lambda k: ("DEL", k.log(GAME)), "operator"),
    ("projector", "XADD to a feed", lambda k: ("XADD", k.feed(0), "*", "m", "x"), "engine"),
    ("projector", "read the shared secret", lambda k: ("GET", k.secret()), None),
    ("engine", "SET a game view", lambda k: ("SET", k.view(GAME), "{}"), "projector"),
    ("engine", "HSET a results read model",
     lambda k: ("HSET", k.results(k.partition(GAME), "teeko"), GAME, "x"), "projector"),
    ("engine", "ZADD the game index",
     lambda k: ("ZADD", k.index_time(k.partition(GAME)), 1, GAME), "projector"),
    ("engine", "the read-model write script", _project, "projector"),
    ("dispatcher", "XADD to a game log", lambda k: ("XADD", k.log(GAME), "*", "m", "x"), "engine"),
    ("dispatcher", "the commit script (append to a log)", _commit, "engine"),
    ("dispatcher", "SET a game view", lambda k: ("SET", k.view(GAME), "{}"), "projector"),
    ("director", "XADD to a game log", lambda k: ("XADD", k.log(GAME), "*", "m", "x"), "engine"),
    ("director", "the commit script (append to a log)", _commit, "engine"),
    ("director", "SET a game view", lambda k: ("SET", k.view(GAME), "{}"), "projector"),
    ("operator", "manage users", lambda k: ("ACL", "SETUSER", "bots", "+@all"), None),
    ("operator", "change the config", lambda k: ("CONFIG", "SET", "maxmemory", "1"), None),
    ("operator", "flush the server", lambda k: ("FLUSHALL",), None),
    ("operator", "a key outside the deployment", lambda k: ("SET", "elsewhere", "x"), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("user", "what", "attempt", "rightful"), CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES]
)
async def test_a_forbidden_write_is_refused(
    deployment: Deployment, user: str, what: str, attempt: Any, rightful: str | None
) -> None:
    keys = deployment.keys
    async with clients(deployment) as (users, admin):
        words = None if attempt in SCRIPTED else attempt(keys)
        target = words[1] if words and words[0] in ("XADD", "SET", "HSET", "ZADD", "DEL") else None
        if words is None:
            target = SCRIPTED[attempt](keys)
        before = await admin.dump(target) if target else None
        # A command a script runs is refused inside the script: a plain ResponseError.
        with pytest.raises(ResponseError, match=r"no permissions|can't access"):
            if words is None:
                await attempt(users[user], keys)
            else:
                await users[user].execute_command(*words)
        if words is not None and rightful is not None:
            # The same command is one the ACL lets its rightful user run.
            assert await admin.execute_command("ACL", "DRYRUN", rightful, *words) == b"OK"
        if target:  # nothing was written
            assert await admin.dump(target) == before


def test_the_default_user_cannot_connect(deployment: Deployment) -> None:
    port = deployment.server.port
    once = Retry(NoBackoff(), 0)
    anonymous = redis_sync.Redis(port=port, retry=once, protocol=2)
    with anonymous, pytest.raises(AuthenticationError, match="Authentication required"):
        anonymous.ping()
    default = redis_sync.Redis(port=port, username="default", password="any", retry=once)
    with default, pytest.raises(AuthenticationError, match="user is disabled"):
        default.ping()


# -- rare paths: allowed to the user that takes them -------------------------------------
def _rare(k: Keys) -> list[tuple[str, tuple[Any, ...]]]:
    """Commands the play above may not reach (a dead consumer, a dead letter, a full
    inbox), each with the user whose service sends it."""
    commands, feed, inbox = k.commands(3), k.feed(3), k.bot_turns("random.7")
    return [
        ("engine", ("XCLAIM", commands, "engine", "c", 500, "1-0")),
        ("engine", ("XADD", k.dead_letter(3), "MAXLEN", "~", 10, "*", "m", "x")),
        ("engine", ("XADD", k.reply_stream("gateway-x"), "*", "m", "x")),
        ("engine", ("PEXPIRE", k.reply_stream("client-x"), 10)),
        ("engine", ("XTRIM", commands, "MINID", "1-0")),
        ("engine", ("WAIT", 1, 10)),
        ("engine", ("PEXPIRE", k.replies_memory(GAME), 10)),
        ("projector", ("XCLAIM", feed, "projector", "c", 500, "1-0")),
        ("projector", ("XADD", k.reader_dead_letter(), "*", "m", "x")),
        ("projector", ("XGROUP", "DELCONSUMER", feed, "projector", "c")),
        ("projector", ("XTRIM", feed, "MINID", "1-0")),
        ("projector", ("WAIT", 1, 10)),
        ("dispatcher", ("WAIT", 1, 10)),
        ("bots", ("WAIT", 1, 10)),
        ("dispatcher", ("XTRIM", feed, "MINID", "1-0")),
        ("dispatcher", ("XADD", k.bot_turns("outsider"), "MAXLEN", "~", 10, "*", "m", "x")),
        ("dispatcher", ("XINFO", "GROUPS", k.bot_turns("outsider"))),
        ("dispatcher", ("XADD", k.reader_dead_letter(), "*", "m", "x")),
        ("bots", ("XCLAIM", inbox, "workers", "c", 500, "1-0")),
        ("bots", ("XTRIM", inbox, "MINID", "1-0")),
        ("bots", ("XADD", k.reader_dead_letter(), "*", "m", "x")),
        ("gateway", ("XREAD", "COUNT", 1, "STREAMS", k.bot_turns("outsider"), "0-0")),
        ("gateway", ("DEL", k.reply_stream("gateway-x"))),
        ("director", ("ZREM", k.active_tournaments(), "t1")),
        ("operator", ("SET", k.secret(), "x")),
        ("operator", ("CLUSTER", "MEET", "127.0.0.1", 7000)),
        ("operator", ("REPLCONF", "listening-port", 6379)),
        ("operator", ("PSYNC", "?", -1)),
        ("operator", ("ACL", "LOG")),
        ("operator", ("MEMORY", "USAGE", k.log(GAME))),
    ]


async def test_the_rare_paths_are_allowed_to_the_user_that_takes_them(
    deployment: Deployment,
) -> None:
    async with clients(deployment) as (_, admin):
        for user, words in _rare(deployment.keys):
            answer = await admin.execute_command("ACL", "DRYRUN", user, *words)
            assert answer == b"OK", (user, words, answer)


def test_the_rules_follow_the_prefix_and_name_every_user() -> None:
    rules = grants("other")
    assert set(rules) == set(USERS) - {"operator"}
    for user, selectors in rules.items():
        for grant in selectors:
            for pattern in (*grant.read, *grant.write, *grant.both):
                assert pattern.startswith("other:"), (user, grant.why, pattern)


# -- agon acl: reruns and bad input --------------------------------------------------------
def _write(tmp_path: Path, *extra: str) -> int:
    return agon(["acl", "--out", str(tmp_path / "acl"), "--prefix", PREFIX, *extra])


def _passwords(out: Path) -> dict[str, str]:
    return {u: urlsplit(env_values(out / f"{u}.env")["REDIS_URL"]).password or "" for u in USERS}


def test_a_rerun_refuses_keeps_or_replaces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGON_SECRET", raising=False)
    out = tmp_path / "acl"
    assert _write(tmp_path) == 0
    first = _passwords(out)
    secret = env_values(out / "gateway.env")["AGON_SECRET"]
    acl = (out / "users.acl").read_text()
    capsys.readouterr()
    assert _write(tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agon acl: ") and "--keep" in err[0]
    assert (out / "users.acl").read_text() == acl
    assert _write(tmp_path, "--keep") == 0
    assert _passwords(out) == first and (out / "users.acl").read_text() == acl
    assert env_values(out / "engine.env")["AGON_SECRET"] == secret
    assert _write(tmp_path, "--force") == 0
    second = _passwords(out)
    assert all(second[u] != first[u] for u in USERS)
    assert env_values(out / "engine.env")["AGON_SECRET"] != secret
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["users.acl", *(f"{u}.env" for u in USERS)]
    )  # no temporary file left behind
    monkeypatch.setenv("AGON_SECRET", "the-deployments-own")
    assert _write(tmp_path, "--force") == 0
    assert env_values(out / "director.env")["AGON_SECRET"] == "the-deployments-own"
    monkeypatch.setenv("AGON_SECRET", "two words")
    capsys.readouterr()
    assert _write(tmp_path, "--force") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "AGON_SECRET" in err[0]
    assert env_values(out / "director.env")["AGON_SECRET"] == "the-deployments-own"


@pytest.mark.parametrize(
    "argv",
    [
        ["acl"],
        ["acl", "--out", "{tmp}/a", "--prefix", "a*b"],
        ["acl", "--out", "{tmp}/a", "--prefix", ""],
        ["acl", "--out", "{tmp}/a", "--port", "0"],
        ["acl", "--out", "{tmp}/a", "--port", "70000"],
        ["acl", "--out", "{tmp}/a", "--port", "x"],
        ["acl", "--out", "{tmp}/a", "--host", "user@redis"],
        ["acl", "--out", "{tmp}/a", "--force", "--keep"],
        ["acl", "--out", "{tmp}/file"],
    ],
    ids=[
        "no-out",
        "glob-prefix",
        "empty-prefix",
        "port-0",
        "port-big",
        "port-word",
        "host-at",
        "force-and-keep",
        "out-is-a-file",
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    assert agon([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agon acl: "), captured.err
    assert not (tmp_path / "a").exists()


def test_keep_refuses_an_env_file_without_a_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _write(tmp_path) == 0
    (tmp_path / "acl" / "bots.env").write_text("REDIS_URL=redis://bots@redis:6379/0\n")
    capsys.readouterr()
    assert _write(tmp_path, "--keep") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bots.env" in err[0] and "--force" in err[0]


def test_redis_loaded_every_user_of_the_file(deployment: Deployment) -> None:
    with redis_sync.Redis.from_url(deployment.admin_url) as admin:
        listed = [str(line).split() for line in admin.acl_list()]
    assert sorted(words[1] for words in listed) == sorted([*USERS, "default", ADMIN])
    assert [words[2] for words in listed if words[1] == "default"] == ["off"]
