"""`agon stats sprt|elo`: match statistics for counts given on the command line, no Redis.

`agon stats elo` prints the Elo difference with its 95% error bar, the normalized Elo and
the LOS of the first player; `agon stats sprt` adds the SPRT's log-likelihood ratio, its
bounds and the verdict (accept H0, accept H1, continue). The counts are either
`--wins W --losses L --draws D` (a count left out is 0) or `--penta a,b,c,d,e`, game pairs
scoring 0, ½, 1, 1½, 2. `--json` prints one JSON object for scripts. The formulas are
fishtest's and cutechess-cli's (`services.stats.sprt`). A bad input is one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.cli.options import UsageError, finite_float, non_negative_int, probability
from services.stats.sprt import (
    MODELS,
    Counts,
    EloEstimate,
    Pentanomial,
    Sprt,
    SprtStatus,
    StatsError,
    Trinomial,
    Verdict,
    elo_estimate,
)

VERDICTS = {
    Verdict.ACCEPT_H0: "accept H0",
    Verdict.ACCEPT_H1: "accept H1",
    Verdict.CONTINUE: "continue",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="stats_command", required=True, metavar="STATISTIC")
    sprt = sub.add_parser(
        "sprt",
        help="the SPRT's log-likelihood ratio, bounds and verdict, with Elo and LOS",
        description="The SPRT of H0: Elo = ELO0 against H1: Elo = ELO1 for the given results.",
    )
    _add_counts(sprt)
    sprt.add_argument("--elo0", type=finite_float, required=True, help="Elo under H0")
    sprt.add_argument("--elo1", type=finite_float, required=True, help="Elo under H1 (above ELO0)")
    sprt.add_argument(
        "--alpha", type=probability, default=0.05, help="false positive rate (default 0.05)"
    )
    sprt.add_argument(
        "--beta", type=probability, default=0.05, help="false negative rate (default 0.05)"
    )
    sprt.add_argument(
        "--model",
        choices=MODELS,
        default="normalized",
        help="Elo model of ELO0 and ELO1: normalized (fishtest, default), logistic "
        "(fishtest), bayeselo (cutechess-cli; wins, losses and draws only)",
    )
    _add_json(sprt)
    elo = sub.add_parser(
        "elo",
        help="the Elo difference with its 95%% error bar, and LOS",
        description="The first player's Elo difference, 95% error bar and LOS.",
    )
    _add_counts(elo)
    _add_json(elo)


def _add_counts(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("results of the first player (give W-L-D or --penta)")
    group.add_argument("--wins", type=non_negative_int, metavar="W")
    group.add_argument("--losses", type=non_negative_int, metavar="L")
    group.add_argument("--draws", type=non_negative_int, metavar="D")
    group.add_argument(
        "--penta",
        type=_pentanomial,
        metavar="a,b,c,d,e",
        help="game pairs (seats swapped) scoring 0, 1/2, 1, 3/2, 2",
    )


def _add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _pentanomial(text: str) -> Pentanomial:
    try:
        return Pentanomial.parse(text)
    except StatsError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    counts = _counts(args)
    estimate = elo_estimate(counts)
    status = None
    if args.stats_command == "sprt":
        status = _sprt_status(args, counts)
    if args.json:
        print(json.dumps(_report(counts, estimate, args, status), sort_keys=True))
        return 0
    print(_counts_line(counts))
    print(
        f"Elo    {estimate.elo:+.2f} ± {estimate.elo_error:.2f} (95%)   "
        f"nElo {estimate.nelo:+.2f} ± {estimate.nelo_error:.2f}   LOS {estimate.los:.1%}"
    )
    if status is not None:
        print(
            f"SPRT   {args.model} Elo [{args.elo0:g}, {args.elo1:g}], "
            f"alpha {args.alpha:g}, beta {args.beta:g}"
        )
        print(
            f"LLR    {status.llr:.2f} [{status.lower_bound:.2f}, {status.upper_bound:.2f}]: "
            f"{VERDICTS[status.verdict]}"
        )
    return 0


def _counts(args: argparse.Namespace) -> Counts:
    trinomial = (args.wins, args.losses, args.draws)
    if args.penta is not None:
        if any(count is not None for count in trinomial):
            raise UsageError("give --wins/--losses/--draws or --penta, not both")
        counts: Counts = args.penta
    elif all(count is None for count in trinomial):
        raise UsageError("no results: give --wins W --losses L --draws D, or --penta a,b,c,d,e")
    else:
        wins, losses, draws = (count or 0 for count in trinomial)
        counts = Trinomial(wins, losses, draws)
    if counts.games == 0:
        raise UsageError("no games in the results: at least one count must be above 0")
    return counts


def _sprt_status(args: argparse.Namespace, counts: Counts) -> SprtStatus:
    if not args.elo0 < args.elo1:
        raise UsageError(f"--elo0 must be below --elo1, got {args.elo0:g} and {args.elo1:g}")
    if not args.alpha + args.beta < 1:
        raise UsageError(f"--alpha + --beta must be below 1, got {args.alpha + args.beta:g}")
    if args.model == "bayeselo" and isinstance(counts, Pentanomial):
        raise UsageError(
            "--model bayeselo (cutechess-cli's SPRT) counts games: give --wins/--losses/--draws"
        )
    try:
        return Sprt(args.elo0, args.elo1, args.alpha, args.beta, args.model).status(counts)
    except StatsError as e:
        raise UsageError(str(e)) from None


def _counts_line(counts: Counts) -> str:
    if isinstance(counts, Pentanomial):
        scores = " ".join(str(count) for count in counts.counts)
        return f"Pairs  {counts.pairs} ({counts.games} games) scoring 0, ½, 1, 1½, 2: {scores}"
    return f"Games  {counts.games}: W {counts.wins}  L {counts.losses}  D {counts.draws}"


def _report(
    counts: Counts, estimate: EloEstimate, args: argparse.Namespace, status: SprtStatus | None
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "games": estimate.games,
        "score": estimate.score,
        "elo": estimate.elo,
        "elo_error": estimate.elo_error,
        "nelo": estimate.nelo,
        "nelo_error": estimate.nelo_error,
        "los": estimate.los,
    }
    if isinstance(counts, Pentanomial):
        report["pentanomial"] = list(counts.counts)
    else:
        report.update(wins=counts.wins, losses=counts.losses, draws=counts.draws)
    if status is not None:
        report["sprt"] = {
            "model": args.model,
            "elo0": args.elo0,
            "elo1": args.elo1,
            "alpha": args.alpha,
            "beta": args.beta,
            "llr": status.llr,
            "lower_bound": status.lower_bound,
            "upper_bound": status.upper_bound,
            "verdict": status.verdict.value,
        }
    return report
