"""Tournament pairings: round robin, gauntlet and Swiss rounds.

A `Pairing` is one encounter: `first` takes seat 1 in its first game, `second` seat 2; a
pairing whose `second` is None (`Bye`) is a bye for `first`. Everything here is pure and
deterministic: the same players give the same pairings whatever order they come in (round
robin and gauntlet excepted, whose schedule follows the order given).

- `round_robin`: the circle (Berger) method. With n players (a bye added when n is odd) one
  cycle is n - 1 rounds, n when n is odd, and everyone meets everyone once; within a cycle
  each player's seat-1 and seat-2 counts differ by at most one and nobody has the same seat
  three rounds running. Further cycles repeat the first, the seats swapped every other cycle.
- `gauntlet`: the challenger meets each field player once a round, the seats alternating
  along the field and, for each field player, from round to round.
- `swiss_round`: one round of a Swiss tournament, a minimum-cost perfect matching
  (networkx's blossom algorithm). Two rules are never broken: nobody meets an opponent twice,
  and nobody gets a second bye; when no round satisfies both, `swiss_round` returns None and
  the tournament is over. With an odd number of players one gets a bye. Two colour rules are
  kept if at all possible: a player's colour difference (seat-1 games minus seat-2 games)
  stays within ±2, and nobody takes the same seat three times running. The round is first
  paired with them as hard rules; only when that fails are they relaxed, and each pairing
  that breaks one names it and the player in `Pairing.relaxed` ("colour-difference:bob",
  "colour-streak:bob"). Among the rounds allowed, the cost (`pairing_cost`, `bye_cost`)
  picks by these criteria, each outranking all those after it:

  1. the fewest colour-rule relaxations;
  2. the bye to the lowest-ranked player who has had none (ranked by score, then name);
  3. the smallest sum of squared score differences between partners;
  4. the fewest pairs whose two players would both rather have the same seat.

  Within a pair, seat 1 goes to the player with the lower colour difference; on a tie to the
  one who had seat 2 most recently where their histories differ, then to the first by name,
  unless the other way round breaks fewer colour rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx  # type: ignore[import-untyped,unused-ignore]

__all__ = [
    "MAX_COLOUR_DIFFERENCE",
    "RELAX_COLOUR_DIFFERENCE",
    "RELAX_COLOUR_STREAK",
    "Bye",
    "Pairing",
    "SwissPlayer",
    "bye_cost",
    "gauntlet",
    "pairing_cost",
    "round_robin",
    "swiss_round",
]

#: The `second` of a bye.
Bye = None
#: The largest colour difference a Swiss player may have, in absolute value.
MAX_COLOUR_DIFFERENCE = 2
#: Names of the relaxed colour rules in `Pairing.relaxed`, as "<rule>:<player>".
RELAX_COLOUR_DIFFERENCE = "colour-difference"
RELAX_COLOUR_STREAK = "colour-streak"


@dataclass(frozen=True, slots=True)
class Pairing:
    """One encounter of a round; a bye when `second` is None."""

    #: Takes seat 1 in the encounter's first game.
    first: str
    #: Takes seat 2; None when `first` has a bye.
    second: str | None
    #: The colour rules broken to find this pairing, as "<rule>:<player>"; usually none.
    relaxed: tuple[str, ...] = ()


def _check_unique(names: Sequence[str]) -> None:
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"players appear more than once: {repeated}")


# -- Round robin and gauntlet ---------------------------------------------------------------


def round_robin(players: Sequence[str], rounds: int | None = None) -> list[list[Pairing]]:
    """The first `rounds` rounds (default: one cycle) of a round robin by the circle method.

    The last of the n slots (the bye when n is odd) stays put while the others turn: in
    round r it meets slot r, and slot r + i meets slot r - i (modulo n - 1). Within a round
    the fixed slot's encounter comes first, or last if it is the bye. Each round of the
    second cycle is that of the first with the seats swapped; the third repeats the first.
    """
    names = list(players)
    _check_unique(names)
    if len(names) < 2:
        raise ValueError(f"a round robin needs at least 2 players, got {len(names)}")
    if rounds is not None and rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    slots: list[str | None] = [*names, Bye] if len(names) % 2 else [*names]
    turning = len(slots) - 1
    cycle = [_circle_round(slots, turning, r) for r in range(turning)]
    if rounds is None:
        rounds = turning
    schedule = []
    for index in range(rounds):
        done, r = divmod(index, turning)
        schedule.append(cycle[r] if done % 2 == 0 else [_swapped(p) for p in cycle[r]])
    return schedule


def _circle_round(slots: Sequence[str | None], turning: int, r: int) -> list[Pairing]:
    """Round `r` of the circle: seats alternate for the fixed slot from round to round, and
    for slot r + i with i; this leaves every player's seats balanced over a cycle."""
    fixed, other = slots[turning], slots[r]
    assert other is not None  # only the fixed slot can be the bye
    games = []
    for i in range(1, turning // 2 + 1):
        up, down = slots[(r + i) % turning], slots[(r - i) % turning]
        assert up is not None and down is not None
        games.append(Pairing(up, down) if i % 2 else Pairing(down, up))
    if fixed is None:
        return [*games, Pairing(other, Bye)]
    return [Pairing(fixed, other) if r % 2 == 0 else Pairing(other, fixed), *games]


def _swapped(pairing: Pairing) -> Pairing:
    if pairing.second is None:
        return pairing
    return Pairing(pairing.second, pairing.first)


def gauntlet(challenger: str, field: Sequence[str], rounds: int = 1) -> list[list[Pairing]]:
    """`rounds` rounds in which `challenger` meets every field player once, in field order.

    The challenger has seat 1 against the i-th field player of round r when i + r is even.
    """
    opponents = list(field)
    _check_unique([challenger, *opponents])
    if not opponents:
        raise ValueError("a gauntlet needs a field")
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds}")
    return [
        [
            Pairing(challenger, opponent) if (i + r) % 2 == 0 else Pairing(opponent, challenger)
            for i, opponent in enumerate(opponents)
        ]
        for r in range(rounds)
    ]


# -- Swiss ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SwissPlayer:
    """A Swiss player's record before a round."""

    name: str
    #: Points so far: 1 a win (or a bye), 0.5 a draw.
    score: float
    #: Every opponent met so far, byes excluded.
    opponents: tuple[str, ...]
    #: The seat of each encounter played, in order: 1 as `first`, 2 as `second`.
    colours: tuple[int, ...]
    #: Byes received so far.
    byes: int


def _colour_difference(player: SwissPlayer) -> int:
    return sum(1 if colour == 1 else -1 for colour in player.colours)


def _broken_rules(player: SwissPlayer, colour: int) -> tuple[str, ...]:
    """The colour rules `player` breaks by taking seat `colour` next, as relaxation names."""
    broken = []
    step = 1 if colour == 1 else -1
    if abs(_colour_difference(player) + step) > MAX_COLOUR_DIFFERENCE:
        broken.append(f"{RELAX_COLOUR_DIFFERENCE}:{player.name}")
    if player.colours[-2:] == (colour, colour):
        broken.append(f"{RELAX_COLOUR_STREAK}:{player.name}")
    return tuple(broken)


def _rather_first(a: SwissPlayer, b: SwissPlayer) -> bool:
    """Whether the seat rule gives `a` seat 1 against `b`, colour rules aside."""
    difference_a, difference_b = _colour_difference(a), _colour_difference(b)
    if difference_a != difference_b:
        return difference_a < difference_b
    for colour_a, colour_b in zip(reversed(a.colours), reversed(b.colours), strict=False):
        if colour_a != colour_b:
            return colour_a == 2
    return a.name < b.name


def _seat(a: SwissPlayer, b: SwissPlayer) -> Pairing:
    """`a` and `b` seated: the fewest colour rules broken, then by the seat rule."""
    a_first = _broken_rules(a, 1) + _broken_rules(b, 2)
    b_first = _broken_rules(b, 1) + _broken_rules(a, 2)
    if len(a_first) < len(b_first) or (len(a_first) == len(b_first) and _rather_first(a, b)):
        return Pairing(a.name, b.name, a_first)
    return Pairing(b.name, a.name, b_first)


def _preferred_colour(player: SwissPlayer) -> int | None:
    """The seat that evens the colour difference or, when even, alternates; None at first."""
    difference = _colour_difference(player)
    if difference:
        return 2 if difference > 0 else 1
    return 3 - player.colours[-1] if player.colours else None


def _half_points(player: SwissPlayer) -> int:
    return round(player.score * 2)


def _check_players(players: Sequence[SwissPlayer]) -> None:
    _check_unique([player.name for player in players])
    for player in players:
        if player.score < 0 or not float(player.score * 2).is_integer():
            raise ValueError(f"{player.name}: score must be a multiple of 0.5, got {player.score}")
        if any(colour not in (1, 2) for colour in player.colours):
            raise ValueError(f"{player.name}: colours must be 1 or 2, got {player.colours}")
        if player.byes < 0:
            raise ValueError(f"{player.name}: byes must be >= 0, got {player.byes}")


def _ranked(players: Sequence[SwissPlayer]) -> list[SwissPlayer]:
    """Best first: by score, then by name."""
    return sorted(players, key=lambda player: (-player.score, player.name))


class _Costs:
    """The integer costs of one round's pairings, weighted so that each criterion of the module
    docstring outranks the sum of all later ones over any round of this field."""

    def __init__(self, players: Sequence[SwissPlayer]) -> None:
        self.ranked = _ranked(players)
        self.rank = {player.name: index for index, player in enumerate(self.ranked)}
        n = len(self.ranked)
        encounters = (n + 1) // 2
        half_points = [_half_points(player) for player in self.ranked] or [0]
        widest = max(half_points) - min(half_points)
        self.score_unit = encounters + 1  # > the number of colour-preference clashes
        self.bye_unit = self.score_unit * (encounters * widest**2 + 1)
        self.rule_unit = self.bye_unit * max(n, 1)

    def pair(self, a: SwissPlayer, b: SwissPlayer) -> int:
        broken = len(_seat(a, b).relaxed)
        gap = _half_points(a) - _half_points(b)
        preferred = _preferred_colour(a)
        clash = int(preferred is not None and preferred == _preferred_colour(b))
        return broken * self.rule_unit + gap**2 * self.score_unit + clash

    def bye(self, player: SwissPlayer) -> int:
        return (len(self.ranked) - 1 - self.rank[player.name]) * self.bye_unit


def pairing_cost(a: SwissPlayer, b: SwissPlayer, field: Sequence[SwissPlayer]) -> int:
    """What pairing `a` with `b` adds to the cost of a round of `field` (which holds both).

    The number of colour rules the pair breaks (seated as `swiss_round` seats it), the square
    of their score difference in half points, and 1 if both would rather have the same seat,
    each weighted by `field`. Whether they have met is not a cost: they may not meet again.
    """
    return _Costs(field).pair(a, b)


def bye_cost(player: SwissPlayer, field: Sequence[SwissPlayer]) -> int:
    """What a bye for `player` adds to the cost of a round of `field`: more the higher it
    ranks. Whether `player` may have a bye is not a cost: a second bye is never given."""
    return _Costs(field).bye(player)


def _have_met(a: SwissPlayer, b: SwissPlayer) -> bool:
    return b.name in a.opponents or a.name in b.opponents


def swiss_round(players: Sequence[SwissPlayer]) -> list[Pairing] | None:
    """The next round for `players`, top board first and the bye last; None when no round
    without a rematch or a second bye exists (the tournament is over).

    The colour rules are hard at first and relaxed only if no round keeps them all.
    """
    _check_players(players)
    if not players:
        return []
    costs = _Costs(players)
    paired = _match(costs, relax=False)
    return paired if paired is not None else _match(costs, relax=True)


def _match(costs: _Costs, *, relax: bool) -> list[Pairing] | None:
    """The minimum-cost round, the colour rules hard unless `relax`; None if there is none.

    Nodes are ranks, plus one more for the bye when the count is odd; they are added in rank
    order so the blossom algorithm breaks ties between equal costs the same way every time.
    """
    ranked = costs.ranked
    n = len(ranked)
    bye_node = n if n % 2 else None
    graph = nx.Graph()
    graph.add_nodes_from(range(n + n % 2))
    edges: list[tuple[int, int, int]] = []
    for i, a in enumerate(ranked):
        for j in range(i + 1, n):
            b = ranked[j]
            if _have_met(a, b) or (not relax and _seat(a, b).relaxed):
                continue
            edges.append((i, j, costs.pair(a, b)))
        if bye_node is not None and a.byes == 0:
            edges.append((i, bye_node, costs.bye(a)))
    if not edges:
        return None
    # The blossom algorithm maximises weight: with every weight top - cost > 0 and maximum
    # cardinality first, the heaviest perfect matching is the cheapest.
    top = max(cost for _, _, cost in edges) + 1
    graph.add_weighted_edges_from((i, j, top - cost) for i, j, cost in edges)
    matching: set[tuple[int, int]] = nx.max_weight_matching(graph, maxcardinality=True)
    if 2 * len(matching) != graph.number_of_nodes():
        return None
    boards: list[tuple[int, Pairing]] = []
    bye: Pairing | None = None
    for u, v in matching:
        i, j = min(u, v), max(u, v)
        if j == bye_node:
            bye = Pairing(ranked[i].name, Bye)
        else:
            boards.append((i, _seat(ranked[i], ranked[j])))
    # Top board first: ranks are by score, so the better-ranked partner's rank orders boards.
    return [pairing for _, pairing in sorted(boards)] + ([bye] if bye is not None else [])
