# The two commands of the README:
#   make run    sets up and runs the main job
#   make test   sets up and runs the whole test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
# torch first and pinned: on this kind of machine 2.13.0 is the CPU wheel on disk; a looser
# request could pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: setup run test test-fast lint typecheck format protos bench mutants

setup: $(VENV)/.installed

# One line per step; pip says nothing but errors.
PIP_INSTALL := $(PY) -m pip install -q -q --disable-pip-version-check

$(VENV)/.installed: pyproject.toml
	@echo "setup: creating $(VENV)"
	@python3 -m venv $(VENV)
	@echo "setup: upgrading pip"
	@$(PIP_INSTALL) --upgrade pip
	@echo "setup: installing $(TORCH)"
	@$(PIP_INSTALL) "$(TORCH)"
	@echo "setup: installing apexrl with its extras (local, continuous, atari, envpool, test, bench)"
	@$(PIP_INSTALL) -e ".[local,continuous,atari,envpool,test,bench]"
	@touch $@

run: setup
	$(VENV)/bin/apexrl local

# --durations: the slowest tests close the log, so CI time (kept under 40 minutes) has its names.
test: setup lint
	$(PY) protos/generate.py --check
	$(PY) deploy/grafana/dashboard.py --check
	$(PY) -m pytest -q --durations=25

# The fast loop: unit and integration tests without the slow end-to-end ones.
test-fast: setup
	$(PY) -m pytest -q -m "not slow" -x

lint: setup typecheck
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy over services/, imported as the package apexrl (settings in pyproject.toml).
typecheck: setup
	@mkdir -p build/typecheck && ln -sfn ../../services build/typecheck/apexrl
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

protos: setup
	$(PY) protos/generate.py

bench: setup
	$(PY) benchmarks/replay_throughput.py

# Mutation testing of the losses, adders, samplers, rate limiters and the learner's priority
# write-back (docs/testing.md): a score, not a gate, and not part of `make test`. About an hour
# on 2 cores; MUTANTS="samplers adders" runs some groups only.
MUTANTS ?=
mutants: setup
	$(PY) -m pip install -q "mutmut>=3,<4"
	$(PY) benchmarks/mutants.py $(MUTANTS)
