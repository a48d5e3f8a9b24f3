# `make run` and `make test` need nothing but python3 (3.11+): they build the virtualenv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-matrix lint docs format bench chaos scale upgrade failover pressure pressure-short schema clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev,embedded,docs]'
	touch $(STAMP)

## Run the example application end to end (embedded PostgreSQL unless PGWORKER_DSN is set).
run: $(STAMP)
	$(PY) examples/demo.py

## Run the whole test suite (PGWORKER_TEST_DSN, else Docker, else a throwaway local cluster), in
## TEST_WORKERS processes (pytest-xdist; each has its own template and databases). Measured on 2
## cores, idle, 1,551 tests: 3 processes ran it in 8.9 min, 2 in 10.9 (many tests wait on a lease
## or a subprocess: a third process fills that time). Under CI the 30 slowest tests are listed.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(if $(CI),--durations=30)

## The suite's core on every PostgreSQL major installable here (servers installed into .matrix/).
test-matrix: $(STAMP)
	$(PY) -m tests.matrix

## Measure pgworker against its peers (its own virtualenv in bench/.venv); prints the table.
bench:
	bash bench/run.sh

## The long soak: 50,000 jobs or more, 4 workers, at least 24 steps of random SIGKILLs, backend
## terminations and cancels, two server crashes.
chaos: $(STAMP)
	$(PY) -m tests.soak

## Hosts and cuts (root): 4 worker hosts in network namespaces on a private bridge; throughput with
## 1, 2 and 4 hosts, then one host cut off twice (link down, packets dropped); prints the figures.
scale: $(STAMP)
	$(PY) -m tests.scale

## A rolling deploy (tests/upgrade.py): the release UPGRADE_FROM, a commit (or tag) of this
## repository's history (the release the fleet runs: the last one that landed), `git archive`d
## into a throwaway virtualenv; its workers serve while this tree's `pgworker migrate` runs, a
## worker of this tree starts beside them, one old worker gets SIGTERM and one SIGKILL. Every
## acknowledged enqueue completes once, every rerun is explained, the old workers work on after
## the migration. In a database of its own on PGWORKER_DSN; under 2 minutes.
UPGRADE_FROM ?= f0523a3
upgrade: $(STAMP)
	$(PY) -m tests.upgrade --from $(UPGRADE_FROM)

## A real failover (pg_auto_failover: a monitor, a primary and its synchronous standby on
## 127.0.0.1): two workers and an enqueuer on a multi-host DSN, the primary's node killed mid-run;
## every acknowledged enqueue completes once on the new primary, every rerun is explained, the
## workers serve on; prints the time from the kill to the first completion. About a minute.
failover: $(STAMP)
	$(PY) -m tests.failover

## Pressure (bench/pressure/): one worker (32 slots, 1 ms handlers) offered 800 jobs/s through a
## clean minute, 15 minutes beside a transaction holding an xid, 15 minutes beside four REPEATABLE
## READ readers, then 1.5 x the sustainable rate (searched first) and recoveries, in a database of
## its own; a table per phase, the held phases' last minute against the clean one, the claim's
## EXPLAIN, and the samples in bench/results/pressure.json. ARGS adds options (e.g. --rate max).
## pressure-short: the reduced form, under 3 minutes, that CI runs: it fails only when the clean
## phase does not keep up with the offered rate.
pressure: $(STAMP)
	$(PY) -m bench.pressure $(ARGS)

pressure-short: $(STAMP)
	$(PY) -m bench.pressure --short $(ARGS)

## sql/schema.sql again: the schema the migrations make, dumped from a scratch database of
## PGWORKER_TEST_DSN's server by its major's pg_dump (tests/schema_dump.py).
schema: $(STAMP)
	$(PY) -m tests.schema_dump > sql/schema.sql.new
	mv sql/schema.sql.new sql/schema.sql

lint: $(STAMP)
	$(VENV)/bin/ruff check pgworker tests examples bench docs/hooks.py
	$(VENV)/bin/ruff format --check pgworker tests examples bench docs/hooks.py
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

## The documentation site (docs/, mkdocs.yml) into site/; a broken link or anchor fails it (not --quiet:
## that drops the warnings --strict counts).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

format: $(STAMP)
	$(VENV)/bin/ruff format pgworker tests examples bench docs/hooks.py
	$(VENV)/bin/ruff check --fix pgworker tests examples bench docs/hooks.py

clean:
	rm -rf $(VENV) .pgdata .pytest_cache .ruff_cache site .matrix
