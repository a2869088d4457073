"""A tournament's results and the leaderboards, read from the results read models.

The records are the projector's (`projector.models.Results`: one per finished game, in its
partition, never an imported one's); this module reads them from every partition and
turns them into what people look at, through the pure functions of
`services.stats.standings`: standings with tie-breaks, the crosstable, terminations and
faults, per-bot health, each pair's Elo with error bars, LOS and pentanomial counts,
Glicko-2 ratings, and a match's SPRT. The records come through `QueryClient` (its
`results`, `tournament_results` and `heads`); this module spells no key. Leaderboards replay
every record of a game's rules, so the gateway computes them once per
`QueryClient.results_version` (`gateway.leaderboards.Leaderboards`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Sequence
from dataclasses import asdict
from typing import Any

from schemas.views import ResultRecord
from services.bus.clients import QueryClient
from services.bus.connection import Client
from services.bus.keys import Keys
from services.stats.sprt import Pentanomial
from services.stats.standings import (
    GameResult,
    crosstable,
    faults,
    health,
    pair_stats,
    ratings,
    standings,
    terminations,
)
from services.tournament.aggregate import Tournament, sprt_test


def parse_record(data: bytes, pairs: dict[str, tuple[str, int]] | None = None) -> GameResult:
    """A result record (`projector.models.result_record`) as a `GameResult`; `pairs` gives
    each game's encounter and round, from the tournament's log."""
    r = ResultRecord.model_validate_json(data)
    pair, rnd = (pairs or {}).get(r.game_id, ("", 0))
    think, lag = r.think_ms, r.lag_ms or ([], [])
    return GameResult(
        game_id=r.game_id,
        game=r.game,
        options=tuple(r.options),
        players=r.players,
        winner=r.winner,
        reason=r.reason,
        ended_ms=r.ended,
        think_ms=(tuple(think[0]), tuple(think[1])),
        lag_ms=(tuple(lag[0]), tuple(lag[1])),
        pair=pair,
        round=rnd,
        fault=r.fault,
        people=tuple(r.people or ()),
    )


async def scheduled_results(query: QueryClient, t: Tournament) -> list[GameResult]:
    """Every finished game of `t`, from the read models, in the order they ended. Only the
    games `t` scheduled count: a game that merely names the tournament (its `GameCreated`
    is anyone's to write in a log) is no result of it."""
    pairs = {gid: (s.scheduled.encounter, s.scheduled.round) for gid, s in t.games.items()}
    records = await query.tournament_results(t.id)
    out = [r for r in (parse_record(r, pairs) for r in records) if r.game_id in pairs]
    return sorted(out, key=lambda r: (r.ended_ms, r.game_id))


async def started(query: QueryClient, t: Tournament) -> set[str]:
    """The scheduled games not recorded yet that exist (have a log): the rest still wait
    for the director to create them."""
    ids = [gid for gid, s in t.games.items() if s.recorded is None]
    heads = await query.heads(ids) if ids else []
    return {gid for gid, head in zip(ids, heads, strict=True) if head}


async def report_of(query: QueryClient, t: Tournament) -> dict[str, Any]:
    """`report` of `t` with its results and started games read through `query`."""
    return report(t, await scheduled_results(query, t), await started(query, t))


async def tournament_results(redis: Client, keys: Keys, t: Tournament) -> list[GameResult]:
    """`scheduled_results` for a caller holding a connection (the CLI, the tests)."""
    return await scheduled_results(QueryClient(redis, keys), t)


async def tournament_report(redis: Client, keys: Keys, t: Tournament) -> dict[str, Any]:
    """`report_of` for a caller holding a connection (the CLI, the tests)."""
    return await report_of(QueryClient(redis, keys), t)


async def game_results(redis: Client, keys: Keys, game: str) -> list[GameResult]:
    """Every finished game of the rules `game` between two named players."""
    return _sorted_results(await QueryClient(redis, keys).results(game))


def _sorted_results(records: Sequence[bytes]) -> list[GameResult]:
    return sorted((parse_record(r) for r in records), key=lambda r: (r.ended_ms, r.game_id))


def ranked(records: Sequence[bytes], now_ms: int | None = None) -> list[dict[str, Any]]:
    """`leaderboards` of result records: the costly part (every record parsed, Glicko-2
    replayed over all of them), which the gateway runs in a thread, once per version."""
    return leaderboards(_sorted_results(records), now_ms)


def leaderboards(results: Sequence[GameResult], now_ms: int | None = None) -> list[dict[str, Any]]:
    """Glicko-2 leaderboards per rules and options, as JSON-ready rows."""
    return [
        {
            "game": game,
            "options": dict(options),
            "rows": [asdict(row) for row in rows],
        }
        for (game, options), rows in sorted(ratings(results, now_ms=now_ms).items())
    ]


def summary(t: Tournament) -> dict[str, Any]:
    """A tournament in a line of a list."""
    pending = len(t.pending())
    return {
        "id": t.id,
        "name": t.spec.name,
        "format": t.spec.format,
        "game": t.spec.game,
        "bots": t.spec.bots,
        "created": t.created.time,
        "status": "ended" if t.ended else "running",
        "ended": None if t.ended is None else t.ended.reason,
        "rounds": len(t.rounds),
        "games": len(t.games),
        "finished": len(t.games) - pending,
    }


def report(
    t: Tournament, results: Sequence[GameResult], started: Collection[str] = ()
) -> dict[str, Any]:
    """Everything a tournament page shows, JSON-ready. Each scheduled game's `status`:
    `ended` once it ended, `playing` once created (`started` names those not recorded yet),
    else `waiting`."""
    ended = {r.game_id for r in results}
    spec = t.spec
    counted = [r for r in results if r.counts]
    table = standings(counted, spec.bots, t.scored_byes())
    cross = crosstable(counted)
    pairs = []
    for i, a in enumerate(spec.bots):
        for b in spec.bots[i + 1 :]:
            stats = pair_stats(counted, a, b)
            if stats.games:
                pairs.append(_pair(stats))
    pending = t.pending()
    out: dict[str, Any] = {
        "id": t.id,
        "spec": spec.model_dump(mode="json"),
        "created": t.created.time,
        "status": "ended" if t.ended else "running",
        "ended": None if t.ended is None else t.ended.model_dump(include={"reason", "detail"}),
        "rounds": len(t.rounds),
        "games": {
            "scheduled": len(t.games),
            "finished": len(t.games) - len(pending),
            "pending": len(pending),
        },
        "schedule": [
            {
                "game_id": s.scheduled.game_id,
                "round": s.scheduled.round,
                "seats": s.scheduled.seats,
                "replay_of": s.scheduled.replay_of,
                "status": "ended"
                if s.recorded is not None or s.scheduled.game_id in ended
                else "playing"
                if s.scheduled.game_id in started
                else "waiting",
                "result": None if s.recorded is None else s.recorded.winner,
                "reason": None if s.recorded is None else s.recorded.reason,
            }
            for s in t.games.values()
        ],
        "byes": t.byes(),
        "standings": [asdict(s) for s in table],
        "crosstable": {a: {b: asdict(cell) for b, cell in row.items()} for a, row in cross.items()},
        "terminations": terminations(results),
        "faults": faults(results),
        "health": {name: asdict(h) for name, h in health(results).items()},
        "pairs": pairs,
        "ratings": leaderboards(counted),
    }
    if spec.sprt is not None:
        out["sprt"] = _sprt_trajectory(t, counted)
    return out


def _pair(stats: Any) -> dict[str, Any]:
    elo = stats.elo
    return {
        "a": stats.a,
        "b": stats.b,
        "wins": stats.wins,
        "losses": stats.losses,
        "draws": stats.draws,
        "penta": list(stats.penta),
        "elo": None if elo is None else elo.elo,
        "elo_error": None if elo is None else elo.elo_error,
        "los": None if elo is None else elo.los,
    }


def _sprt_trajectory(t: Tournament, counted: Sequence[GameResult]) -> dict[str, Any]:
    """A match's LLR after each complete pair, in the order pairs completed."""
    spec = t.spec
    assert spec.sprt is not None
    s = spec.sprt
    test = sprt_test(s)
    a = spec.bots[0]
    by_pair: dict[str, list[GameResult]] = {}
    for r in counted:
        by_pair.setdefault(r.pair, []).append(r)
    done = sorted(
        (games for games in by_pair.values() if len(games) == 2),
        key=lambda games: max(g.ended_ms for g in games),
    )
    penta = [0] * 5
    llrs = []
    for games in done:
        points = sum(g.score(g.seat_of(a) or 1) for g in games)
        penta[int(points * 2)] += 1
        llrs.append(
            test.status(Pentanomial((penta[0], penta[1], penta[2], penta[3], penta[4]))).llr
        )
    status = test.status(Pentanomial((penta[0], penta[1], penta[2], penta[3], penta[4])))
    return {
        "elo0": s.elo0,
        "elo1": s.elo1,
        "alpha": s.alpha,
        "beta": s.beta,
        "model": s.model,
        "llr": status.llr,
        "lower": status.lower_bound,
        "upper": status.upper_bound,
        "verdict": str(status.verdict),
        "penta": penta,
        "trajectory": llrs,
    }


CSV_FIELDS = ("rank", "name", "points", "games", "wins", "losses", "draws", "buchholz",
              "sonneborn_berger")  # fmt: skip


def standings_csv(rep: dict[str, Any]) -> str:
    """The standings of a `report` as CSV, one row per player."""
    out = io.StringIO()
    writer = csv.DictWriter(out, CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rep["standings"]:
        writer.writerow(row)
    return out.getvalue()
