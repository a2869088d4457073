"""`python -m services.cli`: what the `agon` script runs (the tests and the benchmarks start
services this way, with the interpreter of the checkout's virtual environment)."""

import sys

from services.cli.main import main

sys.exit(main())
