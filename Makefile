# Every command the README and CI use. `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
ORCH   := $(VENV)/bin/orch

.PHONY: setup compile demo test unit integration lint test-deps bench bench-deps bench-scale clean

## setup: create .venv with orch, torch (CPU) and the test tools
setup: $(VENV)/.installed

# pip compiles the installed modules' bytecode on one core; compileall on every core does
# it in a quarter less of the whole install (38 s -> 29 s, two cores). Some files of
# torch's tests are Python 3.12 and do not compile here: pip skips them as well.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[torch,dev]'
	$(PY) -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

## compile: the package's bytecode, as a wheel install leaves it. An editable install
## writes none where PYTHONDONTWRITEBYTECODE is set (CI, containers), and every orch
## command then compiles the whole package again: about 0.5 s a command on 2 cores.
compile: setup
	$(PY) -m compileall -q orchestrator

## demo: run the example DDP job on two local nodes (no SSH)
demo: compile
	$(ORCH) submit jobs/digits.yaml -i inventory/local.yaml

## test-deps: what the cluster tests need (Debian's openssh-server, iproute2 and iptables,
## which blocks a port between two test hosts; slurm and munge for the Slurm cluster;
## chromium, which orch ui's browser tests drive), when root
test-deps:
	@if [ "$$(id -u)" = 0 ]; then sh tests/install_deps.sh; fi

## test: unit and integration tests (the integration tests start real sshd hosts),
## TEST_WORKERS at once: each worker boots its own test cluster on a network of its own.
## Five on two cores: with four, the cores were idle 16% of the run while three workers
## waited in sleeping tests (a Slurm time limit, lost hosts); with five, 7% (425 s
## against 433 to 465 s, CONTRIBUTING.md, "What a fresh machine pays")
TEST_WORKERS ?= 5
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup
test: compile test-deps
	$(PYTEST) tests

unit: compile test-deps
	$(PYTEST) tests/unit

integration: compile test-deps
	$(PYTEST) tests/integration

## lint: ruff (lint and format) on the package, tests and bench; mypy --strict on the package
lint: setup
	$(VENV)/bin/ruff check orchestrator tests bench
	$(VENV)/bin/ruff format --check orchestrator tests bench
	$(VENV)/bin/mypy orchestrator

## bench: the benchmarks of docs/BENCHMARKS.md (root: they start test hosts)
bench: compile test-deps
	$(PY) bench/launch.py
	$(PY) bench/logs.py
	$(PY) bench/failure.py
	$(PY) bench/preflight.py
	$(PY) bench/agent_start.py
	@command -v rsync >/dev/null || { echo "installing rsync (the baseline of bench/sync.py)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync >/dev/null; }
	$(PY) bench/sync.py
	$(PY) bench/sync.py --shared 8
	$(PY) bench/sync.py --uplink 100 --hosts 4 8
	$(PY) bench/snapshot.py
	$(PY) bench/restart.py
	$(PY) bench/waiting_line.py
	$(PY) bench/top.py
	$(PY) bench/slurm.py
	$(PY) bench/ui.py
	$(PY) bench/warm.py
	$(PY) bench/rank_end.py
	$(MAKE) bench-deps
	$(PY) bench/warm.py --hosts 8 --transformers

## bench-deps: what only the benchmarks need (transformers, for bench/warm.py --transformers;
## Debian's rsync, the code push's and orch pull's baseline in bench/sync.py and bench/restart.py)
bench-deps: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[bench]'
	@if [ "$$(id -u)" = 0 ] && ! command -v rsync >/dev/null; then \
		echo "installing rsync (the benchmarks' baseline)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rsync >/dev/null; \
	fi

## bench-scale: the 16- and 32-host runs (tens of minutes on 2 cores)
bench-scale: compile test-deps
	$(PY) bench/launch.py --hosts 32 --repeat 1
	$(PY) bench/failure.py --hosts 16 32 --cap 60
	$(PY) bench/logs.py --hosts 16 32 --lines 25000 --repeat 1 --idle 10
	$(PY) bench/controller.py --hosts 16 32

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
