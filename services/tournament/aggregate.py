"""The tournament aggregate: its log folded (`Tournament`), and what comes next (`decide`).

Pure: no Redis, no clock of its own. `decide` gets the folded log and what the games'
own logs say (which scheduled games exist, how the ended ones ended) and returns the
events that follow: results recorded, platform-ended games scheduled again, the next
round paired, the end. The same log and the same game ends give the same events, which
is what makes a director resumable: kill it anywhere, start it again, and it decides
what it would have decided.

Round robin and gauntlet pair every round at once (their schedule depends on no result);
Swiss pairs a round when the one before is fully recorded; a match keeps up to half its
concurrency of pairs going until its SPRT decides or `max_pairs` is reached.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.events import PLATFORM_REASONS
from schemas.tournaments import (
    GameRecorded,
    GameScheduled,
    Pairing,
    RoundPaired,
    SprtSpec,
    TournamentCreated,
    TournamentEnded,
    TournamentSpec,
)
from services.stats.sprt import Pentanomial, Sprt, SprtStatus
from services.stats.standings import GameResult, pair_stats, standings
from services.tournament import pairing

#: A scheduled game ended by the platform is played again at most this many times.
MAX_REPLAYS = 3

Event = TournamentCreated | RoundPaired | GameScheduled | GameRecorded | TournamentEnded


@dataclass(frozen=True, slots=True)
class End:
    """How a game ended, as its log's `GameEnded` says."""

    winner: int
    reason: str
    fault: int = 0


@dataclass
class Slot:
    """A scheduled game and, once it ended, its record."""

    scheduled: GameScheduled
    recorded: GameRecorded | None = None


@dataclass
class Tournament:
    """A tournament's log, folded."""

    id: str
    created: TournamentCreated
    seq: int = 1
    rounds: dict[int, RoundPaired] = field(default_factory=dict)
    #: every scheduled game, in schedule order
    games: dict[str, Slot] = field(default_factory=dict)
    ended: TournamentEnded | None = None

    @classmethod
    def fold(cls, events: Sequence[Event]) -> Tournament:
        if not events or not isinstance(events[0], TournamentCreated):
            raise ValueError("a tournament's log starts with its TournamentCreated")
        first = events[0]
        t = cls(first.tournament_id, first)
        for ev in events[1:]:
            t.apply(ev)
        return t

    @property
    def spec(self) -> TournamentSpec:
        return self.created.spec

    def apply(self, ev: Event) -> None:
        if ev.seq != self.seq + 1:
            raise ValueError(f"tournament {self.id}: event seq {ev.seq} after {self.seq}")
        self.seq = ev.seq
        if isinstance(ev, RoundPaired):
            self.rounds[ev.round] = ev
        elif isinstance(ev, GameScheduled):
            self.games[ev.game_id] = Slot(ev)
        elif isinstance(ev, GameRecorded):
            self.games[ev.game_id].recorded = ev
        elif isinstance(ev, TournamentEnded):
            self.ended = ev
        else:
            raise ValueError(f"tournament {self.id}: unexpected {ev.type} at seq {ev.seq}")

    def pending(self) -> list[GameScheduled]:
        """Scheduled games not recorded yet, in schedule order."""
        return [s.scheduled for s in self.games.values() if s.recorded is None]

    def results(self, *, counted_only: bool = True) -> list[GameResult]:
        """The recorded games as results (by default only those that count)."""
        out = []
        for slot in self.games.values():
            rec, sch = slot.recorded, slot.scheduled
            if rec is None or (counted_only and rec.reason in PLATFORM_REASONS):
                continue
            out.append(
                GameResult(
                    game_id=sch.game_id,
                    game=self.spec.game,
                    options=tuple(sorted(self.spec.options.items())),
                    players=(sch.seats[0], sch.seats[1]),
                    winner=rec.winner,
                    reason=rec.reason,
                    ended_ms=rec.time,
                    pair=sch.encounter,
                    round=sch.round,
                    fault=rec.fault,
                )
            )
        return out

    def byes(self) -> dict[str, int]:
        byes: dict[str, int] = {}
        for paired in self.rounds.values():
            for p in paired.pairings:
                if p.second is None:
                    byes[p.first] = byes.get(p.first, 0) + 1
        return byes

    def scored_byes(self) -> dict[str, int]:
        """Byes worth a point: Swiss ones (in a round robin everyone sits out alike)."""
        return self.byes() if self.spec.format == "swiss" else {}

    def sprt(self) -> SprtStatus | None:
        """A match's test on its complete pairs so far (None for other formats)."""
        spec = self.spec
        if spec.sprt is None:
            return None
        penta = pair_stats(self.results(), spec.bots[0], spec.bots[1]).penta
        return sprt_test(spec.sprt).status(Pentanomial(penta))


def sprt_test(s: SprtSpec) -> Sprt:
    return Sprt(s.elo0, s.elo1, s.alpha, s.beta, s.model)


def game_id(tournament_id: str, rnd: int, index: int, leg: int) -> str:
    return f"{tournament_id}.{rnd}.{index}.{leg}"


def encounter_seed(spec: TournamentSpec, rnd: int, index: int) -> int:
    """The seed both games of an encounter share: from the tournament's seed and place."""
    return zlib.crc32(f"{spec.seed}:{rnd}:{index}".encode())


class _Out:
    """Events as they are decided, each folded into the tournament at once."""

    def __init__(self, t: Tournament, now: int) -> None:
        self.t, self.now, self.events = t, now, list[Event]()

    def emit(self, cls: type[Event], **fields: Any) -> None:
        ev = cls(tournament_id=self.t.id, seq=self.t.seq + 1, time=self.now, **fields)
        self.t.apply(ev)
        self.events.append(ev)

    def pair(self, rnd: int, pairings: Sequence[pairing.Pairing]) -> None:
        """A round and its games: two per encounter, seats swapped (Swiss: one)."""
        self.emit(
            RoundPaired,
            round=rnd,
            pairings=[
                Pairing(first=p.first, second=p.second, relaxed=list(p.relaxed)) for p in pairings
            ],
        )
        legs = 1 if self.t.spec.format == "swiss" else 2
        for index, p in enumerate(pairings, start=1):
            if p.second is None:
                continue
            seats = [p.first, p.second]
            for leg in range(1, legs + 1):
                self.emit(
                    GameScheduled,
                    game_id=game_id(self.t.id, rnd, index, leg),
                    round=rnd,
                    encounter=f"{rnd}.{index}",
                    leg=leg,
                    seats=seats if leg == 1 else seats[::-1],
                    seed=encounter_seed(self.t.spec, rnd, index),
                )


def decide(t: Tournament, ends: Mapping[str, End], now: int) -> list[Event]:
    """The events that follow `t`, given how its ended games ended (`ends`, by game id).

    Folds them into `t` as it goes; an empty list when nothing is to be done yet.
    """
    out = _Out(t, now)
    if t.ended is not None:
        return []
    for sch in t.pending():
        end = ends.get(sch.game_id)
        if end is None:
            continue
        out.emit(
            GameRecorded, game_id=sch.game_id, winner=end.winner, reason=end.reason, fault=end.fault
        )
        replays = sch.game_id.count(".x")
        if end.reason in PLATFORM_REASONS and replays < MAX_REPLAYS:
            original = sch.replay_of or sch.game_id
            out.emit(
                GameScheduled,
                **{
                    **sch.model_dump(include={"round", "encounter", "leg", "seats", "seed"}),
                    "game_id": f"{original}.x{replays + 1}",
                    "replay_of": original,
                },
            )
    spec = t.spec
    if spec.format == "match":
        _match(out)
    elif not t.rounds:
        if spec.format == "round-robin":
            per_cycle = len(spec.bots) - 1 + len(spec.bots) % 2  # an odd field adds a bye
            schedule = pairing.round_robin(spec.bots, spec.rounds * per_cycle)
        elif spec.format == "gauntlet":
            schedule = pairing.gauntlet(spec.bots[0], spec.bots[1:], spec.rounds)
        else:
            schedule = [_swiss_round(t) or []]
        for rnd, pairings in enumerate(schedule, start=1):
            out.pair(rnd, pairings)
    elif not t.pending():
        last = max(t.rounds)
        if spec.format != "swiss" or last >= spec.rounds:
            out.emit(TournamentEnded, reason="completed", detail=f"{len(t.games)} games")
        else:
            swiss = _swiss_round(t)
            if swiss is None:
                detail = f"no pairing without a rematch or a second bye for round {last + 1}"
                out.emit(TournamentEnded, reason="no-pairing", detail=detail)
            else:
                out.pair(last + 1, swiss)
    return out.events


def _swiss_round(t: Tournament) -> list[pairing.Pairing] | None:
    """The next Swiss round from the record so far (scores of counted games, byes)."""
    points = {s.name: s.points for s in standings(t.results(), t.spec.bots, t.byes())}
    met: dict[str, list[str]] = {b: [] for b in t.spec.bots}
    colours: dict[str, list[int]] = {b: [] for b in t.spec.bots}
    for rnd in sorted(t.rounds):
        for p in t.rounds[rnd].pairings:
            if p.second is not None:
                met[p.first].append(p.second)
                met[p.second].append(p.first)
                colours[p.first].append(1)
                colours[p.second].append(2)
    byes = t.byes()
    players = [
        pairing.SwissPlayer(b, points[b], tuple(met[b]), tuple(colours[b]), byes.get(b, 0))
        for b in t.spec.bots
    ]
    return pairing.swiss_round(players)


def _match(out: _Out) -> None:
    """Keep pairs going until the SPRT decides, or stop at `max_pairs`."""
    t, spec = out.t, out.t.spec
    status = t.sprt()
    assert status is not None
    if status.verdict != "continue":
        detail = (
            f"LLR {status.llr:.3f} outside [{status.lower_bound:.3f}, {status.upper_bound:.3f}]"
        )
        out.emit(TournamentEnded, reason="h1" if status.verdict == "H1" else "h0", detail=detail)
        return
    going = {s.encounter for s in t.pending()}
    while len(going) < math.ceil(spec.concurrency / 2) and len(t.rounds) < spec.max_pairs:
        rnd = len(t.rounds) + 1
        out.pair(rnd, [pairing.Pairing(spec.bots[0], spec.bots[1])])
        going.add(f"{rnd}.1")
    if not going:
        detail = f"undecided after {len(t.rounds)} pairs: LLR {status.llr:.3f}"
        out.emit(TournamentEnded, reason="max-pairs", detail=detail)
