"""Match statistics and the SPRT (`services.stats.sprt`) and `agon stats`.

Published vectors first (fishtest, cutechess-cli), each within 1%, and the verdict at the
bounds. Then the LLRs checked independently: for W-L-D, the generalized LLR found by brute
force (the best likelihood over the one free parameter left by each hypothesis); for pairs,
fishtest's closed-form approximations (`LLRcalc.py`: `LLR_normalized_alt`, after Van den
Bergh's "Normalized Elo: practical considerations" §4.2, and `LLR_alt2`, "GSPRT
approximation"), close on data shaped like an engine test's. Then symmetries with
hypothesis; then `agon stats`, in-process and once as a subprocess.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services import cli
from services.stats.sprt import (
    NELO_PER_T,
    Counts,
    Model,
    Pentanomial,
    Sprt,
    StatsError,
    Trinomial,
    Verdict,
    elo_estimate,
    llr,
)

ROOT = Path(__file__).resolve().parents[2]


# -- published vectors ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("counts", "elo0", "elo1", "model", "expected"),
    [
        (Trinomial(wins=36433, losses=36027, draws=68692), 0, 2, "normalized", 0.92),
        (Pentanomial((365, 16618, 36229, 16974, 390)), 0, 2, "normalized", 2.25),
        (Pentanomial((223, 9863, 21279, 10037, 246)), 0.5, 2.5, "logistic", -3.07),
        (Trinomial(wins=1477, losses=1351, draws=2942), 0, 10, "bayeselo", 2.52),
    ],
)
def test_published_vectors(
    counts: Counts, elo0: float, elo1: float, model: Model, expected: float
) -> None:
    assert llr(counts, elo0, elo1, model) == pytest.approx(expected, rel=0.01)


def test_cutechess_bounds_and_verdicts() -> None:
    test = Sprt(0, 10, alpha=0.01, beta=0.01, model="bayeselo")
    assert test.lower_bound == pytest.approx(-4.6, rel=0.01)
    assert test.upper_bound == pytest.approx(4.6, rel=0.01)
    status = test.status(Trinomial(wins=1477, losses=1351, draws=2942))
    assert status.verdict == Verdict.CONTINUE
    assert status.lower_bound < status.llr < status.upper_bound
    assert test.status(Trinomial(wins=1900, losses=1351, draws=2942)).verdict == Verdict.ACCEPT_H1
    assert test.status(Trinomial(wins=1200, losses=1351, draws=2942)).verdict == Verdict.ACCEPT_H0


def test_fishtest_bounds_and_verdict() -> None:
    test = Sprt(0.5, 2.5, model="logistic")  # alpha = beta = 0.05: ±2.94
    assert test.upper_bound == pytest.approx(math.log(0.95 / 0.05))
    assert test.lower_bound == -test.upper_bound
    status = test.status(Pentanomial((223, 9863, 21279, 10037, 246)))
    assert status.verdict == Verdict.ACCEPT_H0


@pytest.mark.parametrize(
    ("counts", "elo0", "elo1", "model"),
    [
        (Trinomial(wins=1477, losses=1351, draws=2942), 0, 10, "bayeselo"),
        (Pentanomial((223, 9863, 21279, 10037, 246)), 0.5, 2.5, "logistic"),
    ],
)
def test_the_verdict_changes_where_the_llr_crosses_a_bound(
    counts: Counts, elo0: float, elo1: float, model: Model
) -> None:
    """With alpha = beta = a the bounds are ±log((1 - a)/a): put them just inside, then outside."""
    value = llr(counts, elo0, elo1, model)
    decided = Verdict.ACCEPT_H1 if value > 0 else Verdict.ACCEPT_H0
    for margin, verdict in ((-0.01, decided), (0.01, Verdict.CONTINUE)):
        rate = 1 / (1 + math.exp(abs(value) + margin))
        test = Sprt(elo0, elo1, alpha=rate, beta=rate, model=model)
        assert test.status(counts).verdict == verdict, margin


def test_a_zero_count_counts_as_a_thousandth() -> None:
    """fishtest's regularisation: W 10, L 0, D 0 scores (10 + ½ 0.001) / 10.002."""
    assert elo_estimate(Trinomial(wins=10, losses=0, draws=0)).score == pytest.approx(
        (10 + 0.0005) / 10.002, rel=1e-12
    )
    assert elo_estimate(Trinomial(wins=10, losses=0, draws=0)).elo == pytest.approx(
        400 * math.log10(999)  # the score clamped to 0.999
    )


def test_bayeselo_waits_for_a_win_a_loss_and_a_draw() -> None:
    """cutechess-cli continues (and says nothing) until every outcome has happened once."""
    test = Sprt(0, 10, model="bayeselo")
    assert test.status(Trinomial(wins=500, losses=0, draws=10)).llr == 0
    assert test.status(Trinomial(wins=500, losses=0, draws=10)).verdict == Verdict.CONTINUE
    with pytest.raises(StatsError, match="wins, losses and draws only"):
        test.status(Pentanomial((1, 2, 3, 2, 1)))


def test_no_games_no_evidence() -> None:
    for model in ("normalized", "logistic", "bayeselo"):
        assert llr(Trinomial(0, 0, 0), 0, 5, model) == 0
    with pytest.raises(StatsError, match="no games"):
        elo_estimate(Pentanomial((0, 0, 0, 0, 0)))


# -- the LLRs, checked independently --------------------------------------------------------
def most_likely(log_likelihood: Callable[[float], float], low: float, high: float) -> float:
    """The maximum of a unimodal function on (low, high), by golden-section search."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = log_likelihood(c), log_likelihood(d)
    for _ in range(200):
        if fc > fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = log_likelihood(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = log_likelihood(d)
    return max(fc, fd)


def logistic_likelihood(counts: Trinomial, elo: float) -> float:
    """The largest log-likelihood of `counts` among the laws whose mean score is L(elo).

    A mean score s leaves one free parameter, the draw rate r: W s - r/2, L 1 - s - r/2.
    """
    s = 1 / (1 + 10 ** (-elo / 400))
    return most_likely(
        lambda r: (
            counts.wins * math.log(s - r / 2)
            + counts.losses * math.log(1 - s - r / 2)
            + counts.draws * math.log(r)
        ),
        0,
        2 * min(s, 1 - s),
    )


def normalized_likelihood(counts: Trinomial, nelo: float) -> float:
    """The largest log-likelihood of `counts` among the laws whose t-value is nelo / (800/ln 10).

    With draw rate r and δ = P(W) - P(L), t = δ / sqrt(1 - r - δ²), so δ = t sqrt((1 - r)/(1 + t²)).
    """
    t = nelo / NELO_PER_T

    def log_likelihood(r: float) -> float:
        delta = t * math.sqrt((1 - r) / (1 + t * t))
        return (
            counts.wins * math.log((1 - r + delta) / 2)
            + counts.losses * math.log((1 - r - delta) / 2)
            + counts.draws * math.log(r)
        )

    return most_likely(log_likelihood, 0, 1 / (1 + t * t))


some = st.integers(1, 5000)
bounds = st.tuples(st.floats(-50, 50), st.floats(0.5, 50)).map(lambda b: (b[0], b[0] + b[1]))


@given(st.builds(Trinomial, some, some, some), bounds)
def test_trinomial_llrs_are_ratios_of_maximum_likelihoods(
    counts: Trinomial, elo_bounds: tuple[float, float]
) -> None:
    """The generalized LLR, found here by brute force over the one free parameter."""
    elo0, elo1 = elo_bounds
    for model, likelihood in (
        ("logistic", logistic_likelihood),
        ("normalized", normalized_likelihood),
    ):
        expected = likelihood(counts, elo1) - likelihood(counts, elo0)
        exact = llr(counts, elo0, elo1, model)  # type: ignore[arg-type]
        assert exact == pytest.approx(expected, rel=1e-6, abs=1e-6), model


def normalized_alt(counts: Counts, nelo0: float, nelo1: float) -> float:
    """fishtest `LLR_normalized_alt` (Van den Bergh, "Normalized Elo: practical ...", §4.2)."""
    samples, mean, var = _mean_variance(counts)
    pairs = isinstance(counts, Pentanomial)
    sigma = math.sqrt(2 * var if pairs else var)
    games = 2 * samples if pairs else samples
    nt, nt0, nt1 = (mean - 0.5) / sigma, nelo0 / NELO_PER_T, nelo1 / NELO_PER_T
    return games / 2 * math.log((1 + (nt - nt0) ** 2) / (1 + (nt - nt1) ** 2))


def logistic_alt(counts: Counts, elo0: float, elo1: float) -> float:
    """fishtest `LLR_alt2` (Van den Bergh, "GSPRT approximation")."""
    samples, mean, var = _mean_variance(counts)
    s0, s1 = (1 / (1 + 10 ** (-elo / 400)) for elo in (elo0, elo1))
    return samples * (s1 - s0) * (2 * mean - s0 - s1) / var / 2


def _mean_variance(counts: Counts) -> tuple[float, float, float]:
    """Samples, mean and variance of the score per sample, from the counts directly."""
    frequencies = counts.frequencies
    total = sum(frequencies)
    values = [i / (len(frequencies) - 1) for i in range(len(frequencies))]
    mean = sum(n * x for n, x in zip(frequencies, values, strict=True)) / total
    var = sum(n * (x - mean) ** 2 for n, x in zip(frequencies, values, strict=True)) / total
    return total, mean, var


@st.composite
def engine_test_pairs(draw: st.DrawFn) -> Pentanomial:
    """Pair counts shaped like fishtest's: half the pairs even, a ½ either way for most of
    the rest, a few 0s and 2s (as in the published vectors), the two sides within 5%."""
    even = draw(st.integers(2000, 50000))
    halves = round(even * draw(st.floats(0.2, 0.6)))
    whole = round(even * draw(st.floats(0.003, 0.05)))
    tilt = st.floats(0.95, 1.05)
    return Pentanomial((whole, halves, even, round(halves * draw(tilt)), round(whole * draw(tilt))))


@given(engine_test_pairs(), st.floats(-2, 1), st.floats(0.5, 2))
def test_pentanomial_llrs_agree_with_fishtests_approximations(
    counts: Pentanomial, start: float, width: float
) -> None:
    """Near the estimate (bounds within a few error bars of it) the approximations hold."""
    estimate = elo_estimate(counts)
    for model, approximation, centre, error in (
        ("normalized", normalized_alt, estimate.nelo, estimate.nelo_error),
        ("logistic", logistic_alt, estimate.elo, estimate.elo_error),
    ):
        elo0 = centre + start * error
        elo1 = elo0 + width * error
        exact = llr(counts, elo0, elo1, model)  # type: ignore[arg-type]
        assert exact == pytest.approx(approximation(counts, elo0, elo1), rel=0.02, abs=0.02), model


# -- symmetries ---------------------------------------------------------------------------
small = st.integers(1, 400)
counts_strategy = st.one_of(
    st.builds(Trinomial, small, small, small),
    st.builds(lambda *c: Pentanomial(c), small, small, small, small, small),
)
models = st.sampled_from(["normalized", "logistic", "bayeselo"])


def mirrored(counts: Counts) -> Counts:
    """The same results seen from the other player."""
    if isinstance(counts, Trinomial):
        return Trinomial(wins=counts.losses, losses=counts.wins, draws=counts.draws)
    a, b, c, d, e = counts.counts
    return Pentanomial((e, d, c, b, a))


def scaled(counts: Counts, k: int) -> Counts:
    if isinstance(counts, Trinomial):
        return Trinomial(counts.wins * k, counts.losses * k, counts.draws * k)
    a, b, c, d, e = (n * k for n in counts.counts)
    return Pentanomial((a, b, c, d, e))


@given(counts_strategy, bounds, models)
def test_the_other_players_view_negates_the_llr(
    counts: Counts, elo_bounds: tuple[float, float], model: Model
) -> None:
    if model == "bayeselo" and isinstance(counts, Pentanomial):
        return
    elo0, elo1 = elo_bounds
    expected = -llr(counts, elo0, elo1, model)
    assert llr(mirrored(counts), -elo1, -elo0, model) == pytest.approx(expected, abs=1e-6)


@given(counts_strategy, bounds, models, st.integers(2, 20))
def test_the_llr_grows_with_the_evidence(
    counts: Counts, elo_bounds: tuple[float, float], model: Model, k: int
) -> None:
    """The same proportions k times over: the generalized LLR is k times as large."""
    if model == "bayeselo" and isinstance(counts, Pentanomial):
        return
    elo0, elo1 = elo_bounds
    once = llr(counts, elo0, elo1, model)
    assert llr(scaled(counts, k), elo0, elo1, model) == pytest.approx(k * once, abs=1e-6)


@given(counts_strategy)
def test_elo_estimate_symmetries(counts: Counts) -> None:
    estimate, other = elo_estimate(counts), elo_estimate(mirrored(counts))
    assert other.elo == pytest.approx(-estimate.elo, abs=1e-9)
    assert other.nelo == pytest.approx(-estimate.nelo, abs=1e-9)
    assert other.los == pytest.approx(1 - estimate.los, abs=1e-9)
    assert other.elo_error == pytest.approx(estimate.elo_error)
    assert estimate.elo_error > 0 and estimate.nelo_error > 0
    assert (estimate.elo > 0) == (estimate.los > 0.5) == (estimate.score > 0.5)
    bigger = elo_estimate(scaled(counts, 4))  # four times the games: half the error
    assert bigger.elo == pytest.approx(estimate.elo)
    assert bigger.nelo_error == pytest.approx(estimate.nelo_error / 2)
    assert bigger.elo_error < estimate.elo_error


def test_elo_estimate_values() -> None:
    three_to_one = elo_estimate(Trinomial(wins=250, losses=50, draws=100))
    assert three_to_one.elo == pytest.approx(400 * math.log10(3))  # score 0.75
    assert three_to_one.score == pytest.approx(0.75)
    # The variance of a game's score: 0.625 (1 - 0.75)² + 0.25 (½ - 0.75)² + 0.125 (0 - 0.75)².
    variance = 0.125
    # Score 0.75 ± 1.96 standard errors, mapped to Elo.
    half_width = 1.959963984540054 * math.sqrt(variance / 400)
    low, high = (-400 * math.log10(1 / s - 1) for s in (0.75 - half_width, 0.75 + half_width))
    assert three_to_one.elo_error == pytest.approx((high - low) / 2)
    assert three_to_one.nelo == pytest.approx(0.25 / math.sqrt(variance) * NELO_PER_T)
    assert three_to_one.nelo_error == pytest.approx(1.959963984540054 / 20 * NELO_PER_T)
    even = elo_estimate(Pentanomial((10, 20, 40, 20, 10)))
    assert even.elo == pytest.approx(0)
    assert even.los == pytest.approx(0.5)
    assert even.games == 200


def test_pairs_of_independent_games_estimate_as_the_games_do() -> None:
    """Games L 0.2, D 0.5, W 0.3, paired independently: pairs 0.04, 0.2, 0.37, 0.3, 0.09.

    A pair's mean has half a game's variance then, so 100 such pairs say what 200 games do.
    """
    pairs = elo_estimate(Pentanomial((4, 20, 37, 30, 9)))
    games = elo_estimate(Trinomial(wins=60, losses=40, draws=100))
    for field in ("games", "score", "elo", "elo_error", "nelo", "nelo_error", "los"):
        assert getattr(pairs, field) == pytest.approx(getattr(games, field)), field


# -- validation ---------------------------------------------------------------------------
def test_pentanomial_parse_round_trips() -> None:
    penta = Pentanomial.parse("365, 16618,36229,16974,390")
    assert penta == Pentanomial((365, 16618, 36229, 16974, 390))
    assert Pentanomial.parse(str(penta)) == penta
    assert (penta.pairs, penta.games) == (70576, 141152)


@pytest.mark.parametrize(
    "text", ["1,2,3,4", "1,2,3,4,5,6", "1,2,-3,4,5", "1,2,3,4,²", "a,b,c,d,e", ""]
)
def test_pentanomial_parse_refuses(text: str) -> None:
    with pytest.raises(StatsError, match="5 whole numbers"):
        Pentanomial.parse(text)


def test_bad_counts_and_designs_are_refused() -> None:
    with pytest.raises(StatsError, match="whole numbers ≥ 0"):
        Trinomial(wins=-1, losses=0, draws=0)
    with pytest.raises(StatsError, match="5 counts"):
        Pentanomial((1, 2, 3))  # type: ignore[arg-type]
    with pytest.raises(StatsError, match="elo0 must be below elo1"):
        Sprt(2, 2)
    with pytest.raises(StatsError, match="alpha"):
        Sprt(0, 2, alpha=0.6, beta=0.5)
    with pytest.raises(StatsError, match="unknown model"):
        Sprt(0, 2, model="elo")  # type: ignore[arg-type]


# -- agon stats ---------------------------------------------------------------------------
BAYESELO = [
    "stats", "sprt", "--wins", "1477", "--losses", "1351", "--draws", "2942",
    "--elo0", "0", "--elo1", "10", "--alpha", "0.01", "--beta", "0.01", "--model", "bayeselo",
]  # fmt: skip


def test_cli_sprt_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(BAYESELO) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0] == "Games  5770: W 1477  L 1351  D 2942"
    assert lines[1].startswith("Elo    +7.59 ± 6.28 (95%)")
    assert lines[1].endswith("LOS 99.1%")
    assert lines[2] == "SPRT   bayeselo Elo [0, 10], alpha 0.01, beta 0.01"
    assert lines[3] == "LLR    2.53 [-4.60, 4.60]: continue"


def test_cli_sprt_pentanomial_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["stats", "sprt", "--penta", "223,9863,21279,10037,246", "--elo0", "0.5"]
    assert cli.main([*argv, "--elo1", "2.5", "--model", "logistic"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Pairs  41648 (83296 games)")
    assert lines[-1] == "LLR    -3.07 [-2.94, 2.94]: accept H0"


def test_cli_sprt_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["stats", "sprt", "--penta", "365,16618,36229,16974,390", "--elo0", "0"]
    assert cli.main([*argv, "--elo1", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pentanomial"] == [365, 16618, 36229, 16974, 390]
    assert report["games"] == 141152
    sprt = report["sprt"]
    assert sprt["model"] == "normalized"
    assert sprt["llr"] == pytest.approx(2.25, rel=0.01)
    assert sprt["upper_bound"] == pytest.approx(math.log(19))
    assert sprt["verdict"] == "continue"


def test_cli_elo(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["stats", "elo", "--wins", "250", "--losses", "50", "--draws", "100", "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["wins"], report["losses"], report["draws"]) == (250, 50, 100)
    assert report["elo"] == pytest.approx(400 * math.log10(3))
    assert "sprt" not in report


SPRT = ["stats", "sprt", "--elo0", "0", "--elo1", "5"]


@pytest.mark.parametrize(
    ("argv", "first_line"),
    [
        ([*SPRT], "agon stats: no results: give --wins W --losses L --draws D, or --penta"),
        ([*SPRT, "--wins", "0"], "agon stats: no games in the results"),
        ([*SPRT, "--wins", "3", "--penta", "1,2,3,4,5"], "agon stats: give --wins/--losses/"),
        ([*SPRT, "--penta", "1,2,3"], "agon stats sprt: error: argument --penta: a pentanomial"),
        ([*SPRT, "--wins", "-2"], "agon stats sprt: error: argument --wins: must be a whole"),
        ([*SPRT, "--wins", "3", "--alpha", "1"], "argument --alpha: must be a number between"),
        ([*SPRT, "--wins", "3", "--alpha", "0.6", "--beta", "0.5"], "--alpha + --beta must be"),
        ([*SPRT, "--wins", "3", "--model", "elo"], "argument --model: invalid choice: 'elo'"),
        (
            ["stats", "sprt", "--wins", "3", "--elo0", "5", "--elo1", "0"],
            "agon stats: --elo0 must be below --elo1, got 5 and 0",
        ),
        (
            ["stats", "sprt", "--wins", "3", "--elo0", "inf", "--elo1", "0"],
            "agon stats sprt: error: argument --elo0: must be a finite number, got 'inf'",
        ),
        (
            [*SPRT, "--penta", "1,2,3,4,5", "--model", "bayeselo"],
            "agon stats: --model bayeselo (cutechess-cli's SPRT) counts games",
        ),
        (["stats", "sprt", "--wins", "3"], "the following arguments are required: --elo0, --elo1"),
        (["stats"], "agon stats: error: the following arguments are required: STATISTIC"),
    ],
)
def test_cli_bad_input_is_one_line(
    argv: list[str], first_line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_status(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert first_line in err.splitlines()[0]
    assert "Traceback" not in err


def exit_status(argv: list[str]) -> int | str | None:
    """`cli.main(argv)`'s status, returned or (from argparse, while parsing) raised."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


def test_cli_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", *BAYESELO, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stderr) == (0, "")
    sprt = json.loads(proc.stdout)["sprt"]
    assert sprt["llr"] == pytest.approx(2.52, rel=0.01)
    assert sprt["lower_bound"] == pytest.approx(-4.6, rel=0.01)
    assert sprt["verdict"] == "continue"
