"""What a competition shows, from its finished games: standings, crosstable, ratings and more.

The input is one `GameResult` per finished game; everything here is a pure function of a
collection of them (standard library, `sprt` and `glicko2` only), whatever their order:

- `standings`: points, wins/losses/draws, Buchholz and Sonneborn-Berger, ranked;
- `crosstable`: every player's record against every opponent met, overall and per seat;
- `terminations` and `faults`: how each player's games ended, and which ends were their fault;
- `health`: a bot's operational record: faults by kind and its think-time quantiles;
- `pair_stats`: one player against another, with the pentanomial of seat-swapped pairs and
  the Elo difference (`sprt.elo_estimate`);
- `ratings`: a Glicko-2 leaderboard per rules and options (`glicko2.Glicko2`).

A game ended by the platform (`PLATFORM_REASONS`) is not scored: it is left out of everything
but `terminations` and `health`. So is a game in which one player holds both seats: it says
nothing about that player against anyone, so it is left out of the standings, crosstable and
ratings too (it still counts in `terminations`, `faults` and `health`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schemas.events import PLATFORM_REASONS
from services.stats.glicko2 import Glicko2, Rating
from services.stats.sprt import EloEstimate, Pentanomial, Trinomial, elo_estimate

__all__ = [
    "DEFAULT_SYSTEM",
    "FAULT_REASONS",
    "PLATFORM_REASONS",
    "WLD",
    "Cell",
    "GameResult",
    "Health",
    "Options",
    "PairStats",
    "RatingRow",
    "Standing",
    "crosstable",
    "faults",
    "health",
    "pair_stats",
    "ratings",
    "standings",
    "terminations",
]

#: Terminations that are a player's fault (`faults`): the seat the end names (`fault`), or
#: else the seat that did not win; any other reason (natural, aborted, interrupted) is
#: nobody's.
FAULT_REASONS = frozenset(
    {"resignation", "time_forfeit", "illegal_move", "no_reply", "disconnect", "abort"}
)
#: Sorted (name, value) option pairs: with the rules' name, what a leaderboard is for.
Options = tuple[tuple[str, str], ...]

_SEATS = (1, 2)


@dataclass(frozen=True, slots=True)
class GameResult:
    """One finished game, as the results read it."""

    game_id: str
    #: The rules' name, e.g. "teeko".
    game: str
    #: Sorted option pairs.
    options: Options
    #: The names of seat 1 and seat 2.
    players: tuple[str, str]
    #: The winning seat, 1 or 2; 0 for a draw (or no result).
    winner: int
    #: How it ended: natural, resignation, time_forfeit, illegal_move, no_reply, disconnect,
    #: abort (a player's), aborted, interrupted (the platform's).
    reason: str
    ended_ms: int
    #: Per seat, each move's think time in ms.
    think_ms: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    #: Per seat, the platform's lag before each of its turns reached it, in ms (bots only).
    lag_ms: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())
    #: The encounter: the two games of a pair (seats swapped) share it; "" for none.
    pair: str = ""
    round: int = 0
    #: The seat whose fault the end was, as the log names it (0: unnamed).
    fault: int = 0
    #: The seats people held (a named person's; an anonymous seat has no result).
    people: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.winner not in (0, *_SEATS):
            raise ValueError(f"winner is a seat (1, 2) or 0, got {self.winner!r}")

    @property
    def counts(self) -> bool:
        """False when the platform ended it (PLATFORM_REASONS): not scored."""
        return self.reason not in PLATFORM_REASONS

    def score(self, seat: int) -> float:
        """That seat's score: 1 for a win, 0.5 for a draw, 0 for a loss. A game a seat
        aborted has no winner, but scores as that seat's forfeit: aborting a lost game must
        not earn half a point."""
        if seat not in _SEATS:
            raise ValueError(f"a seat is 1 or 2, got {seat!r}")
        winner = self.winner
        if winner == 0 and self.reason == "abort" and self.fault in _SEATS:
            winner = 3 - self.fault
        if winner == 0:
            return 0.5
        return 1.0 if winner == seat else 0.0

    def seat_of(self, name: str) -> int | None:
        """The first seat `name` holds, None if neither."""
        for seat in _SEATS:
            if self.players[seat - 1] == name:
                return seat
        return None

    @property
    def self_play(self) -> bool:
        """Whether one player holds both seats."""
        return self.players[0] == self.players[1]

    @property
    def at_fault(self) -> str | None:
        """The player whose fault a `FAULT_REASONS` end was: the seat the log names, else
        the loser; None otherwise (or for a fault without a winner or a named seat)."""
        if self.reason not in FAULT_REASONS:
            return None
        if self.fault in _SEATS:
            return self.players[self.fault - 1]
        return None if self.winner == 0 else self.players[2 - self.winner]


def _scored(results: Iterable[GameResult]) -> list[GameResult]:
    """The games that score: counted, between two different players."""
    return [result for result in results if result.counts and not result.self_play]


# -- standings --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Standing:
    """A player's line in the standings."""

    name: str
    games: int
    wins: int
    losses: int
    draws: int
    #: Game points plus one per bye.
    points: float
    #: The sum of the opponents' points, one term per game played.
    buchholz: float
    #: The sum, per game played, of the points scored in it times the opponent's points.
    sonneborn_berger: float
    #: 1-based; players tied on points, Buchholz and Sonneborn-Berger share a rank.
    rank: int


def standings(
    results: Iterable[GameResult],
    players: Iterable[str] | None = None,
    byes: Mapping[str, int] | None = None,
) -> list[Standing]:
    """The standings over the scored games, best first.

    Every player of any result, of `players` and of `byes` has a line. A bye is worth one
    point and is not a game. Sorted by points, Buchholz, Sonneborn-Berger (all descending),
    then name.
    """
    results = list(results)
    byes = byes or {}
    for name, count in byes.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"byes are whole numbers >= 0, got {count!r} for {name!r}")
    names = set(players or ()) | set(byes)
    names.update(name for result in results for name in result.players)
    games = _scored(results)
    points: dict[str, float] = {name: float(byes.get(name, 0)) for name in names}
    tally: dict[str, list[int]] = {name: [0, 0, 0] for name in names}  # wins, losses, draws
    for result in games:
        for seat in _SEATS:
            score = result.score(seat)
            points[result.players[seat - 1]] += score
            tally[result.players[seat - 1]][0 if score == 1 else 1 if score == 0 else 2] += 1
    buchholz = dict.fromkeys(names, 0.0)
    berger = dict.fromkeys(names, 0.0)
    for result in games:
        for seat in _SEATS:
            name, opponent = result.players[seat - 1], result.players[2 - seat]
            buchholz[name] += points[opponent]
            berger[name] += result.score(seat) * points[opponent]
    order = sorted(names, key=lambda name: (-points[name], -buchholz[name], -berger[name], name))
    table: list[Standing] = []
    for index, name in enumerate(order):
        rank = index + 1
        if table:
            last = table[-1]
            if (last.points, last.buchholz, last.sonneborn_berger) == (
                points[name],
                buchholz[name],
                berger[name],
            ):
                rank = last.rank
        wins, losses, draws = tally[name]
        table.append(
            Standing(
                name=name,
                games=wins + losses + draws,
                wins=wins,
                losses=losses,
                draws=draws,
                points=points[name],
                buchholz=buchholz[name],
                sonneborn_berger=berger[name],
                rank=rank,
            )
        )
    return table


# -- crosstable -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WLD:
    """Wins, losses and draws."""

    wins: int = 0
    losses: int = 0
    draws: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.losses + self.draws


@dataclass(frozen=True, slots=True)
class Cell:
    """A row player's record against a column player: overall, and by the row player's seat."""

    wins: int
    losses: int
    draws: int
    as_first: WLD
    as_second: WLD

    @property
    def games(self) -> int:
        return self.wins + self.losses + self.draws


def crosstable(results: Iterable[GameResult]) -> dict[str, dict[str, Cell]]:
    """`table[row][column]`: row's record against column over the scored games.

    Only opponents met have a cell, and a cell's mirror (column against row) is always there.
    """
    # (row, column) -> per row seat: [wins, losses, draws]
    tally: dict[tuple[str, str], dict[int, list[int]]] = defaultdict(
        lambda: {seat: [0, 0, 0] for seat in _SEATS}
    )
    for result in _scored(results):
        for seat in _SEATS:
            score = result.score(seat)
            key = result.players[seat - 1], result.players[2 - seat]
            tally[key][seat][0 if score == 1 else 1 if score == 0 else 2] += 1
    table: dict[str, dict[str, Cell]] = {}
    for (row, column), by_seat in sorted(tally.items()):
        first, second = WLD(*by_seat[1]), WLD(*by_seat[2])
        table.setdefault(row, {})[column] = Cell(
            first.wins + second.wins,
            first.losses + second.losses,
            first.draws + second.draws,
            first,
            second,
        )
    return table


# -- terminations, faults, health -------------------------------------------------------------
def terminations(results: Iterable[GameResult]) -> dict[str, dict[str, int]]:
    """Per player, how many of the games they played (platform-ended ones too) ended each way."""
    table: dict[str, dict[str, int]] = {}
    for result in results:
        for name in dict.fromkeys(result.players):  # once per game, even when self-play
            counts = table.setdefault(name, {})
            counts[result.reason] = counts.get(result.reason, 0) + 1
    return table


def faults(results: Iterable[GameResult]) -> dict[str, dict[str, int]]:
    """Per player, the ends that were their fault by reason (`GameResult.at_fault`).

    Every player of `results` has an entry, empty when they never were at fault.
    """
    table: dict[str, dict[str, int]] = {}
    for result in results:
        for name in result.players:
            table.setdefault(name, {})
        culprit = result.at_fault
        if culprit is not None:
            table[culprit][result.reason] = table[culprit].get(result.reason, 0) + 1
    return table


@dataclass(frozen=True, slots=True)
class Health:
    """A player's operational record over all the games it played (platform-ended included)."""

    games: int
    moves: int
    #: Games lost on time (time_forfeit), by an illegal move, for not replying, by disconnecting.
    timeouts: int
    illegal_moves: int
    no_replies: int
    disconnects: int
    #: Think-time quantiles (nearest rank) over every move it made; 0 with no moves.
    think_p50_ms: int
    think_p95_ms: int
    #: The platform's lag before its turns reached it (p95, ms), and its games the platform
    #: ended (`interrupted`: a turn it never delivered in time; replayed, not scored).
    lag_p95_ms: int = 0
    interrupted: int = 0


def _nearest_rank(ordered: list[int], percent: int) -> int:
    """The `percent` quantile of ascending `ordered` by the nearest-rank method; 0 if empty."""
    if not ordered:
        return 0
    rank = max(1, -(-percent * len(ordered) // 100))  # ceil(percent / 100 * n)
    return ordered[rank - 1]


def health(results: Iterable[GameResult]) -> dict[str, Health]:
    """Per player: games, moves, faults by kind, think-time quantiles, and what the platform
    cost it: its lag before the player's turns reached it, the games it ended."""
    results = list(results)
    games: dict[str, int] = defaultdict(int)
    thinks: dict[str, list[int]] = defaultdict(list)
    lags: dict[str, list[int]] = defaultdict(list)
    interrupted: dict[str, int] = defaultdict(int)
    for result in results:
        for name in dict.fromkeys(result.players):
            games[name] += 1
            interrupted[name] += result.reason == "interrupted"
        for seat in _SEATS:
            thinks[result.players[seat - 1]].extend(result.think_ms[seat - 1])
            lags[result.players[seat - 1]].extend(result.lag_ms[seat - 1])
    by_reason = faults(results)
    table: dict[str, Health] = {}
    for name in sorted(games):
        ordered = sorted(thinks[name])
        mine = by_reason.get(name, {})
        table[name] = Health(
            games=games[name],
            moves=len(ordered),
            timeouts=mine.get("time_forfeit", 0),
            illegal_moves=mine.get("illegal_move", 0),
            no_replies=mine.get("no_reply", 0),
            disconnects=mine.get("disconnect", 0),
            think_p50_ms=_nearest_rank(ordered, 50),
            think_p95_ms=_nearest_rank(ordered, 95),
            lag_p95_ms=_nearest_rank(sorted(lags[name]), 95),
            interrupted=interrupted[name],
        )
    return table


# -- one player against another ---------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PairStats:
    """Player `a` against player `b`, from a's view, over the counted games between them."""

    a: str
    b: str
    wins: int
    losses: int
    draws: int
    #: Complete pairs by a's pair score 0, ½, 1, 1½, 2 (see `pair_stats`).
    penta: tuple[int, int, int, int, int]
    #: From the pentanomial when there is a complete pair, else from W/L/D; None with no games.
    elo: EloEstimate | None

    @property
    def games(self) -> int:
        return self.wins + self.losses + self.draws

    @property
    def pairs(self) -> int:
        return sum(self.penta)

    @property
    def trinomial(self) -> Trinomial:
        return Trinomial(self.wins, self.losses, self.draws)

    @property
    def pentanomial(self) -> Pentanomial:
        return Pentanomial(self.penta)


def pair_stats(results: Iterable[GameResult], a: str, b: str) -> PairStats:
    """a's wins, losses, draws, pentanomial and Elo difference against b.

    A complete pair is a `pair` id whose counted games are exactly two, both between a and
    b, with the seats swapped: a platform-ended game is left out (its replay completes the
    pair). Games
    outside complete pairs count in W/L/D only.
    """
    if a == b:
        raise ValueError(f"pair_stats needs two different players, got {a!r} twice")
    results = list(results)
    wins = losses = draws = 0
    for result in _scored(results):
        seat = result.seat_of(a)
        if seat is None or result.seat_of(b) is None:
            continue
        score = result.score(seat)
        wins, losses, draws = wins + (score == 1), losses + (score == 0), draws + (score == 0.5)
    by_pair: dict[str, list[GameResult]] = defaultdict(list)
    for result in results:
        if result.pair and result.counts:  # a platform-ended game's replay takes its place
            by_pair[result.pair].append(result)
    penta = [0, 0, 0, 0, 0]
    for games in by_pair.values():
        if len(games) != 2 or not all(set(g.players) == {a, b} for g in games):
            continue
        seats = [g.seat_of(a) or 0 for g in games]
        if seats[0] == seats[1]:
            continue
        penta[round(2 * sum(g.score(s) for g, s in zip(games, seats, strict=True)))] += 1
    p0, p1, p2, p3, p4 = penta
    elo: EloEstimate | None = None
    if sum(penta):
        elo = elo_estimate(Pentanomial((p0, p1, p2, p3, p4)))
    elif wins + losses + draws:
        elo = elo_estimate(Trinomial(wins, losses, draws))
    return PairStats(a, b, wins, losses, draws, (p0, p1, p2, p3, p4), elo)


# -- ratings ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RatingRow:
    """A player's line on a leaderboard, the deviation as of the leaderboard's time."""

    name: str
    rating: float
    deviation: float
    volatility: float
    games: int
    provisional: bool
    #: A person's line (a named human seat's), listed apart from the bots'.
    person: bool = False


#: The system `ratings` uses unless told otherwise: Glicko-2 with the module's defaults.
DEFAULT_SYSTEM = Glicko2()


def ratings(
    results: Iterable[GameResult],
    system: Glicko2 = DEFAULT_SYSTEM,
    now_ms: int | None = None,
) -> dict[tuple[str, Options], list[RatingRow]]:
    """A Glicko-2 leaderboard per (rules, options), over their scored games.

    Each leaderboard replays its games in (ended_ms, game_id) order, each game its own rating
    period (`Glicko2.game`). Rows are sorted by rating (descending), then name; deviations and
    provisional flags are as of `now_ms`, by default the end of the last game rated (of any
    leaderboard, so that all are shown as of the same time). A person's row (a name that
    held a person's seat) says so: people are listed apart from the bots.
    """
    games = sorted(_scored(results), key=lambda result: (result.ended_ms, result.game_id))
    if not games:
        return {}
    people = {result.players[seat - 1] for result in games for seat in result.people}
    now = games[-1].ended_ms if now_ms is None else now_ms
    boards: dict[tuple[str, Options], dict[str, Rating]] = {}
    for result in games:
        board = boards.setdefault((result.game, result.options), {})
        first, second = result.players
        board[first], board[second] = system.game(
            board.get(first, system.new()),
            board.get(second, system.new()),
            result.score(1),
            result.ended_ms,
        )
    table: dict[tuple[str, Options], list[RatingRow]] = {}
    for key, board in sorted(boards.items()):
        rows = []
        for name, rating in board.items():
            live = system.live(rating, now)
            rows.append(
                RatingRow(
                    name,
                    live.rating,
                    live.deviation,
                    live.volatility,
                    live.games,
                    system.provisional(live),
                    name in people,
                )
            )
        table[key] = sorted(rows, key=lambda row: (-row.rating, row.name))
    return table
