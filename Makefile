# Tessera: the two commands a new machine needs are `make demo` and `make test`.
# Both create .venv when it is missing and (re)install when pyproject.toml changes.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SEEDS  ?= 200
SEED0  ?= 0
FUZZ_CASES ?= 2000
FUZZ_SEED  ?= 1
FUZZ_ARGS  ?=

export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export PYSPARK_DRIVER_PYTHON := $(abspath $(BIN)/python)

.PHONY: venv demo raft-demo test test-unit test-integration test-spark test-slow lint typecheck unit protos check-protos sim fuzz bench-raft bench-tserver bench-master bench-scale bench-spark-read bench-jobs bench-txn bench-overload chaos clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	@touch $(STAMP)

## The main job: a local cluster, a partitioned table, client and Spark reads and writes, ksck,
## the reconciliation jobs and a Delta audit snapshot (spark_jobs/demo.py).
demo: venv
	$(BIN)/python -m spark_jobs.demo

## The replicated-log demo of the consensus layer (3 processes, a leader killed under load).
raft-demo: venv
	$(BIN)/python -m service.tools.kv_demo

## Lint, type checks, then the three default test tiers. CI runs this.
test: venv lint typecheck test-unit test-integration test-spark

## Pure logic and in-process servers: no cluster of processes, no JVM (a few minutes).
test-unit: venv
	$(BIN)/python -m pytest -q -m "not integration and not spark and not slow"

## Real processes on loopback: clusters, the fuzz and chaos smoke runs.
test-integration: venv
	$(BIN)/python -m pytest -q -m "integration and not spark and not slow"

## The Spark suite: one local SparkSession for the whole run, real clusters beside it.
test-spark: venv
	$(BIN)/python -m pytest -q -m "spark and not slow"

## ruff, then the layer contract (docs/design/layers.md): a wrong-way import fails here.
lint: venv
	$(BIN)/ruff check service spark_jobs tests bench protos
	$(BIN)/ruff format --check service spark_jobs tests bench protos
	$(BIN)/lint-imports

typecheck: venv
	$(BIN)/mypy

## The slow suites (many simulator seeds, long integration runs).
test-slow: venv
	$(BIN)/python -m pytest -q -m slow

## Deterministic simulation: make sim SEEDS=10000 [SEED0=0]
sim: venv
	$(BIN)/python -m service.testing.sim_cli --seeds $(SEEDS) --first $(SEED0)

## Fuzzing campaign against a live mini cluster: make fuzz FUZZ_CASES=N FUZZ_SEED=S
## [FUZZ_ARGS=--skip-known]; ends with `fuzz: N cases, C crashes, S state changes, L stalls`
fuzz: venv
	$(BIN)/python -m service.testing.fuzz --cases $(FUZZ_CASES) --seed $(FUZZ_SEED) $(FUZZ_ARGS)

protos: venv
	$(BIN)/python protos/generate.py

check-protos: venv
	$(BIN)/python protos/generate.py --check

bench-raft: venv
	$(BIN)/python -m bench.raft_commit
	$(BIN)/python -m bench.raft_failover

bench-tserver: venv
	$(BIN)/python -m bench.tserver_storage
	$(BIN)/python -m bench.tserver_bench

bench-master: venv
	$(BIN)/python -m bench.master_bench

## Catalog scale: 3 secured masters and 1,000 simulated servers grow a 200,000-tablet catalog,
## then 3 leader kills; ends with `scale: T tablets, E unprovoked elections, ...`.
## SCALE_ARGS=--quick for a small run.
SCALE_ARGS ?=
bench-scale: venv
	$(BIN)/python -m bench.scale_bench $(SCALE_ARGS)

## Spark reads: the tessera source against a Python Parquet source and Spark's Parquet reader.
bench-spark-read: venv
	$(BIN)/python -m bench.spark_read

## The reconciliation jobs over a synthetic catalog of 100,000 tablets and 1,000 tablet servers.
bench-jobs: venv
	$(BIN)/python -m bench.jobs_bench

## Creation on a busy host: 3 masters, 3 tablet servers and a busy loop per core; a 1,000-tablet
## create, then another with every master killed 0.6 s in (docs/design/catalog.md#R16).
bench-overload: venv
	$(BIN)/python -m bench.overload_bench $(OVERLOAD_ARGS)

bench-txn: venv
	$(BIN)/python -m bench.txn_bench

## Fault campaign on real processes (root: network namespaces), every nemesis x workload:
## make chaos CHAOS_SECONDS=1800 CHAOS_SEED=1 [NEMESES=kill,pause] [WORKLOADS=register,rows]
CHAOS_SECONDS ?= 600
CHAOS_SEED    ?= 1
NEMESES       ?= kill,pause,partition,clock,disk
WORKLOADS     ?= register,ddl,catalog_reads,rows,snapshot,bank
CHAOS_OUT     ?= chaos-out
chaos: venv
	$(BIN)/python -m service.testing.chaos --seconds $(CHAOS_SECONDS) --seed $(CHAOS_SEED) \
		--nemeses $(NEMESES) --workloads $(WORKLOADS) --out $(CHAOS_OUT)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
