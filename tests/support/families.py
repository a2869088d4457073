"""Option families: every registered game at its defaults and with each other option value.

Shared by the golden playthroughs and the random-simulation invariants, so a new
game or option value is covered by both the moment it is registered.
"""

from __future__ import annotations

from engine import game_names, load_game


def option_families() -> list[tuple[str, dict[str, str]]]:
    """(game, options) for the defaults and for each non-default value of each option."""
    families: list[tuple[str, dict[str, str]]] = []
    for name in game_names():
        families.append((name, {}))
        for option, values in load_game(name).OPTIONS.items():
            families.extend((name, {option: value}) for value in values[1:])
    return families


def family_id(name: str, options: dict[str, str]) -> str:
    return "_".join([name, *(f"{k}-{v}" for k, v in sorted(options.items()))])
