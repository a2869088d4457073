"""The engine against Ludii: every recorded trial and Pattern/Line verdict in shared/conformance.

Each file is replayed by the same runner as `agon conformance`; a failure shows the
first mismatch (position, move, set difference). The data lives beside the
checkout, not in the project, so these tests skip when it is absent.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine import Move
from engine.boards import load_board
from services.cli.conformance import check_file, translate

SHARED = Path(__file__).resolve().parents[3] / "shared" / "conformance"
FILES = sorted(SHARED.glob("trials/*.jsonl")) + sorted(SHARED.glob("patterns/*.jsonl"))
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/conformance (outside the project) is not present"
)


@needs_shared
@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_file_agrees_with_ludii(path: Path) -> None:
    result = check_file(path)
    assert result.passed > 0
    assert result.failed == 0, result.first_mismatch


@needs_shared
def test_runner_reports_and_exits_1_on_a_mismatch(tmp_path: Path) -> None:
    trial = (SHARED / "trials" / "teeko.jsonl").read_text().splitlines()[0]
    broken = tmp_path / "broken.jsonl"
    # The first recorded move of that trial is on site 23; claim Ludii put it on 24.
    broken.write_text(
        trial.replace(
            '"board_after":".......................1."',
            '"board_after":"........................1"',
            1,
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "services.cli", "conformance", str(broken)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "first mismatch" in proc.stdout and "ply 0" in proc.stdout
    assert proc.stdout.splitlines()[-1].endswith(", 1 failed")


def test_ludii_move_texts_translate_to_agon_notation() -> None:
    square = load_board("square-5")
    assert translate(square, "Add@0") == "A1"
    assert translate(square, "Move H0->6") == "B2"
    assert translate(square, "Move 6->12") == "B2-C3"
    assert translate(square, "Remove@24") == "xE5"
    assert translate(square, "Select 7->7") == "xC2"
    assert translate(square, "Select 6->1") == "B2>S"
    assert translate(square, "Select 6->12") == "B2>NE"
    assert translate(square, "Pass") == "pass"
    assert translate(load_board("hex-8"), "Swap") == "swap"
    for text in ("B2>S", "xC2", "B2-C3"):
        assert str(Move.parse(text)) == text
    with pytest.raises(ValueError, match="unknown Ludii move"):
        translate(square, "Jump 1->2")
