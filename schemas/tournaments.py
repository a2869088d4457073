"""Tournaments and matches: their specification and the events of their own log.

A tournament is an aggregate like a game: its log (`agon:tour:{<id>}:log`, entry ids
"<seq>-0") is the single source of truth, and everything else (which games to create, the
next Swiss round, standings) is a function of it and of the logs of its games. Events:

    TournamentCreated   the specification, once, at seq 1
    RoundPaired         a round's pairings (a bye: `second` null), with any relaxation
    GameScheduled       one game of a pairing: its id, seats, seed, encounter and leg
    GameRecorded        a scheduled game's end, as its own log has it
    TournamentEnded     completed, cancelled, no pairing left, or the SPRT decided

Game ids are derived from the tournament id, the round, the pairing and the leg, and every
append names the head it follows (`TournamentStore.append`), so a director that is killed
and restarted, or two directors at once, can neither lose nor double nor re-pair anything.
A `match` is a tournament of two bots that plays pairs of games until its SPRT decides.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.base import BotName, CommandId, GameId, TimeMs, WireModel
from schemas.commands import TimeoutPolicy
from schemas.events import EndReason

Format = Literal["round-robin", "swiss", "gauntlet", "match"]
FORMATS: tuple[Format, ...] = ("round-robin", "swiss", "gauntlet", "match")
SprtModel = Literal["normalized", "logistic", "bayeselo"]
EndedReason = Literal["completed", "cancelled", "no-pairing", "h0", "h1", "max-pairs"]
#: Tournament ids: short, so that the game ids derived from them stay ids.
TOURNAMENT_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,24}$")
TournamentId = Annotated[str, Field(pattern=TOURNAMENT_ID_RE.pattern)]


def new_tournament_id() -> str:
    return "t" + uuid.uuid4().hex[:10]


class SprtSpec(BaseModel):
    """The test a match runs: H0 elo0 against H1 elo1 at error rates alpha and beta."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    elo0: float
    elo1: float
    alpha: Annotated[float, Field(gt=0, lt=0.5)] = 0.05
    beta: Annotated[float, Field(gt=0, lt=0.5)] = 0.05
    model: SprtModel = "normalized"

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not self.elo0 < self.elo1:
            raise ValueError(f"want elo0 < elo1, got {self.elo0} and {self.elo1}")
        return self


class TournamentSpec(BaseModel):
    """What a tournament plays.

    `bots`: the players; for a gauntlet the first is the challenger, for a match exactly
    two (the test is of the first against the second). `rounds`: round-robin cycles, Swiss
    rounds, gauntlet rounds. Round robin, gauntlet and match play every encounter as a pair
    of games with the seats swapped and a shared seed; Swiss plays one game per pairing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Format
    game: Annotated[str, Field(min_length=1, max_length=64)]
    options: dict[str, str] = Field(default_factory=dict)
    bots: Annotated[list[BotName], Field(min_length=2, max_length=64)]
    rounds: Annotated[int, Field(ge=1, le=1000)] = 1
    move_time_ms: Annotated[int, Field(ge=1, le=3_600_000)] = 1000
    time_bank_ms: Annotated[int, Field(ge=0, le=3_600_000)] = 0
    on_timeout: TimeoutPolicy = "forfeit"
    #: Games played at once.
    concurrency: Annotated[int, Field(ge=1, le=1000)] = 4
    seed: int = 0
    name: Annotated[str, Field(max_length=100)] = ""
    #: A match only: the test, and the most pairs it plays before it stops undecided.
    sprt: SprtSpec | None = None
    max_pairs: Annotated[int, Field(ge=1, le=100_000)] = 1000

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if len(set(self.bots)) != len(self.bots):
            raise ValueError(f"a bot may play once: {self.bots}")
        if self.format == "match":
            if len(self.bots) != 2:
                raise ValueError(f"a match is between two bots, not {len(self.bots)}")
            if self.sprt is None:
                raise ValueError("a match needs its SPRT bounds (sprt)")
        elif self.sprt is not None:
            raise ValueError(f"only a match runs an SPRT, not a {self.format}")
        return self


class _TournamentEvent(WireModel):
    tournament_id: TournamentId
    seq: Annotated[int, Field(ge=1)]
    time: TimeMs


class TournamentCreated(_TournamentEvent):
    type: Literal["tournament_created"] = "tournament_created"
    spec: TournamentSpec
    command_id: CommandId


class Pairing(BaseModel):
    """Two players of a round (`second` None: `first` has a bye); `relaxed` names each
    Swiss colour rule that had to give way for a pairing to exist."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first: BotName
    second: BotName | None
    relaxed: list[str] = Field(default_factory=list)


class RoundPaired(_TournamentEvent):
    type: Literal["round_paired"] = "round_paired"
    round: Annotated[int, Field(ge=1)]
    pairings: list[Pairing]


class GameScheduled(_TournamentEvent):
    """One game: `seats` in order; `encounter` is shared by the games of a pairing, `leg`
    numbers them; `replay_of` names the game this one replays (ended by the platform)."""

    type: Literal["game_scheduled"] = "game_scheduled"
    game_id: GameId
    round: Annotated[int, Field(ge=1)]
    encounter: Annotated[str, Field(max_length=64)]
    leg: Annotated[int, Field(ge=1)]
    seats: Annotated[list[BotName], Field(min_length=2, max_length=2)]
    seed: int
    replay_of: GameId | None = None


class GameRecorded(_TournamentEvent):
    """A scheduled game ended: its winning seat (0: draw or no result) and termination."""

    type: Literal["game_recorded"] = "game_recorded"
    game_id: GameId
    winner: Annotated[int, Field(ge=0, le=2)]
    reason: EndReason
    fault: Annotated[int, Field(ge=0, le=2)] = 0


class TournamentEnded(_TournamentEvent):
    type: Literal["tournament_ended"] = "tournament_ended"
    reason: EndedReason
    detail: str = ""


TournamentEvent = Annotated[
    TournamentCreated | RoundPaired | GameScheduled | GameRecorded | TournamentEnded,
    Field(discriminator="type"),
]

__all__ = [
    "FORMATS",
    "TOURNAMENT_ID_RE",
    "EndedReason",
    "Format",
    "GameRecorded",
    "GameScheduled",
    "Pairing",
    "RoundPaired",
    "SprtModel",
    "SprtSpec",
    "TournamentCreated",
    "TournamentEnded",
    "TournamentEvent",
    "TournamentId",
    "TournamentSpec",
    "new_tournament_id",
]
