"""Competition results (`services.stats.standings`): small examples computed by hand, then
properties with hypothesis (every game hands out one point; the crosstable is its own mirror;
ratings do not depend on the order the results come in).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.stats.glicko2 import Glicko2
from services.stats.sprt import Pentanomial, Trinomial, elo_estimate
from services.stats.standings import (
    WLD,
    Cell,
    GameResult,
    Health,
    Standing,
    crosstable,
    faults,
    health,
    pair_stats,
    ratings,
    standings,
    terminations,
)

DAY_MS = 86_400_000
_ids = iter(range(1_000_000))


def game(
    first: str,
    second: str,
    winner: int,
    reason: str = "natural",
    *,
    ended_ms: int = 0,
    think_ms: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
    lag_ms: tuple[tuple[int, ...], tuple[int, ...]] = ((), ()),
    pair: str = "",
    rules: str = "teeko",
    options: tuple[tuple[str, str], ...] = (),
    game_id: str | None = None,
) -> GameResult:
    """A finished game with a fresh id unless given one."""
    return GameResult(
        game_id=game_id or f"g{next(_ids):06d}",
        game=rules,
        options=options,
        players=(first, second),
        winner=winner,
        reason=reason,
        ended_ms=ended_ms,
        think_ms=think_ms,
        lag_ms=lag_ms,
        pair=pair,
    )


# -- the record -------------------------------------------------------------------------------
def test_game_result_scores_seats_and_counts() -> None:
    won = game("a", "b", 2, "time_forfeit")
    assert (won.score(1), won.score(2)) == (0.0, 1.0)
    drawn = game("a", "b", 0)
    assert (drawn.score(1), drawn.score(2)) == (0.5, 0.5)
    assert won.seat_of("b") == 2 and won.seat_of("c") is None
    assert game("a", "a", 1).seat_of("a") == 1
    assert won.counts and game("a", "b", 0, "abort").counts
    assert not game("a", "b", 0, "aborted").counts
    assert not game("a", "b", 1, "interrupted").counts
    with pytest.raises(ValueError, match="winner"):
        game("a", "b", 3)
    with pytest.raises(ValueError, match="seat"):
        won.score(0)


# -- standings --------------------------------------------------------------------------------
def test_standings_buchholz_sonneborn_berger_and_a_bye() -> None:
    results = [
        game("A", "B", 1),  # A beats B
        game("B", "C", 0),  # B draws C
        game("C", "A", 1),  # C beats A
        game("A", "D", 1, "aborted"),  # the platform's: not scored
    ]
    # Points A 1, B 0.5, C 1.5, D 1 (the bye), E 0 (listed, no games).
    # Buchholz A 0.5+1.5, B 1+1.5, C 0.5+1, D 0 (no games); SB A 1*0.5, B 0.5*1.5, C 0.5*0.5+1*1.
    assert standings(results, players=["E"], byes={"D": 1}) == [
        Standing("C", 2, 1, 0, 1, 1.5, 1.5, 1.25, 1),
        Standing("A", 2, 1, 1, 0, 1.0, 2.0, 0.5, 2),
        Standing("D", 0, 0, 0, 0, 1.0, 0.0, 0.0, 3),
        Standing("B", 2, 0, 1, 1, 0.5, 2.5, 0.75, 4),
        Standing("E", 0, 0, 0, 0, 0.0, 0.0, 0.0, 5),
    ]


def test_standings_exact_ties_share_a_rank_and_sort_by_name() -> None:
    table = standings([game("b", "a", 0)], players=["c"])
    assert [(row.name, row.rank) for row in table] == [("a", 1), ("b", 1), ("c", 3)]
    assert table[0] == Standing("a", 1, 0, 0, 1, 0.5, 0.5, 0.25, 1)


def test_standings_rejects_negative_byes() -> None:
    with pytest.raises(ValueError, match="byes"):
        standings([], byes={"a": -1})


# -- crosstable -------------------------------------------------------------------------------
def test_crosstable_by_seat() -> None:
    results = [
        game("A", "B", 1),  # A wins as first
        game("B", "A", 0),  # a draw, A second
        game("B", "A", 1),  # B wins as first
        game("A", "C", 2, "interrupted"),  # not scored: A and C never met
        game("A", "A", 1),  # self-play: not scored
    ]
    assert crosstable(results) == {
        "A": {"B": Cell(1, 1, 1, as_first=WLD(1, 0, 0), as_second=WLD(0, 1, 1))},
        "B": {"A": Cell(1, 1, 1, as_first=WLD(1, 0, 1), as_second=WLD(0, 1, 0))},
    }


# -- terminations, faults, health -------------------------------------------------------------
FAULTY = [
    game("A", "B", 1, "time_forfeit", think_ms=((10, 20, 30), (5,))),  # B's fault
    game("B", "A", 1, "illegal_move", think_ms=((100, 200), (40,))),  # A's
    game("A", "B", 0, "abort", think_ms=((50,), (7,))),  # no winner: nobody's
    game("A", "B", 0, "aborted", think_ms=((60,), ())),  # the platform's
    game("A", "B", 2, "natural"),
    game("B", "A", 2, "no_reply"),  # B's
    game("B", "A", 1, "disconnect"),  # A's
]


def test_terminations_count_every_game_and_faults_the_loser() -> None:
    everything = {
        reason: 1
        for reason in (
            "time_forfeit",
            "illegal_move",
            "abort",
            "aborted",
            "natural",
            "no_reply",
            "disconnect",
        )
    }
    assert terminations(FAULTY) == {"A": everything, "B": everything}
    assert faults(FAULTY) == {
        "A": {"illegal_move": 1, "disconnect": 1},
        "B": {"time_forfeit": 1, "no_reply": 1},
    }
    assert faults([game("A", "B", 2, "resignation")]) == {"A": {"resignation": 1}, "B": {}}
    # The log names the seat at fault: it decides, even without a winner.
    aborted_by_b = GameResult("x", "teeko", (), ("A", "B"), 0, "abort", 0, fault=2)
    assert faults([aborted_by_b]) == {"A": {}, "B": {"abort": 1}}
    # ... and scores as its forfeit: aborting a lost game earns no half point.
    assert (aborted_by_b.score(1), aborted_by_b.score(2)) == (1.0, 0.0)
    assert [s.points for s in standings([aborted_by_b])] == [1.0, 0.0]


def test_health_faults_and_nearest_rank_quantiles() -> None:
    # A's moves 10 20 30 40 50 60: p50 is the 3rd, p95 the 6th (ceil(5.7));
    # B's 5 7 100 200: p50 the 2nd, p95 the 4th.
    assert health([*FAULTY, game("C", "D", 1)]) == {
        "A": Health(7, 6, 0, 1, 0, 1, think_p50_ms=30, think_p95_ms=60),
        "B": Health(7, 4, 1, 0, 1, 0, think_p50_ms=7, think_p95_ms=200),
        "C": Health(1, 0, 0, 0, 0, 0, 0, 0),
        "D": Health(1, 0, 0, 0, 0, 0, 0, 0),
    }


def test_health_quantiles_over_twenty_moves() -> None:
    thinks = tuple(random.Random(7).sample(range(1, 21), 20))
    row = health([game("A", "B", 1, think_ms=(thinks, ()))])["A"]
    assert (row.moves, row.think_p50_ms, row.think_p95_ms) == (20, 10, 19)


def test_health_shows_what_the_platform_cost_each_bot() -> None:
    """The platform's lag before a bot's turns reached it, and the games it interrupted,
    are the bot's health too: shown, never on its clock nor its score."""
    lagged = game("A", "B", 1, lag_ms=(tuple(range(0, 200, 10)), (3, 3)))
    spoiled = game("A", "B", 0, "interrupted")
    table = health([lagged, spoiled])
    assert (table["A"].lag_p95_ms, table["A"].interrupted) == (180, 1)
    assert (table["B"].lag_p95_ms, table["B"].interrupted) == (3, 1)


# -- pairs ------------------------------------------------------------------------------------
PAIRED = [
    game("a", "b", 1, pair="p1"),  # a wins both: pair score 2
    game("b", "a", 2, pair="p1"),
    game("a", "b", 1, pair="p2"),  # a win and a draw: 1.5
    game("b", "a", 0, pair="p2"),
    game("b", "a", 1, pair="p3"),  # a loss and a win: 1
    game("a", "b", 1, pair="p3"),
    game("a", "b", 2, pair="p4"),  # a loss; its twin ended by the platform: no pair
    game("b", "a", 1, "aborted", pair="p4"),
    game("b", "a", 2, pair="p5"),  # a win whose twin is not played yet: no pair
    game("a", "b", 0),  # a draw outside any pair
    game("a", "c", 1, pair="p6"),  # against someone else
    game("c", "a", 1, pair="p6"),
]


def test_pentanomial_from_complete_pairs_only() -> None:
    stats = pair_stats(PAIRED, "a", "b")
    assert (stats.wins, stats.losses, stats.draws) == (5, 2, 2)
    assert stats.penta == (0, 0, 1, 1, 1)
    assert stats.elo == elo_estimate(Pentanomial((0, 0, 1, 1, 1)))
    mirror = pair_stats(PAIRED, "b", "a")
    assert (mirror.wins, mirror.losses, mirror.draws) == (2, 5, 2)
    assert mirror.penta == (1, 1, 1, 0, 0)


def test_pair_stats_elo_from_games_without_pairs() -> None:
    results = [game("a", "b", 1), game("b", "a", 1), game("a", "b", 1), game("b", "a", 0)]
    stats = pair_stats(results, "a", "b")
    assert stats.penta == (0, 0, 0, 0, 0)
    assert stats.trinomial == Trinomial(wins=2, losses=1, draws=1)
    assert stats.elo == elo_estimate(Trinomial(wins=2, losses=1, draws=1))
    assert pair_stats(results, "a", "z").elo is None
    unswapped = [game("a", "b", 1, pair="p"), game("a", "b", 1, pair="p")]  # not a pair
    assert pair_stats(unswapped, "a", "b").penta == (0, 0, 0, 0, 0)
    assert pair_stats([game("a", "b", 1, "aborted")], "a", "b").elo is None
    with pytest.raises(ValueError, match="two different"):
        pair_stats(results, "a", "a")


# -- ratings ----------------------------------------------------------------------------------
def test_one_win_raises_the_winner() -> None:
    board = ratings([game("w", "l", 1, ended_ms=DAY_MS)])[("teeko", ())]
    assert [row.name for row in board] == ["w", "l"]
    winner, loser = board
    assert winner.rating > 1500 > loser.rating
    assert winner.deviation < 350 and winner.games == 1 and winner.provisional


def test_ratings_by_rules_and_options_in_time_order() -> None:
    system = Glicko2()
    big = (("size", "7"),)
    results = [
        game("a", "b", 2, ended_ms=2 * DAY_MS),
        game("a", "b", 1, ended_ms=1 * DAY_MS),
        game("a", "b", 1, ended_ms=3 * DAY_MS, options=big),
        game("a", "a", 1, ended_ms=4 * DAY_MS),  # self-play: skipped
        game("a", "b", 1, "interrupted", ended_ms=5 * DAY_MS),  # the platform's: skipped
    ]
    boards = ratings(results, system)
    assert set(boards) == {("teeko", ()), ("teeko", big)}
    # Replayed by hand: a wins on day 1, loses on day 2; shown as of day 3 (the last rated game).
    a, b = system.new(), system.new()
    a, b = system.game(a, b, 1.0, DAY_MS)
    a, b = system.game(a, b, 0.0, 2 * DAY_MS)
    rows = {row.name: row for row in boards[("teeko", ())]}
    for name, rating in (("a", a), ("b", b)):
        live = system.live(rating, 3 * DAY_MS)
        assert rows[name].rating == live.rating
        assert rows[name].deviation == live.deviation
        assert rows[name].games == 2
    assert rows["b"].rating > rows["a"].rating  # the later result weighs more
    later = ratings(results, system, now_ms=400 * DAY_MS)[("teeko", ())]
    assert all(row.deviation > rows[row.name].deviation for row in later)


def test_platform_ended_games_are_not_scored() -> None:
    scored = [game("a", "b", 1, ended_ms=DAY_MS), game("b", "c", 0, ended_ms=2 * DAY_MS)]
    platform = [
        game("a", "c", 1, "aborted", ended_ms=DAY_MS),
        game("c", "b", 2, "interrupted", ended_ms=2 * DAY_MS),
    ]
    both = scored + platform
    assert standings(both) == standings(scored)
    assert crosstable(both) == crosstable(scored)
    assert ratings(both) == ratings(scored)
    assert pair_stats(both, "a", "c").elo is None
    assert terminations(both)["c"] == {"natural": 1, "aborted": 1, "interrupted": 1}


# -- properties -------------------------------------------------------------------------------
NAMES = st.sampled_from(["a", "b", "c", "d"])
REASONS = st.sampled_from(
    ["natural", "resignation", "time_forfeit", "abort", "aborted", "interrupted"]
)


@st.composite
def results_lists(draw: st.DrawFn) -> list[GameResult]:
    """Up to 25 games among four players, self-play and platform ends included."""
    size = draw(st.integers(0, 25))
    return [
        GameResult(
            game_id=f"g{index:03d}",
            game="teeko",
            options=draw(st.sampled_from([(), (("size", "7"),)])),
            players=(draw(NAMES), draw(NAMES)),
            winner=draw(st.integers(0, 2)),
            reason=draw(REASONS),
            ended_ms=draw(st.integers(0, 30)) * DAY_MS // 4,
        )
        for index in range(size)
    ]


@given(results_lists(), st.dictionaries(NAMES, st.integers(0, 3)))
def test_each_game_hands_out_one_point(results: list[GameResult], byes: dict[str, int]) -> None:
    table = standings(results, byes=byes)
    scored = [r for r in results if r.counts and r.players[0] != r.players[1]]
    assert sum(row.points for row in table) == len(scored) + sum(byes.values())
    assert sum(row.games for row in table) == 2 * len(scored)
    for row in table:
        assert row.points == row.wins + row.draws / 2 + byes.get(row.name, 0)
    keys = [(-row.points, -row.buchholz, -row.sonneborn_berger) for row in table]
    assert keys == sorted(keys)
    assert [row.rank for row in table] == sorted(row.rank for row in table)


@given(results_lists())
def test_crosstable_is_its_own_mirror(results: list[GameResult]) -> None:
    table = crosstable(results)
    games = {row.name: row.games for row in standings(results)}
    for row, cells in table.items():
        assert sum(cell.games for cell in cells.values()) == games[row]
        for column, cell in cells.items():
            other = table[column][row]
            assert (cell.wins, cell.losses, cell.draws) == (other.losses, other.wins, other.draws)
            assert cell.as_first.wins == other.as_second.losses
            assert cell.as_first.games == other.as_second.games
            assert cell.wins == cell.as_first.wins + cell.as_second.wins


@given(results_lists(), st.randoms(use_true_random=False))
def test_ratings_do_not_depend_on_input_order(
    results: list[GameResult], rng: random.Random
) -> None:
    shuffled = list(results)
    rng.shuffle(shuffled)
    assert ratings(shuffled) == ratings(results)
    assert standings(shuffled) == standings(results)
