"""The CLI's room: everything a user types as `agon ...`, apart from the services it runs.

`main` (pyproject's `agon = "services.cli:main"`) and the subcommand table live in `main`;
each subcommand is a module here (`up`, `services`, `selfplay`, `admin`, `archive`,
`replay`, `export`, `tournament`, `stats`, `status`, `acl`, `schemas`, `play`,
`conformance`, `bots`), imported only when it is the one chosen. What they share is in
`common` (`with_redis`, signals, logging, the shared arguments) and `options` (argument
types, `UsageError`); `pipeline` runs every service in one process (`ServiceSet`) and is
selfplay as a library, for the tests and benchmarks too. No service imports this package
(`tests/services/test_layers.py`): the services know nothing of how they are started.
"""

from services.cli.main import SUBCOMMANDS, build_parser, main

__all__ = ["SUBCOMMANDS", "build_parser", "main"]
