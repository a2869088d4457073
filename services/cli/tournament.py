"""`agon tournament create|run|status|standings|cancel|list` and `agon match`.

`run` creates a tournament (or, with `--id`, picks up an existing one: that is how a
stopped one resumes) and directs it in this process until it ends, with a progress bar and
the live standings; then it prints the crosstable and the ratings. Without `--redis-url` it
runs a private Redis and every service (engine, projector, dispatcher, the bots' workers)
in this process too; with one it drives that deployment (`--services all` adds them here).
`match A B --sprt ELO0,ELO1` is a tournament of pairs that stops when the SPRT decides,
and prints a line after every pair. `--json` prints the final report as JSON instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from pydantic import ValidationError
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from bots import load_bot
from engine import game_names
from schemas.tournaments import FORMATS, SprtSpec, TournamentSpec, new_tournament_id
from services.bus.clients import QueryClient
from services.bus.connection import Client
from services.bus.embedded import _die_with_parent
from services.bus.keys import Keys
from services.bus.text import now_ms
from services.cli.common import (
    add_ack_arguments,
    add_service_arguments,
    add_wait_argument,
    again_after_failover,
    finish,
    logging_to,
    make_console,
    pipeline_missing,
    replicas_to_wait_for,
    say_missing,
    with_redis,
)
from services.cli.options import (
    UsageError,
    finite_float,
    game_options_or_usage,
    non_negative_float,
    parse_options,
    positive_float,
    positive_int,
    probability,
)
from services.cli.pipeline import ServiceSet
from services.stats.sprt import MODELS
from services.tournament.aggregate import Tournament
from services.tournament.director import Director, cancel
from services.tournament.report import standings_csv, summary, tournament_report
from services.tournament.store import TournamentExists, TournamentStore

#: How often `run` redraws.
REFRESH_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="tournament_command", required=True, metavar="ACTION")
    create = sub.add_parser("create", help="create a tournament (a director plays it)")
    run = sub.add_parser("run", help="create (or with --id resume) a tournament and direct it")
    for p in (create, run):
        add_service_arguments(p, private=p is run)
        add_wait_argument(p)
        _spec_arguments(p, required=p is create)
        p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    run.add_argument("--id", help="resume this tournament instead of creating one")
    _services_argument(run)
    for name, text in (
        ("status", "a tournament's progress"),
        ("standings", "standings, crosstable, pairs and ratings"),
        ("cancel", "cancel a tournament: its games still going are aborted"),
    ):
        p = sub.add_parser(name, help=text)
        add_service_arguments(p, private=False)
        add_wait_argument(p)
        p.add_argument("id", help="the tournament id")
        p.add_argument("--json", action="store_true", help="print JSON")
        if name == "standings":
            p.add_argument("--csv", action="store_true", help="print the standings as CSV")
    listing = sub.add_parser("list", help="every tournament, newest first")
    add_service_arguments(listing, private=False)
    add_wait_argument(listing)
    listing.add_argument("--json", action="store_true", help="print JSON")


def _spec_arguments(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--format", choices=[f for f in FORMATS if f != "match"], required=required)
    p.add_argument("--game", choices=game_names(), required=required, help="the game played")
    _game_arguments(p)
    p.add_argument("--bots", help="players, comma separated (a gauntlet: the challenger first)")
    p.add_argument("--rounds", type=positive_int, default=1, help="cycles or rounds (default 1)")


def _game_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--option", action="append", default=[], help="game option key=value")
    p.add_argument(
        "--move-time", type=positive_float, default=1.0, help="seconds per move (default 1)"
    )
    p.add_argument(
        "--time-bank", type=non_negative_float, default=0.0, help="seconds of bank per seat"
    )
    p.add_argument(
        "--on-timeout",
        choices=("forfeit", "random_move"),
        default="forfeit",
        help="a seat that overruns loses (forfeit, default) or gets a random move",
    )
    p.add_argument("--concurrency", type=positive_int, default=4, help="games at once")
    p.add_argument("--seed", type=int, default=0, help="the seed of every game's seed")


def _services_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--services",
        choices=("auto", "all", "none"),
        default="auto",
        help="run the engine, projector, dispatcher and bot workers here (all), or drive a "
        "deployment that runs them (none); auto: all without --redis-url, else none",
    )
    add_ack_arguments(p)


def add_match_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser)
    add_wait_argument(parser)
    parser.add_argument("a", help="the bot tested")
    parser.add_argument("b", help="its opponent")
    parser.add_argument("--game", choices=game_names(), required=True)
    _game_arguments(parser)
    parser.add_argument("--sprt", required=True, help="ELO0,ELO1: the hypotheses, e.g. 0,10")
    parser.add_argument(
        "--alpha", type=probability, default=0.05,
        help="the chance to accept H1 when H0 is true: a false 'stronger' (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--beta", type=probability, default=0.05,
        help="the chance to accept H0 when H1 is true: a missed 'stronger' (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--model", choices=MODELS, default="normalized",
        help="what ELO0,ELO1 are: normalized Elo (nElo, fishtest's default), logistic Elo, or"
        " BayesElo (cutechess-cli) (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--max-pairs", type=positive_int, default=1000,
        help="stop undecided after this many pairs (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--id", help="resume this match instead of starting one")
    parser.add_argument("--json", action="store_true", help="print the final report as JSON")
    _services_argument(parser)


# -- building a spec ----------------------------------------------------------------------------
def _spec(args: argparse.Namespace, fmt: str, bots: list[str], **extra: Any) -> TournamentSpec:
    options = parse_options(args.option)
    game_options_or_usage(args.game, options)
    for bot in bots:
        try:
            load_bot(bot)
        except ValueError as exc:  # an outside bot may play too: it needs no worker here
            if getattr(args, "services", "none") != "none" and not args.redis_url:
                raise UsageError(f"{exc}; outside bots need a deployment (--redis-url)") from None
    try:
        return TournamentSpec(
            format=fmt,  # type: ignore[arg-type]
            game=args.game,
            options=options,
            bots=bots,
            move_time_ms=round(args.move_time * 1000),
            time_bank_ms=round(args.time_bank * 1000),
            on_timeout=args.on_timeout,
            concurrency=args.concurrency,
            seed=args.seed,
            **extra,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UsageError(f"bad tournament: {first['msg']}") from None


def _bots(text: str | None) -> list[str]:
    bots = [b.strip() for b in (text or "").split(",") if b.strip()]
    if len(bots) < 2:
        raise UsageError("--bots wants at least two names, comma separated")
    return bots


def _sprt(args: argparse.Namespace) -> SprtSpec:
    parts = args.sprt.split(",")
    if len(parts) != 2:
        raise UsageError(f"--sprt wants ELO0,ELO1, e.g. 0,10; got {args.sprt!r}")
    try:
        elo0, elo1 = (finite_float(p) for p in parts)
        return SprtSpec(elo0=elo0, elo1=elo1, alpha=args.alpha, beta=args.beta, model=args.model)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--sprt {args.sprt}: {exc}") from None
    except ValidationError as exc:
        raise UsageError(f"--sprt {args.sprt}: {exc.errors()[0]['msg']}") from None


# -- running ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    action = getattr(args, "tournament_command", "match")
    if action in ("create", "run", "match") and not getattr(args, "id", None):
        if action == "match":
            spec = _spec(
                args, "match", [args.a, args.b], sprt=_sprt(args), max_pairs=args.max_pairs
            )
        else:
            if args.format is None or args.game is None:
                raise UsageError("a new tournament needs --format, --game and --bots")
            spec = _spec(args, args.format, _bots(args.bots), rounds=args.rounds)
    else:
        spec = None
    # Chosen once: a body run again after a failover creates the same tournament, not two.
    tid, created = getattr(args, "id", None) or new_tournament_id(), now_ms()
    if action in ("run", "match"):
        services = args.services == "all" or (args.services == "auto" and not args.redis_url)
        return with_redis(
            args,
            lambda redis, keys, url, stop: _run(
                redis, keys, url, stop, args, spec, services, tid, created
            ),
            serving=True,
        )

    async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
        store = TournamentStore(redis, keys)
        if action == "create":
            assert spec is not None
            await _create(store, tid, spec, created)
            print(json.dumps({"id": tid}) if args.json else tid)
            return 0
        if action == "list":
            rows = [summary(t) for t in await store.load_many(await store.ids()) if t]
            _print(args, rows, _list_table(rows))
            return 0
        t = await store.load(args.id)
        if t is None:
            print(f"agon tournament: no tournament {args.id}; see `agon tournament list`")
            return 1
        if action == "cancel":
            t = await cancel(store, t.id)
            print(f"tournament {t.id}: {t.ended.reason if t.ended else 'running'}")
            return 0
        rep = await tournament_report(redis, keys, t)
        if action == "standings" and args.csv:
            sys.stdout.write(standings_csv(rep))
        elif action == "status":
            _print(args, summary(t), _list_table([summary(t)]))
        else:
            _print(args, rep, Group(_standings(rep), _crosstable(rep), _ratings(rep)))
        return 0

    return with_redis(args, body, embedded=False, repeatable=True)


async def _create(store: TournamentStore, tid: str, spec: TournamentSpec, created: int) -> None:
    """Create tournament `tid` (a fresh id); a second try after a failover finds its log
    there and only makes sure it is listed."""
    try:
        await store.create(tid, spec, created)
    except TournamentExists:
        await store.index(tid, created)


def _print(args: argparse.Namespace, data: Any, table: Any) -> None:
    if args.json:
        print(json.dumps(data))
    else:
        make_console().print(table)


async def _run(
    redis: Client,
    keys: Keys,
    url: str,
    stop: asyncio.Event,
    args: argparse.Namespace,
    spec: TournamentSpec | None,
    services: bool,
    tid: str,
    created: int,
) -> int:
    missing = [] if services else await pipeline_missing(redis, keys)
    if missing:
        say_missing(args, url, missing)
        return 1
    store = TournamentStore(redis, keys)
    if spec is not None:
        await again_after_failover(args, lambda: _create(store, tid, spec, created))
    found = await again_after_failover(args, lambda: store.load(tid))
    if found is None:
        print(f"agon tournament: no tournament {tid}; see `agon tournament list`", file=sys.stderr)
        return 1
    t: Tournament = found
    console = make_console(stderr=args.json)
    kept = _kept(args)
    console.print(
        f"tournament {tid}: {_describe(t)}" + (f"; resume with {_resume(args, tid)}" * kept)
    )
    # Each bot thinks in a process of its own (a searching bot would hold the pipeline's
    # interpreter lock, and its clock, for as long as it thinks), and is serving before the
    # director creates the first game.
    replicas = await replicas_to_wait_for(redis, args) if services else 0
    acks = {"ack_replicas": replicas, "ack_timeout_ms": args.ack_timeout_ms}
    running = ServiceSet(redis, keys, [], director=False, **acks) if services else None
    workers: list[asyncio.subprocess.Process] = []
    if running is not None:
        await running.start()
        workers = await _bot_processes(url, redis, keys, t.spec.bots, acks)
    director = Director(redis, keys, only=tid)
    await director.setup()
    directing = asyncio.ensure_future(director.run(stop))
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
    )
    task = progress.add_task("games", total=None)
    pairs_seen, shown = 0, ""
    try:
        with (
            logging_to(console),
            Live(progress, console=console, refresh_per_second=4, transient=True) as live,
        ):
            while True:
                t, rep = await again_after_failover(args, lambda: _progress(redis, keys, tid))
                progress.update(
                    task, completed=rep["games"]["finished"], total=rep["games"]["scheduled"]
                )
                live.update(Group(progress, _standings(rep)))
                if "sprt" in rep:
                    pairs_seen = _print_pairs(console, rep, pairs_seen)
                elif _piped(console, rep) and _progress_line(rep) != shown:
                    shown = _progress_line(rep)
                    console.print(shown)
                if t.ended is not None or stop.is_set() or directing.done():
                    break
                await asyncio.sleep(REFRESH_S)
    finally:
        stop.set()
        await _stop_processes(workers)
        await finish([directing], 1.0)
        if running is not None:
            await running.stop()
    if t.ended is None:
        if kept:
            console.print(f"stopped; resume with: {_resume(args, tid)}")
        else:
            console.print("stopped; its private Redis goes with it (--redis-url keeps one)")
        return 130
    if args.json:
        print(json.dumps(rep))
    else:
        console.print(f"ended: {_ending(t, rep)}")
        console.print(_standings(rep), _crosstable(rep), _ratings(rep))
    return 0


def _kept(args: argparse.Namespace) -> bool:
    """Whether the Redis played on outlives this command (not a private one)."""
    return bool(args.redis_url)


def _resume(args: argparse.Namespace, tid: str) -> str:
    """The command that picks tournament `tid` up again."""
    if getattr(args, "tournament_command", "match") == "match":
        return f"agon match {args.a} {args.b} --game {args.game} --sprt {args.sprt} --id {tid}"
    return f"agon tournament run --id {tid}"


async def _progress(redis: Client, keys: Keys, tid: str) -> tuple[Tournament, dict[str, Any]]:
    """The tournament and its report, as `run` shows them."""
    t = await TournamentStore(redis, keys).load(tid)
    assert t is not None
    return t, await tournament_report(redis, keys, t)


async def _bot_processes(
    url: str, redis: Client, keys: Keys, bots: list[str], acks: dict[str, int]
) -> list[asyncio.subprocess.Process]:
    """`agon bots --bot B` for each bot, on this Redis, waiting for the replicas the other
    services wait for (`acks`); returns once each has a worker."""
    procs = []
    for bot in bots:
        command = ["bots", "--bot", bot, "--redis-url", url, "--prefix", keys.prefix]
        command += ["--partitions", str(keys.partitions)]
        command += ["--ack-replicas", str(acks["ack_replicas"])]
        command += ["--ack-timeout-ms", str(acks["ack_timeout_ms"])]
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.cli",
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # not left behind by an exit forced at once
            )
        )
    query = QueryClient(redis, keys)
    deadline = asyncio.get_running_loop().time() + 60
    for bot in bots:
        while (await query.bot_health(bot)).workers == 0:
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"the worker of bot {bot} did not start")
            await asyncio.sleep(0.05)
    return procs


async def _stop_processes(procs: list[asyncio.subprocess.Process], timeout_s: float = 2.0) -> None:
    """SIGTERM each, then SIGKILL those still running after `timeout_s`; all reaped."""
    for proc in procs:
        if proc.returncode is None:
            proc.terminate()
    waiting = [asyncio.ensure_future(proc.wait()) for proc in procs]
    if waiting and (await asyncio.wait(waiting, timeout=timeout_s))[1]:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        await asyncio.wait(waiting, timeout=timeout_s)


def _describe(t: Tournament) -> str:
    s = t.spec
    opts = "".join(f" {k}={v}" for k, v in s.options.items())
    return f"{s.format} of {s.game}{opts}, {', '.join(s.bots)}, {s.move_time_ms / 1000:g} s/move"


def _print_pairs(console: Console, rep: dict[str, Any], seen: int) -> int:
    """After every new complete pair of a match, a line: its LLR with the bounds, and for
    the newest the pairs' pentanomial, then the W-L-D of the games ended so far, Elo ±
    error and LOS."""
    sprt = rep["sprt"]
    llrs = sprt["trajectory"]
    bounds = f"[{sprt['lower']:.2f}, {sprt['upper']:.2f}]"
    for n in range(seen, len(llrs)):
        line = f"pair {n + 1}: LLR {llrs[n]:.2f} {bounds}"
        pair = rep["pairs"][0] if rep["pairs"] else None
        if n == len(llrs) - 1 and pair is not None:
            line += f"; {n + 1} pair{'s' * (n > 0)} penta {sprt['penta']}"
            games = pair["wins"] + pair["losses"] + pair["draws"]
            line += f"; {games} games W-L-D {pair['wins']}-{pair['losses']}-{pair['draws']}"
            if pair["elo"] is not None:
                line += f", Elo {pair['elo']:+.1f} ± {pair['elo_error']:.1f}"
                line += f", LOS {pair['los']:.1%}"
        console.print(line)
    return len(llrs)


def _piped(console: Console, rep: dict[str, Any]) -> bool:
    """Whether progress is printed line by line: not to a terminal, once games are paired."""
    return not console.is_terminal and rep["games"]["scheduled"] > 0


def _progress_line(rep: dict[str, Any]) -> str:
    """The progress as one line, for output that is not a terminal (no bar there)."""
    games = rep["games"]
    points = ", ".join(f"{s['name']} {s['points']:g}" for s in rep["standings"])
    return f"games {games['finished']}/{games['scheduled']} ended; points: {points}"


def _ending(t: Tournament, rep: dict[str, Any]) -> str:
    """How the tournament ended; for a match, which bot is the stronger."""
    assert t.ended is not None
    reason, detail = t.ended.reason, t.ended.detail
    if t.spec.format != "match" or reason not in ("h0", "h1", "max-pairs"):
        return f"{reason} {detail}"
    a, b = t.spec.bots[0], t.spec.bots[1]
    pair = rep["pairs"][0] if rep["pairs"] else {}
    elo = ""
    if pair.get("elo") is not None:
        elo = f" (Elo {pair['elo']:+.1f} ± {pair['elo_error']:.1f})"
    elo1 = rep["sprt"]["elo1"]
    if reason == "h1":
        return f"H1 accepted — {a} is stronger than {b}{elo}; {detail}"
    if reason == "h0":
        return f"H0 accepted — {a} is not {elo1:g} Elo stronger than {b}{elo}; {detail}"
    return f"undecided — no hypothesis accepted{elo}; {detail}"


# -- tables -------------------------------------------------------------------------------------
def _list_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("id", "format", "game", "bots", "status", "games")
    for r in rows:
        status = r["status"] + (f" ({r['ended']})" if r["ended"] else "")
        table.add_row(
            r["id"], r["format"], r["game"], ", ".join(r["bots"]), status,
            f"{r['finished']}/{r['games']}",
        )  # fmt: skip
    return table


def _standings(rep: dict[str, Any]) -> Table:
    """The standings; the tie-breaks (Buchholz, Sonneborn-Berger) only with more than two
    players, where they can break a tie."""
    breaks = len(rep["spec"]["bots"]) > 2
    columns = ["#", "bot", "points", "games", "W", "L", "D"]
    table = Table(*columns, *(["Buchholz", "SB"] * breaks), title="standings")
    for s in rep["standings"]:
        row = [
            str(s["rank"]), s["name"], f"{s['points']:g}", str(s["games"]), str(s["wins"]),
            str(s["losses"]), str(s["draws"]),
        ]  # fmt: skip
        if breaks:
            row += [f"{s['buchholz']:g}", f"{s['sonneborn_berger']:g}"]
        table.add_row(*row)
    return table


def _crosstable(rep: dict[str, Any]) -> Table:
    bots = rep["spec"]["bots"]
    table = Table("", *bots, title="crosstable (W-L-D of the row against the column)")
    for a in bots:
        row = rep["crosstable"].get(a, {})
        cells = []
        for b in bots:
            c = row.get(b)
            cells.append("·" if c is None else f"{c['wins']}-{c['losses']}-{c['draws']}")
        table.add_row(a, *cells)
    return table


def _ratings(rep: dict[str, Any]) -> Table:
    table = Table("bot", "rating", "deviation", "games", title="Glicko-2 ratings")
    for board in rep["ratings"]:
        for r in board["rows"]:
            mark = " (provisional)" if r["provisional"] else ""
            table.add_row(
                r["name"], f"{r['rating']:.0f}{mark}", f"{r['deviation']:.0f}", str(r["games"])
            )
    return table


class _Match:
    """`agon match`: a match between two bots until the SPRT decides."""

    add_arguments = staticmethod(add_match_arguments)
    run = staticmethod(run)


MATCH = _Match()
