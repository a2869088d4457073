"""Glicko-2 (`services.stats.glicko2`): published vectors, then properties with hypothesis.

The vectors: Glickman's worked example ("Example of the Glicko-2 system", glicko.net, 2022)
and Lichess's single-game cases (scalachess `test-kit/.../rating/glicko/GlickoCalculatorTest
.scala`: τ 0.75, no colour advantage, `skipDeviationIncrease = true`).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.stats.glicko2 import SCALE, Glicko2, Rating, Result, update

DAY_MS = 86_400_000
LICHESS = Glicko2()


def test_glickman_worked_example() -> None:
    player = Rating(1500, 200, 0.06)
    results = [
        Result(Rating(1400, 30), 1),
        Result(Rating(1550, 100), 0),
        Result(Rating(1700, 300), 0),
    ]
    after = update(player, results, tau=0.5)
    # The paper rounds its intermediate values; exact arithmetic gives 1464.051, 151.517.
    assert after.rating == pytest.approx(1464.06, abs=0.01)
    assert after.deviation == pytest.approx(151.52, abs=0.01)
    assert after.volatility == pytest.approx(0.05999, abs=0.00001)
    assert after.games == 3


def test_a_period_without_games_only_widens_the_deviation() -> None:
    """Step 6 alone: phi' = sqrt(φ² + sigma²), rating and volatility unchanged."""
    player = Rating(1500, 200, 0.06, games=7)
    after = update(player, [], tau=0.5)
    assert after.deviation == pytest.approx(math.hypot(200, 0.06 * SCALE))
    assert (after.rating, after.volatility, after.games) == (1500, 0.06, 7)


W, B = (1500, 350, 0.06), (1500, 350, 0.06)
W2, B2 = (1400, 79, 0.06), (1550, 110, 0.065)
W3, B3 = (1200, 60, 0.053), (1850, 200, 0.062)
# (white, black, white's score, white after, black after): rating, deviation, volatility.
LICHESS_GAMES = [
    (W, B, 1, (1662.21, 290.23, 0.0599993), (1337.79, 290.23, 0.0599993)),
    (W, B, 0, (1337.79, 290.23, 0.0599993), (1662.21, 290.23, 0.0599993)),
    (W, B, 0.5, (1500, 290.23, 0.0599977), (1500, 290.23, 0.0599977)),
    (W2, B2, 1, (1422.63, 77.50, 0.06), (1506.32, 105.87, 0.065)),
    (W2, B2, 0, (1389.99, 77.50, 0.06), (1568.90, 105.87, 0.065)),
    (W2, B2, 0.5, (1406.31, 77.50, 0.06), (1537.61, 105.87, 0.065)),
    (W3, B3, 1, (1216.73, 59.90, 0.053013), (1635.99, 196.99, 0.062028)),
    (W3, B3, 0, (1199.29, 59.90, 0.052999), (1855.42, 196.99, 0.061999)),
    (W3, B3, 0.5, (1208.01, 59.90, 0.053002), (1745.71, 196.99, 0.062006)),
]


@pytest.mark.parametrize(("white", "black", "score", "white_after", "black_after"), LICHESS_GAMES)
def test_lichess_single_games(
    white: tuple[float, float, float],
    black: tuple[float, float, float],
    score: float,
    white_after: tuple[float, float, float],
    black_after: tuple[float, float, float],
) -> None:
    after = LICHESS.game(Rating(*white), Rating(*black), score, at_ms=0)
    for rating, (r, rd, sigma) in zip(after, (white_after, black_after), strict=True):
        assert rating.rating == pytest.approx(r, abs=0.005)
        assert rating.deviation == pytest.approx(rd, abs=0.005)
        assert rating.volatility == pytest.approx(sigma, abs=0.00001)
        assert (rating.games, rating.last_played_ms) == (1, 0)


def test_deviation_grows_with_time_as_lichess_chose() -> None:
    """Lichess's 0.21436 periods a day: a typical RD (60, sigma 0.06) reaches 110 in a year."""
    rating = Rating(1800, 60, 0.06, games=200, last_played_ms=1_000 * DAY_MS)
    assert LICHESS.live(rating, 1_000 * DAY_MS).deviation == pytest.approx(60)
    assert LICHESS.live(rating, 1_365 * DAY_MS).deviation == pytest.approx(110, abs=0.01)
    half_year = LICHESS.live(rating, 1_182 * DAY_MS).deviation
    assert 60 < half_year < 110
    assert LICHESS.live(rating, 40_000 * DAY_MS).deviation == 350  # the cap
    assert LICHESS.live(rating, 0).deviation == pytest.approx(60)  # no time runs backwards
    assert not LICHESS.provisional(rating, 1_000 * DAY_MS)
    assert LICHESS.provisional(rating, 1_365 * DAY_MS)


def test_game_applies_the_time_since_each_players_last_game() -> None:
    rested = Rating(1500, 60, 0.06, games=50, last_played_ms=0)
    busy = Rating(1500, 60, 0.06, games=50, last_played_ms=365 * DAY_MS)
    first, second = LICHESS.game(rested, busy, 0.5, at_ms=365 * DAY_MS)
    # The rested player was less certain (RD 110 before the game), so moves more.
    assert first.deviation > second.deviation
    assert (first.last_played_ms, second.last_played_ms) == (365 * DAY_MS, 365 * DAY_MS)


def test_limits_and_provisional() -> None:
    new = LICHESS.new()
    assert (new.rating, new.deviation, new.volatility, new.games) == (1500, 350, 0.06, 0)
    assert LICHESS.provisional(new)
    player, opponent = new, Rating(1500, 45, 0.06)
    for game in range(300):
        player, _ = LICHESS.game(player, opponent, game % 2, at_ms=game)
    assert player.deviation == pytest.approx(45)  # the floor, reached and kept
    assert not LICHESS.provisional(player)
    wild = Rating(1500, 100, 0.5)
    assert LICHESS.game(wild, opponent, 1, at_ms=0)[0].volatility == 0.1  # the cap


@pytest.mark.parametrize("score", [-0.5, 1.5, math.nan])
def test_a_score_outside_0_1_is_refused(score: float) -> None:
    with pytest.raises(ValueError, match="score"):
        LICHESS.game(LICHESS.new(), LICHESS.new(), score, at_ms=0)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="tau"):
        Glicko2(tau=0)
    with pytest.raises(ValueError, match="min_deviation"):
        Glicko2(min_deviation=400)
    with pytest.raises(ValueError, match="tau"):
        update(Rating(), [], tau=-1)


# -- properties ----------------------------------------------------------------------------
ratings = st.builds(
    Rating,
    rating=st.floats(300, 2700),
    deviation=st.floats(45, 350),
    volatility=st.floats(0.03, 0.1),
)
scores = st.sampled_from([0.0, 0.5, 1.0])


@given(ratings, ratings, scores)
def test_rating_moves_towards_the_result(a: Rating, b: Rating, score: float) -> None:
    after, _ = LICHESS.game(a, b, score, at_ms=0)
    if score == 1:
        assert after.rating > a.rating
    elif score == 0:
        assert after.rating < a.rating
    else:  # a draw pulls the two ratings together (to within the rounding of the scales)
        assert (after.rating - a.rating) * (b.rating - a.rating) >= -1e-9
        assert abs(after.rating - b.rating) <= abs(a.rating - b.rating) + 1e-9


@given(ratings, ratings, scores)
def test_deviation_shrinks_after_a_game(a: Rating, b: Rating, score: float) -> None:
    after, _ = LICHESS.game(a, b, score, at_ms=0)
    assert after.deviation <= a.deviation
    assert after.deviation < a.deviation or a.deviation == LICHESS.min_deviation


@given(ratings, ratings, scores)
def test_swapping_the_players_swaps_the_results(a: Rating, b: Rating, score: float) -> None:
    a_after, b_after = LICHESS.game(a, b, score, at_ms=0)
    assert LICHESS.game(b, a, 1 - score, at_ms=0) == (b_after, a_after)


@given(ratings, ratings, scores)
def test_mirrored_ratings_and_result_mirror_the_change(a: Rating, b: Rating, score: float) -> None:
    """Reflecting both ratings about 1500 and the score about ½ reflects the change."""

    def mirror(r: Rating) -> Rating:
        return Rating(3000 - r.rating, r.deviation, r.volatility)

    a_after, _ = LICHESS.game(a, b, score, at_ms=0)
    m_after, _ = LICHESS.game(mirror(a), mirror(b), 1 - score, at_ms=0)
    assert m_after.rating - mirror(a).rating == pytest.approx(a.rating - a_after.rating, abs=1e-6)
    assert m_after.deviation == pytest.approx(a_after.deviation)
    assert m_after.volatility == pytest.approx(a_after.volatility)


@given(ratings, st.lists(st.tuples(ratings, scores), min_size=1, max_size=8))
def test_a_period_stays_finite_and_counts_its_games(
    player: Rating, games: list[tuple[Rating, float]]
) -> None:
    after = update(player, [Result(*game) for game in games], tau=0.75)
    assert all(math.isfinite(x) for x in (after.rating, after.deviation, after.volatility))
    assert after.volatility > 0 and after.deviation > 0
    assert after.games == player.games + len(games)
