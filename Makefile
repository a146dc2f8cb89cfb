# rllava: `make test` (fast suite), `make test-slow` (learning checks), `make demo` (SFT -> GRPO on CPU),
# `make proof` (GRPO lifts each of the six example tasks on CPU; outputs/proof/results.md + curves).
# Each target creates .venv and installs on first use. torch is pinned to 2.13.0: the CPU wheel on these
# machines (any other pin pulls GBs of CUDA). GPU machines install the extras they need instead.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install test test-slow demo proof size clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

demo: $(STAMP)
	$(PY) -m rllava.commands.demo --out outputs/demo

proof: $(STAMP)
	$(PY) -m rllava.commands.proof --out outputs/proof

size:  # the budgets of README.md's "Size": library <= 15,000 lines, commands <= 2,500
	@echo "library  $$(find rllava -name '*.py' -not -path 'rllava/commands/*' | xargs cat | wc -l) lines (budget 15000)"
	@echo "commands $$(find rllava/commands -name '*.py' | xargs cat | wc -l) lines (budget 2500)"

clean:
	rm -rf outputs .pytest_cache
