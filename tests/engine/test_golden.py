"""Replays every golden playthrough and fails when a game or option family has none."""

from __future__ import annotations

import difflib

import pytest

from tests.support.families import family_id, option_families
from tests.support.golden import GOLDEN_DIR, golden_path, transcript

FAMILIES = option_families()


@pytest.mark.parametrize(("name", "options"), FAMILIES, ids=[family_id(*f) for f in FAMILIES])
def test_playthrough_matches_golden(name: str, options: dict[str, str]) -> None:
    path = golden_path(name, options)
    assert path.is_file(), f"no golden playthrough for {path.stem}: run `make golden`"
    expected = path.read_text()
    actual = transcript(name, options)
    if actual != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), actual.splitlines(), "golden", "engine", n=2, lineterm=""
        )
        pytest.fail(f"{path.name} differs:\n" + "\n".join(list(diff)[:60]))


def test_every_golden_file_belongs_to_a_family() -> None:
    known = {golden_path(*f).name for f in FAMILIES}
    stale = sorted(p.name for p in GOLDEN_DIR.glob("*.txt") if p.name not in known)
    assert not stale, f"golden files for no registered family: {stale}"
