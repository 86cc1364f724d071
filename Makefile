# The README's two commands are the contract: `make run` and `make test` on a fresh Debian with Python 3.11.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test run bench soak faults lint schemas samples dist clean

install: $(STAMP)
	@bash deploy/install-debian.sh

$(STAMP): pyproject.toml setup.py $(wildcard schemas/_*.[ch] schemas/*/_*.c schemas/*/*/_*.c)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# then the codec and sink tests again on the pure-Python path (the compiled extensions are optional: issue 24)
test: install
	$(BIN)/python -m pytest -q
	HPCBUS_PURE=1 $(BIN)/python -m pytest -q -m both_paths

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

run: install
	$(BIN)/hpcbus run $(RUN_ARGS)

bench: install
	$(BIN)/python -m bench

# issue 31's "a year in an hour": SOAK_JOBS distinct jobs of a 2,000-node site through NATS, `consume influx`,
# `consume jobs` and InfluxDB, then the table of refused points, stuck summaries, series, memory and query
# times (bench/soak.py; `make bench` does not run it). `make soak SOAK_JOBS=2000` takes about a minute.
SOAK_JOBS ?= 1000000
soak: install
	$(BIN)/python -m bench.soak $(SOAK_JOBS)

# the fault suite alone (issue 13: cluster leader killed, InfluxDB down, worker killed, partition, hostile
# input); `make test` runs it too
faults: install
	$(BIN)/python -m pytest -q tests/faults

schemas: install
	$(BIN)/python -m hpcbus.commands.dev.schemas

# deploy/*.toml and the settings part of producers/*/README.md, consumers/*/README.md, from the settings structs
samples: $(STAMP)
	$(BIN)/python -m hpcbus.commands.dev.samples

# the hpcbus wheel and a wheelhouse of every runtime dependency, for hosts without a package index
# (docs/deploy.md); for another target: make dist PYVER=3.11 PLATFORM=manylinux2014_x86_64
DIST ?= dist
dist: $(STAMP)
	@bash deploy/dist.sh --out $(DIST) $(if $(PYVER),--python-version $(PYVER)) $(if $(PLATFORM),--platform $(PLATFORM))

clean:
	rm -rf $(VENV) var dist .pytest_cache .mypy_cache .ruff_cache
