"""The projector: read models folded from the game logs.

The fold of a game's events is the game log's (`services.gamelog.fold`); `models`
declares every read model (its keys and one game's cells) and `write` their guarded write;
`live` keeps them up to date from the feeds; `rebuild` recomputes them from the logs (safe
while play goes on); `verify` checks every log and compares the read models with what the
logs imply. Of the services, only the CLI and the archive import it
(`tests/services/test_layers.py`).
"""

from services.projector.live import Projector
from services.projector.models import READ_MODELS
from services.projector.rebuild import RebuildStats, rebuild
from services.projector.verify import VerifyReport, compare_read_models, snapshot, verify

__all__ = [
    "READ_MODELS",
    "Projector",
    "RebuildStats",
    "VerifyReport",
    "compare_read_models",
    "rebuild",
    "snapshot",
    "verify",
]
