"""Statistics of results: Glicko-2 ratings (`glicko2`) and match statistics with the SPRT (`sprt`).

Pure functions of counts and ratings, standard library only; the projections and the
`agon stats` command call them.
"""

from services.stats.glicko2 import Glicko2, Rating, Result, update
from services.stats.sprt import (
    MODELS,
    Counts,
    EloEstimate,
    Model,
    Pentanomial,
    Sprt,
    SprtStatus,
    StatsError,
    Trinomial,
    Verdict,
    elo_estimate,
    llr,
)

__all__ = [
    "MODELS",
    "Counts",
    "EloEstimate",
    "Glicko2",
    "Model",
    "Pentanomial",
    "Rating",
    "Result",
    "Sprt",
    "SprtStatus",
    "StatsError",
    "Trinomial",
    "Verdict",
    "elo_estimate",
    "llr",
    "update",
]
