"""The tournament aggregate without Redis: schedules, records, replays, Swiss rounds, the
SPRT of a match, and resuming from any prefix of the log."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.tournaments import (
    GameRecorded,
    GameScheduled,
    RoundPaired,
    SprtSpec,
    TournamentCreated,
    TournamentEnded,
    TournamentSpec,
)
from services.tournament.aggregate import End, Event, Tournament, decide

#: Decides a game's end from its seats: (seat 1, seat 2) -> End.
Judge = Callable[[GameScheduled], End]


def create(spec: TournamentSpec, tid: str = "t1") -> Tournament:
    created = TournamentCreated(tournament_id=tid, seq=1, time=0, spec=spec, command_id="c")
    return Tournament.fold([created])


def play_out(
    t: Tournament, judge: Judge, *, max_passes: int = 10_000, passes: list[int] | None = None
) -> list[Event]:
    """Run the aggregate as a director would: every pending game ends as `judge` says,
    a pass at a time; returns the whole log (and in `passes` the length after each pass:
    a pass's events are appended at once, so a log ends only there)."""
    log: list[Event] = [t.created]
    ends: dict[str, End] = {}
    for n in range(max_passes):
        events = decide(t, ends, now=n)
        log += events
        if passes is not None:
            passes.append(len(log))
        if t.ended is not None:
            return log
        # Of the pending games, a few end each pass (games end in any order).
        for g in t.pending()[:3]:
            ends[g.game_id] = judge(g)
    raise AssertionError("the tournament never ended")


def stronger_wins(g: GameScheduled) -> End:
    """The bot whose name sorts first always wins."""
    return End(1 if g.seats[0] < g.seats[1] else 2, "natural")


def spec(fmt: str, bots: list[str], **kw: object) -> TournamentSpec:
    return TournamentSpec.model_validate({"format": fmt, "game": "teeko", "bots": bots, **kw})


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("cycles", [1, 2])
def test_a_round_robin_plays_every_encounter_as_a_pair_with_seats_swapped(
    n: int, cycles: int
) -> None:
    bots = [f"b{i}" for i in range(n)]
    log = play_out(create(spec("round-robin", bots, rounds=cycles)), stronger_wins)
    scheduled = [e for e in log if isinstance(e, GameScheduled)]
    assert len(scheduled) == n * (n - 1) * cycles  # C(n, 2) encounters, 2 games, per cycle
    by_encounter: dict[str, list[GameScheduled]] = {}
    for g in scheduled:
        by_encounter.setdefault(g.encounter, []).append(g)
    for games in by_encounter.values():
        first, second = games
        assert first.seats == second.seats[::-1] and first.seed == second.seed
    meetings = Counter(frozenset(g.seats) for g in scheduled)
    assert set(meetings.values()) == {2 * cycles} and len(meetings) == n * (n - 1) // 2
    assert len({g.game_id for g in scheduled}) == len(scheduled)
    end = log[-1]
    assert isinstance(end, TournamentEnded) and end.reason == "completed"
    assert sum(isinstance(e, GameRecorded) for e in log) == len(scheduled)


def test_a_game_the_platform_ended_is_played_again_and_not_scored() -> None:
    t = create(spec("gauntlet", ["champ", "a", "b"]))
    aborted: set[str] = set()

    def judge(g: GameScheduled) -> End:
        if g.replay_of is None and g.leg == 1 and len(aborted) < 2:
            aborted.add(g.game_id)
            return End(0, "interrupted")
        return stronger_wins(g)

    log = play_out(t, judge)
    replays = [e for e in log if isinstance(e, GameScheduled) and e.replay_of]
    assert sorted(r.replay_of or "" for r in replays) == sorted(aborted)
    for r in replays:
        original = t.games[r.replay_of or ""].scheduled
        assert (r.seats, r.seed, r.encounter, r.leg) == (
            original.seats,
            original.seed,
            original.encounter,
            original.leg,
        )
    results = t.results()
    assert len(results) == 4  # 2 encounters x 2 games; the interrupted ones do not count
    assert not any(r.game_id in aborted for r in results)


def test_a_swiss_tournament_pairs_a_round_only_when_the_last_is_recorded() -> None:
    t = create(spec("swiss", [f"p{i}" for i in range(7)], rounds=4))
    decide(t, {}, 0)
    assert list(t.rounds) == [1] and len(t.pending()) == 3  # 7 players: 3 games and a bye
    first = t.pending()[0]
    decide(t, {first.game_id: End(1, "natural")}, 1)
    assert list(t.rounds) == [1]  # two games still going
    log = play_out(t, stronger_wins)
    end = log[-1]
    assert isinstance(end, TournamentEnded) and end.reason in ("completed", "no-pairing")
    met = Counter(frozenset(g.seats) for g in (s.scheduled for s in t.games.values()))
    assert max(met.values()) == 1  # never a rematch
    assert max(t.byes().values()) == 1 and sum(t.byes().values()) == len(t.rounds)


def test_swiss_ends_cleanly_when_no_pairing_is_left() -> None:
    # Three players, many rounds: after everyone met everyone (and had a bye), none is left.
    log = play_out(create(spec("swiss", ["a", "b", "c"], rounds=10)), stronger_wins)
    end = log[-1]
    assert isinstance(end, TournamentEnded) and end.reason == "no-pairing", end
    assert len([e for e in log if isinstance(e, RoundPaired)]) == 3


def test_a_match_stops_when_its_sprt_accepts() -> None:
    sprt = SprtSpec(elo0=0, elo1=100)
    rng = random.Random(5)

    def a_much_better(g: GameScheduled) -> End:
        a_seat = g.seats.index("a") + 1
        return End(a_seat if rng.random() < 0.9 else 3 - a_seat, "natural")

    t = create(spec("match", ["a", "b"], sprt=sprt, concurrency=4))
    log = play_out(t, a_much_better)
    end = log[-1]
    assert isinstance(end, TournamentEnded) and end.reason == "h1", end
    status = t.sprt()
    assert status is not None and status.llr > status.upper_bound

    def coin(g: GameScheduled) -> End:
        return End(rng.choice([1, 2]), "natural")

    t = create(spec("match", ["a", "b"], sprt=sprt, max_pairs=5))
    end = play_out(t, coin)[-1]
    assert isinstance(end, TournamentEnded) and end.reason in ("max-pairs", "h0")
    assert len(t.rounds) <= 5


def test_a_match_whose_results_are_beyond_both_bounds_plays_on_to_its_last_pair() -> None:
    """Every game won against bounds as far apart as Elo 0 and 1000 leaves the likelihood
    ratio undefined (`agon match greedy random --sprt 0,1000`): no verdict and no crash of
    the director's pass; the match ends at its pair limit."""
    t = create(spec("match", ["a", "b"], sprt=SprtSpec(elo0=0, elo1=1000), max_pairs=3))
    end = play_out(t, lambda g: End(g.seats.index("a") + 1, "natural"))[-1]
    assert isinstance(end, TournamentEnded) and end.reason == "max-pairs", end
    status = t.sprt()
    assert status is not None and status.verdict == "continue" and status.llr == 0.0


@settings(max_examples=25, deadline=None)
@given(
    fmt=st.sampled_from(["round-robin", "swiss", "gauntlet"]),
    n=st.integers(3, 6),
    seed=st.integers(0, 2**16),
    cut=st.floats(0, 1),
)
def test_a_director_resumed_from_any_point_of_the_log_decides_the_same(
    fmt: str, n: int, seed: int, cut: float
) -> None:
    # What a restarted director does: fold the log written so far and decide again, with
    # the same game ends. It must continue exactly as the first one would have.
    rng = random.Random(seed)
    outcomes: dict[str, End] = {}

    def judge(g: GameScheduled) -> End:
        return outcomes.setdefault(g.game_id, End(rng.choice([0, 1, 2]), "natural"))

    s = spec(fmt, [f"b{i}" for i in range(n)], rounds=3)
    passes: list[int] = []
    log = play_out(create(s), judge, passes=passes)
    keep = passes[int((len(passes) - 1) * cut)]  # the log as one of the passes left it
    resumed = Tournament.fold(log[:keep])
    ends = {gid: outcomes[gid] for gid in outcomes}
    again = log[:keep]
    for _ in range(10_000):
        again += decide(resumed, ends, now=0)
        if resumed.ended is not None:
            break

    # The same games, pairings, records and end; only when each is decided (its seq and
    # time) may differ, as the resumed director learns of several ends at once.
    def facts(events: list[Event]) -> list[str]:
        return sorted(repr(e.model_dump(exclude={"seq", "time"})) for e in events)

    assert facts(again) == facts(log)
