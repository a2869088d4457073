"""Glicko-2 ratings: Glickman's rating-period update, applied game by game as Lichess does.

`update(player, results, tau)` is one rating period of Mark Glickman's "Example of the
Glicko-2 system" (glicko.net/glicko/glicko2.pdf, 2022), steps 2 to 8, the new volatility
found by the Illinois algorithm of step 5. With no results only step 6 applies.

`Glicko2` holds a system's settings and applies `update` the way Lichess does (lila
`modules/rating/src/main/Glicko.scala`, scalachess `rating/.../glicko/GlickoCalculator.scala`
and `impl/RatingCalculator.scala`):

- every game is its own rating period, and step 6 adds no elapsed period to it (Lichess's
  `skipDeviationIncrease = true`): playing never widens a deviation;
- the deviation grows with the time between games instead, by step 6 with a fractional
  number of periods, t = days since the last game * 0.21436 (Lichess: a typical RD goes from
  60 to 110 in a year). It is grown before each game and whenever a rating is shown
  (`Glicko2.live`), never stored grown;
- the deviation is kept in [45, `max_deviation`], the volatility at most 0.1 (past that it
  may never settle again, says Lichess), and a rating is provisional while its deviation is
  at least 110.

Departures from Lichess, all settings: a new rating is 1500/350/0.06 (Glickman's defaults;
Lichess starts at 1500/500/0.09) and the deviation is capped at 350, not 500. Lichess's
rating floor (400), colour advantage and per-speed gain factors are its platform's policy
and are left out. Times are milliseconds since the epoch, like an event's `time`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

__all__ = ["SCALE", "Glicko2", "Rating", "Result", "update"]

#: Glicko-2's scale (step 2): μ = (r - 1500) / SCALE, φ = RD / SCALE.
SCALE = 173.7178
#: The rating at μ = 0; the conversion is fixed whatever a system's starting rating.
CENTRE = 1500.0
#: ε of step 5: the Illinois iteration stops when the bracket is this narrow.
CONVERGENCE = 1e-6
MS_PER_DAY = 86_400_000


@dataclass(frozen=True, slots=True)
class Rating:
    """A player's Glicko-2 rating on the original scale, and when it last changed by a game."""

    rating: float = 1500.0
    deviation: float = 350.0
    volatility: float = 0.06
    games: int = 0
    #: Time of the last rated game (ms since the epoch); None before the first.
    last_played_ms: int | None = None


class Result(NamedTuple):
    """One game of a rating period: the opponent's rating before it, and the player's score."""

    opponent: Rating
    #: 1 a win, 0.5 a draw, 0 a loss.
    score: float


def update(
    player: Rating, results: Sequence[Result], tau: float, *, periods: float = 1.0
) -> Rating:
    """`player` after one rating period with `results`, by Glickman's steps 2 to 8.

    `tau` (τ) constrains the change in volatility (the paper suggests 0.3 to 1.2).
    `periods` is the number of rating periods step 6 adds to the deviation: 1 in the paper,
    0 for a single game the Lichess way, where the time between games is added before it
    (`Glicko2.live`). `games` grows by the number of results; `last_played_ms` is kept.
    """
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau!r}")
    mu, phi = _to_glicko2(player)
    if not results:  # step 6 alone: the rating and volatility stay, the deviation grows
        return replace(player, deviation=SCALE * _widen(phi, player.volatility, periods))
    # Step 3: the estimated variance v of the rating from the game outcomes alone.
    games = [_game(mu, result) for result in results]
    v = 1.0 / sum(g * g * e * (1.0 - e) for g, e, _ in games)
    # Step 4: the estimated improvement Δ = v Σ g(φj)(sj - Ej).
    improvement = sum(g * (score - e) for g, e, score in games)
    delta = v * improvement
    sigma = _volatility(phi, player.volatility, v, delta, tau)  # step 5
    phi_star = _widen(phi, sigma, periods)  # step 6
    new_phi = 1.0 / math.sqrt(1.0 / phi_star**2 + 1.0 / v)  # step 7
    new_mu = mu + new_phi**2 * improvement
    return replace(  # step 8: back to the original scale
        player,
        rating=SCALE * new_mu + CENTRE,
        deviation=SCALE * new_phi,
        volatility=sigma,
        games=player.games + len(results),
    )


def _to_glicko2(player: Rating) -> tuple[float, float]:
    """Step 2: (μ, φ)."""
    return (player.rating - CENTRE) / SCALE, player.deviation / SCALE


def _game(mu: float, result: Result) -> tuple[float, float, float]:
    """Step 3's g(φj) and E(μ, μj, φj) for one game, with the score sj."""
    mu_j, phi_j = _to_glicko2(result.opponent)
    g = 1.0 / math.sqrt(1.0 + 3.0 * phi_j**2 / math.pi**2)
    expected = 1.0 / (1.0 + math.exp(-g * (mu - mu_j)))
    return g, expected, result.score


def _widen(phi: float, sigma: float, periods: float) -> float:
    """Step 6: φ* = sqrt(φ² + t sigma²) after t rating periods."""
    return math.sqrt(phi**2 + periods * sigma**2)


def _volatility(phi: float, sigma: float, v: float, delta: float, tau: float) -> float:
    """Step 5: sigma', the root of f by the Illinois algorithm, exactly as the paper gives it."""
    a = math.log(sigma**2)

    def f(x: float) -> float:
        ex = math.exp(x)
        return ex * (delta**2 - phi**2 - v - ex) / (2.0 * (phi**2 + v + ex) ** 2) - (x - a) / tau**2

    # 5.2: bracket the root between A and B.
    big_a = a
    if delta**2 > phi**2 + v:
        big_b = math.log(delta**2 - phi**2 - v)
    else:
        k = 1
        while f(a - k * tau) < 0:
            k += 1
        big_b = a - k * tau
    # 5.3 and 5.4: regula falsi, halving the stale end's value (Illinois) so it converges.
    f_a, f_b = f(big_a), f(big_b)
    while abs(big_b - big_a) > CONVERGENCE:
        big_c = big_a + (big_a - big_b) * f_a / (f_b - f_a)
        f_c = f(big_c)
        if f_c * f_b <= 0:
            big_a, f_a = big_b, f_b
        else:
            f_a /= 2.0
        big_b, f_b = big_c, f_c
    return math.exp(big_a / 2.0)  # 5.5


@dataclass(frozen=True, slots=True)
class Glicko2:
    """A Glicko-2 rating system's settings, applied one game at a time as Lichess does."""

    #: τ, the constraint on volatility changes (Lichess: 0.75).
    tau: float = 0.75
    #: A new player's rating and volatility; a new player's deviation is `max_deviation`.
    rating: float = 1500.0
    volatility: float = 0.06
    max_deviation: float = 350.0
    min_deviation: float = 45.0
    max_volatility: float = 0.1
    #: Rating periods per day of inactivity, as fractions (Lichess: 0.21436).
    periods_per_day: float = 0.21436
    #: A rating whose deviation is at least this is provisional (Lichess: 110).
    provisional_deviation: float = 110.0

    def __post_init__(self) -> None:
        if not self.tau > 0:
            raise ValueError(f"tau must be > 0, got {self.tau!r}")
        if not 0 < self.min_deviation <= self.max_deviation:
            raise ValueError(
                f"want 0 < min_deviation <= max_deviation, got {self.min_deviation!r} "
                f"and {self.max_deviation!r}"
            )

    def new(self) -> Rating:
        """The rating of a player with no games."""
        return Rating(self.rating, self.max_deviation, self.volatility)

    def live(self, rating: Rating, now_ms: int) -> Rating:
        """`rating` as of `now_ms`: its deviation grown by the time since its last game.

        Step 6 with t = elapsed days * `periods_per_day` (fractional) rating periods, then
        kept within [min_deviation, max_deviation]. A time before the last game counts as none.
        """
        periods = 0.0
        if rating.last_played_ms is not None:
            days = max(0, now_ms - rating.last_played_ms) / MS_PER_DAY
            periods = days * self.periods_per_day
        phi = _widen(rating.deviation / SCALE, rating.volatility, periods)
        return replace(rating, deviation=self._deviation(SCALE * phi))

    def provisional(self, rating: Rating, now_ms: int | None = None) -> bool:
        """Whether `rating` (as of `now_ms`, if given) is still provisional."""
        if now_ms is not None:
            rating = self.live(rating, now_ms)
        return rating.deviation >= self.provisional_deviation

    def game(
        self, first: Rating, second: Rating, score: float, at_ms: int
    ) -> tuple[Rating, Rating]:
        """Both ratings after one game at `at_ms` in which `first` scored `score` (1, ½, 0).

        Each player's deviation is first grown by the time since their last game; then each
        is one rating period with that single game against the other's rating before it
        (step 6 adding no period), and kept within the system's limits.
        """
        if not 0.0 <= score <= 1.0:
            raise ValueError(f"a game's score is 0, 0.5 or 1, got {score!r}")
        before = self.live(first, at_ms), self.live(second, at_ms)
        after_first = update(before[0], [Result(before[1], score)], self.tau, periods=0.0)
        after_second = update(before[1], [Result(before[0], 1.0 - score)], self.tau, periods=0.0)
        return self._settle(after_first, at_ms), self._settle(after_second, at_ms)

    def _settle(self, rating: Rating, at_ms: int) -> Rating:
        return replace(
            rating,
            deviation=self._deviation(rating.deviation),
            volatility=min(rating.volatility, self.max_volatility),
            last_played_ms=at_ms,
        )

    def _deviation(self, deviation: float) -> float:
        return min(max(deviation, self.min_deviation), self.max_deviation)
