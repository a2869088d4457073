"""`agon acl --out DIR`: one Redis user per service kind, each allowed only what it does.

Redis 7 selectors pair commands with the keys they may touch: `(%R~K +xrange)` lets a user
read the keys matching K with XRANGE and nothing else, `(%W~K +xadd)` append to them, and a
command runs when one selector allows it with all of its keys. Commands a Lua script runs
are checked against the calling user the same way, and EVALSHA itself needs read and write
access to the keys it declares. So the projector, whose guarded write declares the game
logs it checks, may name a log in an EVALSHA, but only beside read models: the engine's
commit script (which names a feed and a command stream too) is refused, and so is any
XADD or DEL of a log, whether sent or run by a script. The key patterns come from
`services.bus.keys` itself (`_Patterns` spells each name with `*` where a partition, game,
bot or tournament goes), so they follow any change there.

Who may do what (`grants`): only the engine appends to game logs and feeds and writes
replies; only the projector writes read models; the dispatcher keeps clocks and fills
inboxes; bot workers read the inboxes of the built-in bots (not outside bots', whose turns
carry seat tokens) and send commands; the gateway sends commands and reads logs, views,
results and tournaments, and writes nothing but its own reply stream, the outside bots'
registry and heartbeats; the director appends to tournament logs and creates their games.
The operator (`agon verify`, `rebuild`, `status`, `archive`, `restore`, `tournament
create|cancel`, creating a cluster, replicas' logins) may run everything on the deployment's
keys but Redis's dangerous commands (`OPERATOR_RULES`: it may not manage users or the
configuration, flush, replicate another server, watch other users' commands or stop Redis)
and script or function writes. `default` is off. Every
user may read the heartbeats, so `agon status --check` (a health check) works as any.
Nobody but the operator may touch the shared secret key: the services that sign or check
tokens get `AGON_SECRET` in their env file; bot workers get only `AGON_CLOCK_KEY`, which
signs the clocks of the turns they deliver and nothing else; the projector gets neither.

Files (all 0600, replaced atomically): `DIR/users.acl` (for `redis-server --aclfile`; each
password only as its sha256) and `DIR/<user>.env` with `REDIS_URL=redis://<user>:<password>
@HOST:PORT/0` and, where needed, `AGON_SECRET`. Passwords are `secrets.token_urlsafe(32)`.
Existing files are never overwritten without `--force` (new passwords) or `--keep` (the
passwords and the secret in the env files stay; the rules are written anew).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bots import bot_names
from schemas.tokens import clock_key, new_secret
from services.bus.keys import DEFAULT_PREFIX, Keys
from services.cli.options import UsageError

#: The users, in the order the files list them (`default` is written off, first).
USERS = ("engine", "projector", "dispatcher", "bots", "gateway", "director", "operator")
#: Users whose services sign or check tokens: their env files carry AGON_SECRET.
NEEDS_SECRET = frozenset({"engine", "dispatcher", "director", "gateway", "operator"})

#: What every user may run without keys: connect (`connect` asks `INFO cluster`), health
#: checks, and what a cluster client asks on start-up.
CONNECTION = (
    "ping", "hello", "info", "client|id", "client|setname", "client|getname", "command",
    "cluster|slots", "cluster|shards", "cluster|nodes", "readonly", "readwrite",
)  # fmt: skip
#: A consumer of a group on its streams (`services.bus.consumer`): create the group, read,
#: acknowledge, claim dead consumers' entries, inspect, leave, trim what all acknowledged.
CONSUMER = (
    "xgroup|create", "xgroup|delconsumer", "xreadgroup", "xack", "xclaim", "xpending",
    "xinfo|groups", "xinfo|consumers", "xtrim",
)  # fmt: skip
SCRIPTS = ("evalsha", "script|load")
#: The delivery script (`services.bus.delivery`) and the commands it runs.
DELIVERY = (*SCRIPTS, "zscore", "zrem", "zadd")
#: The operator: every command on the deployment's keys but Redis's `@dangerous` ones (users,
#: configuration, FLUSHALL, SWAPDB, REPLICAOF (which empties the server to copy another),
#: MONITOR and SLOWLOG (which show other users' commands: seat tokens), DEBUG, SHUTDOWN,
#: MODULE, CLIENT KILL|PAUSE, SAVE, FAILOVER...), taking back only those `agon` needs: INFO
#: (`connect`, `agon status`), CLUSTER to create and reshard a cluster (MIGRATE moves a
#: partition; but not RESET or FLUSHSLOTS, which empty a node), PSYNC and REPLCONF for the
#: replicas that log in as it, ACL LOG and DRYRUN (what Redis refused, what a user may do).
#: Script and function writes are not `@dangerous` but wipe what every service relies on,
#: so they go too (services load their scripts themselves: SCRIPT LOAD stays).
OPERATOR_RULES = (
    "+@all -@dangerous +info +cluster -cluster|reset -cluster|flushslots +migrate"
    " +psync +replconf +acl|log +acl|dryrun"
    " -script|flush -function|flush -function|delete -function|load -function|restore"
)

PREFIX_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
#: A password `--keep` keeps: what `secrets.token_urlsafe` makes (it goes into URLs as is).
PASSWORD_RE = re.compile(r"^[A-Za-z0-9_-]{16,}$")
HOST_RE = re.compile(r"^(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])$")


class _Patterns(Keys):
    """Key names with `*` for the partition: `log("*")` is every game's log."""

    __slots__ = ()

    def partition(self, game_id: str) -> int:
        return 0

    def _p(self, p: int) -> str:
        return f"{self.prefix}:{{*}}"


@dataclass(frozen=True)
class Grant:
    """One selector: `commands` on keys matching `read` (read only), `write` (write only)
    or `both` patterns; `why` says what it is for."""

    why: str
    commands: tuple[str, ...]
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    both: tuple[str, ...] = ()

    def selector(self) -> str:
        keys = [f"%R~{k}" for k in self.read] + [f"%W~{k}" for k in self.write]
        keys += [f"~{k}" for k in self.both]
        return "(" + " ".join([*keys, *(f"+{c}" for c in self.commands)]) + ")"


def grants(prefix: str = DEFAULT_PREFIX, bots: Sequence[str] = ()) -> dict[str, list[Grant]]:
    """Every service user's selectors, for key prefix `prefix` and the built-in `bots`
    (default: all of them; "<bot>.<label>" players included)."""
    k = _Patterns(prefix)
    commands, log, feed, games = k.commands(0), k.log("*"), k.feed(0), k.games(0)
    replies_memory, clocks, inboxes = k.replies_memory("*"), k.clocks(0), k.bot_turns("*")
    tournament_log = k.tournament_log("*")
    tours = (tournament_log, k.tournaments())
    built_in = tuple(
        name for b in bots or bot_names() for name in (k.bot_turns(b), k.bot_turns(f"{b}.*"))
    )
    results = (k.bot_results(0, "*"), k.results(0, "*"), k.tournament_results(0, "*"))
    models = (k.projector_seen(0), k.view("*"), k.index_pattern(), *results)
    beats = (k.processes(), k.processes_copy())
    beat = Grant("heartbeats", ("hset", "hdel", "hmget", "hgetall"), both=beats)
    set_aside = Grant("set aside what fails", ("xadd",), write=(k.reader_dead_letter(),))
    send = Grant("send commands", ("xadd",), write=(commands,))
    feeds = Grant("consume every feed", CONSUMER, both=(feed,))
    read_logs = Grant("fold games from their logs", ("xrange",), read=(log,))
    # Every consumer records the spells Redis refused its writes, or a master of the
    # cluster did not answer (those of its partitions); the engine and the dispatcher read
    # them to pause clocks (`services.bus.outages`).
    spells = Grant(
        "outage spells",
        ("zadd", "zremrangebyscore", "zrevrangebyscore"),
        both=(k.outages(), k.outages(0)),
    )

    def share(kind: str) -> Grant:
        return Grant(
            "own a share of the partitions: the lease scripts (their key)",
            (*SCRIPTS, "time", "hget", "hmget", "hset"),
            both=(k.lease(0, kind),),
        )

    return {
        "engine": [
            Grant("consume the command streams", (*CONSUMER, "xrange"), both=(commands,)),
            Grant(
                "the commit script (the keys it declares)",
                SCRIPTS,
                both=(feed, games, commands, k.lease(0, "engine"), log, replies_memory),
            ),
            Grant("append to game logs, read them", ("xadd", "xlen", "xrange"), both=(log,)),
            Grant("append to the feeds", ("xadd",), write=(feed,)),
            Grant("register new games", ("zadd",), write=(games,)),
            Grant("remember replies", ("hget", "hset", "pexpire"), both=(replies_memory,)),
            Grant("reply", ("xadd", "pexpire"), write=(k.reply_stream("*"),)),
            Grant("dead-letter commands", ("xadd",), write=(k.dead_letter(0),)),
            share("engine"),
            beat,
            spells,
        ],
        "projector": [
            feeds,
            read_logs,
            Grant(
                "the read-model write script (keys it names)",
                SCRIPTS,
                both=(*models, log, k.lease(0, "projector")),
            ),
            Grant(
                "the guarded read-model write (its commands)",
                ("hget", "hmget", "hset", "hdel", "set", "del", "zadd", "zrem"),
                both=models,
            ),
            set_aside,
            share("projector"),
            beat,
            spells,
        ],
        "dispatcher": [
            feeds,
            read_logs,
            Grant("is a stuck game's view its log's head", ("xlen",), read=(log,)),
            Grant(
                "move clocks", ("zadd", "zrem", "zrangebyscore", "zrange", "zscore"), both=(clocks,)
            ),
            Grant(
                "find stuck and abandoned games: the index, the views",
                ("zrange", "zmscore", "get"),
                read=(k.index_pattern(), k.view("*")),
            ),
            Grant(
                "the clock, turn and timeout-claim scripts (their keys)",
                SCRIPTS,
                both=(clocks, commands, k.lease(0, "dispatcher"), inboxes),
            ),
            send,
            Grant(
                "fill inboxes; who serves a bot", ("xadd", "xinfo|groups", "xlen"), both=(inboxes,)
            ),
            Grant("is a bot an outside one", ("hexists",), read=(k.registered_bots(),)),
            set_aside,
            share("dispatcher"),
            beat,
            spells,
        ],
        "bots": [
            Grant("consume the built-in bots' inboxes", CONSUMER, both=built_in),
            Grant("is a turn still current", ("xlen",), read=(log,)),
            Grant("start a turn's clock: the delivery script", DELIVERY, both=(clocks,)),
            send,
            set_aside,
            beat,
            spells,
        ],
        "gateway": [
            send,
            Grant("its own reply stream", ("xread", "del"), both=(k.reply_stream("gateway-*"),)),
            Grant(
                "read logs, views, the index, results and tournaments",
                (
                    *("get", "xrange", "xrevrange", "xlen", "xread", "hvals", "hlen"),
                    *("zrange", "zrevrange", "zinter", "zmscore", "zcard"),
                ),
                read=(log, feed, games, k.view("*"), k.index_pattern(), *results, *tours),
            ),
            Grant("metrics: consumer lag", ("xinfo|groups",), read=(commands, feed)),
            Grant(
                "outside bots' turns",
                ("xrevrange", "xread", "xinfo|groups", "xlen"),
                read=(inboxes,),
            ),
            Grant("start an outside bot's clock: the delivery script", DELIVERY, both=(clocks,)),
            Grant(
                "outside bots' registry: names taken, records, keys (rotated, revoked)",
                ("hsetnx", "hset", "hget", "hexists", "hscan", "hdel"),
                both=(k.registered_bots(), k.bot_key_hashes(), k.bot_names()),
            ),
            Grant(
                "heartbeats (its own, outside bots')",
                ("hset", "hdel", "hgetall"),
                both=beats,
            ),
            Grant(
                "quotas: the token-bucket script (its key, its commands)",
                (*SCRIPTS, "time", "hmget", "hset", "pexpire"),
                both=(k.quota("*", "*"),),
            ),
        ],
        "director": [
            Grant(
                "append to tournament logs (script and commands), read them",
                (*SCRIPTS, "xrevrange", "xrange", "xadd"),
                both=(tournament_log,),
            ),
            Grant("active tournaments", ("zrevrange", "zrem"), both=(k.active_tournaments(),)),
            Grant("how its games stand", ("xrevrange",), read=(log,)),
            send,
            Grant("heartbeats", ("hset", "hdel", "hgetall"), both=beats),
        ],
    }


def user_rules(user: str, password_hash: str, prefix: str) -> str:
    """One line of the ACL file."""
    head = f"user {user} on #{password_hash} resetchannels"
    if user == "operator":
        return f"{head} ~{prefix}:* {OPERATOR_RULES}"
    connection = " ".join(f"+{c}" for c in CONNECTION)
    # What they acknowledge waits for replicas (--ack-replicas).
    extra = " +wait" if user in ("engine", "projector", "dispatcher", "bots") else ""
    selectors = " ".join(g.selector() for g in grants(prefix)[user])
    return f"{head} -@all {connection}{extra} {selectors}"


def acl_file(passwords: dict[str, str], prefix: str) -> str:
    """The whole ACL file (Redis allows no comments in it)."""
    lines = ["user default off resetchannels -@all"]
    for user in USERS:
        digest = hashlib.sha256(passwords[user].encode()).hexdigest()
        lines.append(user_rules(user, digest, prefix))
    return "\n".join(lines) + "\n"


def env_file(user: str, password: str, host: str, port: int, prefix: str, secret: str) -> str:
    lines = [
        f"# Agon's Redis user {user!r} (agon acl --prefix {prefix}); keep this file private.",
        f"REDIS_URL=redis://{user}:{password}@{host}:{port}/0",
    ]
    if user in NEEDS_SECRET:
        lines.append(f"AGON_SECRET={secret}")
    elif user == "bots":  # signs the clocks of the turns it delivers, and nothing else
        lines.append(f"AGON_CLOCK_KEY={clock_key(secret.encode()).decode()}")
    return "\n".join(lines) + "\n"


def stored(path: Path) -> tuple[str | None, str | None]:
    """The password in an env file's REDIS_URL and its AGON_SECRET (None when absent)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path} to keep its password: {exc}") from None
    password = secret = None
    for line in text.splitlines():
        name, _, value = line.partition("=")
        if name.strip() == "REDIS_URL":
            try:
                password = urlsplit(value.strip()).password
            except ValueError:
                password = None
        elif name.strip() == "AGON_SECRET":
            secret = value.strip() or None
    return password, secret


def write_private(path: Path, text: str) -> None:
    """Write `path` readable by its owner only, replacing any old file in one step."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="DIR", help="where to write users.acl and <user>.env")
    parser.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help="the deployment's key prefix (default: agon)"
    )
    parser.add_argument(
        "--host", default="redis", help="Redis host in the services' URLs (default: redis)"
    )
    parser.add_argument("--port", default="6379", help="Redis port in the URLs (default: 6379)")
    how = "existing files are refused unless"
    parser.add_argument(
        "--force", action="store_true", help=f"{how} --force: replace them, new passwords"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help=f"{how} --keep: keep the passwords and AGON_SECRET of the env files there",
    )


def _checked(args: argparse.Namespace) -> tuple[Path, int]:
    if not args.out:
        raise UsageError("where to? pass --out DIR (users.acl and one <user>.env each go there)")
    if not PREFIX_RE.fullmatch(args.prefix):
        raise UsageError(
            f"--prefix may hold letters, digits and _ . : - only (it goes into key patterns), "
            f"not {args.prefix!r}"
        )
    if not HOST_RE.fullmatch(args.host):
        raise UsageError(f"--host must be a host name or address, not {args.host!r}")
    if not args.port.isdigit() or not 1 <= int(args.port) <= 65535:
        raise UsageError(f"--port must be a port number from 1 to 65535, not {args.port!r}")
    if args.force and args.keep:
        raise UsageError("--force makes new passwords and --keep keeps them: pass one")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is not a directory")
    return out, int(args.port)


def run(args: argparse.Namespace) -> int:
    out, port = _checked(args)
    targets = [out / "users.acl", *(out / f"{user}.env" for user in USERS)]
    existing = [path for path in targets if path.exists()]
    if existing and not (args.force or args.keep):
        raise UsageError(
            f"{existing[0]} exists: pass --keep to keep the passwords there, or --force to "
            "replace every password"
        )
    passwords: dict[str, str] = {}
    kept_secrets: set[str] = set()
    for user in USERS:
        path = out / f"{user}.env"
        password = None
        if args.keep and path.exists():
            password, secret = stored(path)
            if password is None or not PASSWORD_RE.fullmatch(password):
                raise UsageError(
                    f"{path} has no REDIS_URL with a password agon acl made: use --force"
                )
            if secret is not None:
                kept_secrets.add(secret)
        passwords[user] = password or secrets.token_urlsafe(32)
    if len(kept_secrets) > 1:
        raise UsageError(f"the env files in {out} hold different AGON_SECRETs: use --force")
    from_env = os.environ.get("AGON_SECRET", "")
    if kept_secrets:
        secret, source = kept_secrets.pop(), "kept"
    elif from_env:
        if not from_env.isprintable() or any(c.isspace() or c in "'\"$\\" for c in from_env):
            raise UsageError(
                "AGON_SECRET in this environment cannot go into an env file (spaces, quotes, "
                "$ or control characters): unset it, and one is generated"
            )
        secret, source = from_env, "taken from the environment"
    else:
        secret, source = new_secret().decode(), "generated"
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    for user in USERS:
        text = env_file(user, passwords[user], args.host, port, args.prefix, secret)
        write_private(out / f"{user}.env", text)
    write_private(out / "users.acl", acl_file(passwords, args.prefix))
    print(f"agon acl: wrote {out / 'users.acl'} and {', '.join(f'{u}.env' for u in USERS)}")
    print(f"  key prefix {args.prefix!r}; the services' URLs name {args.host}:{port}")
    print(f"  AGON_SECRET ({source}) is in the env files of {', '.join(sorted(NEEDS_SECRET))}")
    print(
        "  start Redis with --aclfile users.acl (it must be able to read the file) and give "
        "each service its <user>.env"
    )
    return 0
