"""Match statistics for two players: Elo difference, error bars, LOS, and the SPRT.

The counts are the first player's, as a `Trinomial` (wins, losses, draws) or, for games
played in pairs with the seats swapped, a `Pentanomial` (pairs scoring 0, ½, 1, 1½, 2).
Everything is computed as the engine testers compute it; the sources, reimplemented here
with the standard library only:

- `elo_estimate`: the logistic Elo difference with its 95% error bar and the likelihood of
  superiority, as fishtest's `stat_util.get_elo` and fastchess's `elo_pentanomial.cpp`
  (the mean score ± 1.96 standard errors, mapped to Elo); the normalized Elo as fastchess.
- `llr(counts, elo0, elo1, model)`, the log-likelihood ratio of the SPRT:
  - `normalized` (fishtest's default): H0/H1 are normalized Elo (nElo, Elo per standard
    deviation of the score); the generalized LLR with the maximum-likelihood distributions
    of a given t-value (fishtest `stats/LLRcalc.py` `LLR_normalized`, after Michel Van den
    Bergh's "Normalized Elo: practical considerations", section 4.1, cantate.be/Fishtest);
  - `logistic`: H0/H1 are logistic Elo; the generalized LLR with the maximum-likelihood
    distributions of a given expected score (fishtest `LLRcalc.LLR_logistic`, after Van den
    Bergh's "Support for the MLE of a multinomial", proposition 1.1);
  - `bayeselo` (cutechess-cli's SPRT, `projects/lib/src/sprt.cpp`): H0/H1 are BayesElo,
    scaled by the draw rate; drawelo is estimated from the results; trinomial only, and no
    verdict until there is at least one win, one loss and one draw.
- `Sprt`: the test's design; its bounds are log(beta/(1-alpha)) and log((1-beta)/alpha), and
  `Sprt.status(counts)` says whether to accept H0, accept H1 or continue.

As fishtest does, a count of 0 is replaced by 0.001 before any of this (a tiny prior that
keeps the maximum-likelihood estimates inside the simplex).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist
from typing import Literal, get_args

__all__ = [
    "MODELS",
    "Counts",
    "EloEstimate",
    "Model",
    "Pentanomial",
    "Sprt",
    "SprtStatus",
    "StatsError",
    "Trinomial",
    "Verdict",
    "elo_estimate",
    "llr",
]

Model = Literal["normalized", "logistic", "bayeselo"]
MODELS: tuple[Model, ...] = get_args(Model)

#: Normalized Elo per unit of normalized t-value: 800 / ln 10.
NELO_PER_T = 800 / math.log(10)
#: What replaces a count of 0 (fishtest's `LLRcalc.regularize`).
PRIOR = 1e-3
#: The two-sided 95% quantile of the standard normal law, 1.95996...
Z95 = NormalDist().inv_cdf(0.975)


class StatsError(ValueError):
    """Counts or test parameters that the statistics cannot use; the message says why."""


class OutOfReach(StatsError):
    """Every result lies beyond both bounds' scores: the likelihood ratio has no value."""


# -- the counts -------------------------------------------------------------------------------
def _check_counts(counts: Sequence[int], what: str) -> None:
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise StatsError(f"{what} must be whole numbers ≥ 0, got {count!r}")


@dataclass(frozen=True, slots=True)
class Trinomial:
    """The first player's wins, losses and draws, game by game."""

    wins: int
    losses: int
    draws: int

    def __post_init__(self) -> None:
        _check_counts((self.wins, self.losses, self.draws), "wins, losses and draws")

    @property
    def games(self) -> int:
        return self.wins + self.losses + self.draws

    @property
    def frequencies(self) -> tuple[int, ...]:
        """Worst to best: losses, draws, wins (the game scores 0, ½, 1)."""
        return self.losses, self.draws, self.wins

    def __str__(self) -> str:
        return f"W{self.wins} L{self.losses} D{self.draws}"


@dataclass(frozen=True, slots=True)
class Pentanomial:
    """Game pairs (seats swapped) by the first player's pair score: 0, ½, 1, 1½, 2.

    That is LL, LD+DL, LW+WL+DD, DW+WD, WW. `Pentanomial.parse("a,b,c,d,e")` and `str()`
    round-trip.
    """

    counts: tuple[int, int, int, int, int]

    def __post_init__(self) -> None:
        if len(self.counts) != 5:
            raise StatsError(f"a pentanomial has 5 counts, got {len(self.counts)}")
        _check_counts(self.counts, "pentanomial counts")

    @classmethod
    def parse(cls, text: str) -> Pentanomial:
        """`"365,16618,36229,16974,390"` (spaces allowed) as a `Pentanomial`."""
        parts = [part.strip() for part in text.split(",")]
        if len(parts) != 5 or not all(part.isascii() and part.isdigit() for part in parts):
            raise StatsError(
                f"a pentanomial is 5 whole numbers ≥ 0 separated by commas, "
                f"pairs scoring 0, ½, 1, 1½, 2 (e.g. 1,10,20,12,2); got {text!r}"
            )
        a, b, c, d, e = (int(part) for part in parts)
        return cls((a, b, c, d, e))

    @property
    def pairs(self) -> int:
        return sum(self.counts)

    @property
    def games(self) -> int:
        return 2 * self.pairs

    @property
    def frequencies(self) -> tuple[int, ...]:
        return self.counts

    def __str__(self) -> str:
        return ",".join(str(count) for count in self.counts)


Counts = Trinomial | Pentanomial

#: A discrete distribution: (value, probability) pairs, values ascending.
Pdf = list[tuple[float, float]]


def _pdf(counts: Counts) -> tuple[float, Pdf]:
    """The number of samples (games or pairs) and their score distribution on [0, 1]."""
    frequencies = [PRIOR if count == 0 else float(count) for count in counts.frequencies]
    total = sum(frequencies)
    last = len(frequencies) - 1
    return total, [(i / last, n / total) for i, n in enumerate(frequencies)]


def _mean_variance(pdf: Pdf) -> tuple[float, float]:
    mean = sum(p * x for x, p in pdf)
    return mean, sum(p * (x - mean) ** 2 for x, p in pdf)


def _sigma_per_game(counts: Counts, variance: float) -> float:
    """The standard deviation of one game's score; a pair's mean has half a game's variance."""
    return math.sqrt(2 * variance if isinstance(counts, Pentanomial) else variance)


def _elo(score: float) -> float:
    """Logistic Elo of an expected score, the score clamped to [0.001, 0.999] (fishtest)."""
    score = min(max(score, PRIOR), 1 - PRIOR)
    return -400 * math.log10(1 / score - 1)


def _score(elo: float) -> float:
    """The expected score at a logistic Elo difference."""
    return 1 / (1 + 10 ** (-elo / 400))


# -- Elo estimate -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EloEstimate:
    """The first player's Elo difference, 95% error bars, and likelihood of superiority."""

    games: int
    #: Mean score per game, in [0, 1].
    score: float
    elo: float
    #: Half the width of the 95% interval of `elo`.
    elo_error: float
    #: Normalized Elo (fastchess, fishtest): (score - ½) / sigma per game * 800 / ln 10.
    nelo: float
    nelo_error: float
    #: Likelihood of superiority: the probability that the true score exceeds ½.
    los: float


def elo_estimate(counts: Counts) -> EloEstimate:
    """The Elo difference ± its 95% error and LOS, from the normal approximation of the mean.

    fishtest `stat_util.get_elo`: the mean score per game ± 1.96 standard errors, each end
    mapped to Elo, the error half the difference; LOS = Φ((score - ½) / standard error).
    With pairs, the standard error is that of the pair means, so the correlation inside a
    pair (a shared seed, swapped seats) is counted.
    """
    if counts.games == 0:
        raise StatsError("no games yet: an Elo difference needs at least one")
    samples, pdf = _pdf(counts)
    score, variance = _mean_variance(pdf)
    error = math.sqrt(variance / samples)
    low, high = score - Z95 * error, score + Z95 * error
    sigma = _sigma_per_game(counts, variance)
    return EloEstimate(
        games=counts.games,
        score=score,
        elo=_elo(score),
        elo_error=(_elo(high) - _elo(low)) / 2,
        nelo=(score - 0.5) / sigma * NELO_PER_T,
        nelo_error=Z95 * error / sigma * NELO_PER_T,
        los=NormalDist().cdf((score - 0.5) / error),
    )


# -- maximum-likelihood distributions ---------------------------------------------------------
def _secular(pdf: Pdf) -> float:
    """The root x of Σ pᵢ aᵢ / (1 + x aᵢ) = 0 between -1/max(a) and -1/min(a).

    The sum falls from +∞ to -∞ across that interval, so bisection finds the one root to the
    last bit (fishtest uses scipy's brentq here).
    """
    values = [a for a, _ in pdf]
    low_value, high_value = min(values), max(values)
    if not low_value < 0 < high_value:
        raise OutOfReach("these bounds are out of reach of the results: choose closer ones")
    low, high = -1 / high_value, -1 / low_value
    for _ in range(2000):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if sum(p * a / (1 + middle * a) for a, p in pdf) > 0:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _mle_expected(pdf: Pdf, s: float) -> Pdf:
    """The distribution nearest to `pdf` (maximum likelihood) whose mean is `s`."""
    shifted: Pdf = [(a - s, p) for a, p in pdf]
    x = _secular(shifted)
    return [(a, p / (1 + x * (a - s))) for a, p in pdf]


def _mle_t_value(pdf: Pdf, ref: float, t: float) -> Pdf:
    """The distribution nearest to `pdf` whose t-value (mean - ref) / sigma is `t`.

    A fixed point: each round solves the secular equation linearised at the last estimate;
    it starts from the uniform distribution and settles in a few rounds.
    """
    mle: Pdf = [(a, 1 / len(pdf)) for a, _ in pdf]
    for _ in range(100):
        mean, variance = _mean_variance(mle)
        sigma = math.sqrt(variance)
        shifted: Pdf = [
            (a - ref - t * sigma * (1 + ((mean - a) / sigma) ** 2) / 2, p) for a, p in pdf
        ]
        x = _secular(shifted)
        previous = mle
        mle = [(a, p / (1 + x * b)) for (a, p), (b, _) in zip(pdf, shifted, strict=True)]
        if max(abs(p - q) for (_, p), (_, q) in zip(mle, previous, strict=True)) < 1e-9:
            break
    return mle


def _generalized_llr(
    counts: Counts, fit: Callable[[Pdf, float], Pdf], h0: float, h1: float
) -> float:
    """N * Σ p̂ᵢ log(p1ᵢ / p0ᵢ): the observed results under the fits for H1 and for H0."""
    samples, pdf = _pdf(counts)
    pdf0, pdf1 = fit(pdf, h0), fit(pdf, h1)
    return samples * sum(
        p * (math.log(q1) - math.log(q0))
        for (_, p), (_, q0), (_, q1) in zip(pdf, pdf0, pdf1, strict=True)
    )


# -- the three models -------------------------------------------------------------------------
def _llr_logistic(counts: Counts, elo0: float, elo1: float) -> float:
    """fishtest `LLR_logistic`: H0/H1 are the expected scores at logistic Elo elo0, elo1."""
    return _generalized_llr(counts, _mle_expected, _score(elo0), _score(elo1))


def _llr_normalized(counts: Counts, nelo0: float, nelo1: float) -> float:
    """fishtest `LLR_normalized`: H0/H1 are t-values of the per-sample score against ½.

    A pair's t-value is √2 times a game's, as the pair mean has half a game's variance.
    """
    scale = math.sqrt(2) if isinstance(counts, Pentanomial) else 1.0
    t0, t1 = (nelo / NELO_PER_T * scale for nelo in (nelo0, nelo1))
    return _generalized_llr(counts, lambda pdf, t: _mle_t_value(pdf, 0.5, t), t0, t1)


def _bayeselo_probabilities(elo: float, drawelo: float) -> tuple[float, float, float]:
    """(loss, draw, win) probabilities at a BayesElo difference and drawelo."""
    win = 1 / (1 + 10 ** ((drawelo - elo) / 400))
    loss = 1 / (1 + 10 ** ((drawelo + elo) / 400))
    return loss, 1 - win - loss, win


def _llr_bayeselo(counts: Counts, elo0: float, elo1: float) -> float:
    """cutechess-cli `Sprt::status`: BayesElo bounds with drawelo estimated from the results.

    The bounds are divided by the scale 4x / (1 + x)², x = 10^(-drawelo / 400), so that they
    mean about the same logistic Elo whatever the draw rate. 0 until there is at least one
    win, one loss and one draw (cutechess-cli continues until then).
    """
    if not isinstance(counts, Trinomial):
        raise StatsError("the bayeselo model (cutechess-cli) takes wins, losses and draws only")
    if min(counts.frequencies) == 0:
        return 0.0
    p_loss, p_win = counts.losses / counts.games, counts.wins / counts.games
    drawelo = 200 * math.log10((1 - p_loss) / p_loss * (1 - p_win) / p_win)
    x = 10 ** (-drawelo / 400)
    scale = 4 * x / (1 + x) ** 2
    law0 = _bayeselo_probabilities(elo0 / scale, drawelo)
    law1 = _bayeselo_probabilities(elo1 / scale, drawelo)
    return sum(
        n * math.log(q1 / q0) for n, q0, q1 in zip(counts.frequencies, law0, law1, strict=True)
    )


_LLR: dict[Model, Callable[[Counts, float, float], float]] = {
    "normalized": _llr_normalized,
    "logistic": _llr_logistic,
    "bayeselo": _llr_bayeselo,
}


def llr(counts: Counts, elo0: float, elo1: float, model: Model = "normalized") -> float:
    """The log-likelihood ratio of H1 (Elo = elo1) against H0 (Elo = elo0) given `counts`.

    The Elo values are in the model's own unit (see the module's docstring). No games give 0.
    """
    if model not in _LLR:
        raise StatsError(f"unknown model {model!r}; one of {', '.join(MODELS)}")
    if not elo0 < elo1:
        raise StatsError(f"elo0 must be below elo1, got [{elo0:g}, {elo1:g}]")
    if counts.games == 0:
        return 0.0
    return _LLR[model](counts, elo0, elo1)


# -- the test ---------------------------------------------------------------------------------
class Verdict(StrEnum):
    """What the SPRT says after some results."""

    ACCEPT_H0 = "H0"
    ACCEPT_H1 = "H1"
    CONTINUE = "continue"


@dataclass(frozen=True, slots=True)
class SprtStatus:
    llr: float
    lower_bound: float
    upper_bound: float
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class Sprt:
    """A sequential probability ratio test of H0: Elo = elo0 against H1: Elo = elo1.

    `alpha` is the largest chance of accepting H1 when H0 holds, `beta` of accepting H0 when
    H1 holds (Wald's bounds, as fishtest and cutechess-cli use them).
    """

    elo0: float
    elo1: float
    alpha: float = 0.05
    beta: float = 0.05
    model: Model = "normalized"

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise StatsError(f"unknown model {self.model!r}; one of {', '.join(MODELS)}")
        if not self.elo0 < self.elo1:
            raise StatsError(f"elo0 must be below elo1, got [{self.elo0:g}, {self.elo1:g}]")
        if not (0 < self.alpha < 1 and 0 < self.beta < 1 and self.alpha + self.beta < 1):
            raise StatsError(
                f"want 0 < alpha, beta and alpha + beta < 1, got {self.alpha:g}, {self.beta:g}"
            )

    @property
    def lower_bound(self) -> float:
        """log(beta / (1 - alpha)): below it, H0 is accepted."""
        return math.log(self.beta / (1 - self.alpha))

    @property
    def upper_bound(self) -> float:
        """log((1 - beta) / alpha): above it, H1 is accepted."""
        return math.log((1 - self.beta) / self.alpha)

    def status(self, counts: Counts) -> SprtStatus:
        """The LLR of `counts`, the bounds, and the verdict. When every result so far lies
        beyond both bounds' scores (all wins against bounds as far apart as Elo 0 and 1000),
        the likelihood ratio has no value yet: 0, and the test goes on."""
        try:
            value = llr(counts, self.elo0, self.elo1, self.model)
        except OutOfReach:
            value = 0.0
        verdict = Verdict.CONTINUE
        if value > self.upper_bound:
            verdict = Verdict.ACCEPT_H1
        elif value < self.lower_bound:
            verdict = Verdict.ACCEPT_H0
        return SprtStatus(value, self.lower_bound, self.upper_bound, verdict)
