"""benchmarks/: the rllava runs they launch are valid configs, and their reports read the runs right (fast; the
benchmarks themselves are run by hand, docs/performance.md)."""

import json
import math
import os
import sys

from rllava.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import learning_vs_trl  # noqa: E402
import memory_plans  # noqa: E402
import vllm_cpu  # noqa: E402
import vs_trl  # noqa: E402


def _config(cmd: list[str]):
    module = cmd.index("-m")
    return load_config(cmd[module + 2:])  # after `python -m rllava.train.pipeline.rlvr`


def test_benchmark_runs_are_valid_configs(monkeypatch):
    monkeypatch.chdir(REPO)  # the configs' relative paths
    cfg = _config(vs_trl.rllava_command("MODEL", "DATA", "RUN", 6, ["actor.model.shared_prefix=false"]))
    assert (cfg.rollout.n, cfg.data.train_batch_size, cfg.data.max_response_length) == (vs_trl.K, vs_trl.PROMPTS,
                                                                                       vs_trl.NEW_TOKENS)
    assert cfg.actor.optim.lr == vs_trl.LR and cfg.actor.model.shared_prefix is False
    common = ["data.train_files=D/train.jsonl", "data.val_files=D/val.jsonl"]
    cfg = load_config(learning_vs_trl.rl_keys(common) + ["actor.model.model_path=M", "trainer.val_only=true"])
    assert cfg.actor.optim.lr == learning_vs_trl.LR and cfg.actor.optim.lr_scheduler_type == "constant"


def test_vs_trl_summary_drops_the_first_step_and_counts_completions():
    rows = [{"seconds": 9.0, "length": 16}] + [{"seconds": 0.5, "length": 16, "rollout": 0.2, "update": 0.3}] * 4
    out = vs_trl.summarize(rows)
    assert out["step_s"] == 0.5 and out["completions_per_s"] == vs_trl.K * vs_trl.PROMPTS / 0.5
    assert out["tokens_per_s"] == 16 * vs_trl.K * vs_trl.PROMPTS / 0.5 and out["update"] == 0.3


def test_learning_report_names_when_rllava_reaches_trl():
    at = lambda sampled: {"sampled": sampled, "greedy": sampled}  # noqa: E731
    results = {"budget": 90, "steps": {"trl": 30, "rllava": 150},
               "curves": {"trl": [(0, at(0.2)), (30, at(0.3)), (60, at(0.4)), (90, at(0.35))],
                          "rllava": [(0, at(0.2)), (30, at(0.36)), (60, at(0.45)), (90, at(0.5))]}}
    text = learning_vs_trl.report(results)
    assert "TRL's final sampled accuracy 35.0 % (at 90 s): rllava first reaches it at 30 s = 0.33" in text
    assert "TRL's best sampled accuracy 40.0 % (at 60 s): rllava first reaches it at 60 s = 0.67" in text
    assert "trivially" not in text
    results["curves"]["trl"][-1] = (90, at(0.1))
    assert "met trivially" in learning_vs_trl.report(results)


def test_memory_plans_reads_the_command_line_a_seed_script_launches(monkeypatch):
    monkeypatch.chdir(REPO)
    args, world = memory_plans.pipeline_args(os.path.join(REPO, "examples/tasks/grounding/"
                                                              "qwen2_vl_2b_grounding_vllm_online.sh"))
    cfg = load_config(args)
    assert cfg.actor.model.model_path == "Qwen/Qwen2-VL-2B-Instruct" and cfg.rollout.name == "vllm"
    assert world == 2  # torchrun --nproc_per_node=${NPROC:-2}


def test_async_benchmark_phases_and_the_8_gpu_estimate():
    import importlib

    bench = importlib.import_module("async")  # benchmarks/async.py (a keyword: imported by name)
    rows = [{"step": 1, "timing/step": 9.0, "timing/rollout": 8.0}] + \
        [{"step": s, "timing/step": 1.0, "timing/rollout": 0.5, "timing/reward": 0.1} for s in (2, 3)]
    assert bench.phases(rows) == {"step": 1.0, "rollout": 0.5, "reward": 0.1, "steps": 2}
    # sync, 2 threads: rollout 0.6 + learning 0.4; async, 1 thread each: rollout 0.9, learning 0.6 + 0.1 publishing
    e = bench.estimate({"step": 1.0, "rollout": 0.5, "reward": 0.1},
                       {"step": 1.0, "rollout": 0.8, "reward": 0.1, "wait_rollout": 0.3, "publish_weights": 0.1})
    assert (e["R_1"], e["R_2"], e["W"]) == (0.9, 0.6, 0.1) and abs(e["T_1"] - 0.6) < 1e-12
    assert abs(e["a"] - math.log2(1.5)) < 1e-12 and abs(e["b"] - math.log2(1.5)) < 1e-12
    # each phase on twice the workers takes 2/3 of its time: sync_8 = 0.6 + 0.4; async = max(0.9, 0.6 + 0.1)
    assert abs(e["sync_8"] - 1.0) < 1e-12 and e["async_4+4"] == 0.9 and abs(e["gain"] - 1.0 / 0.9) < 1e-12
    assert abs(e["gain_linear"] - 1.5 / 2 / 0.9) < 1e-12


def test_vllm_cpu_runs_are_valid_configs_and_the_report_names_the_faster_engine(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    for engine in ("hf", "vllm"):
        cfg = _config(vllm_cpu.pipeline_command(engine, "MODEL", "DATA", "RUN", 4))
        assert cfg.rollout.name == engine and (cfg.rollout.n, cfg.data.train_batch_size) == (vllm_cpu.K,
                                                                                             vllm_cpu.PROMPTS)
    assert cfg.rollout.vllm.dtype == "float32"
    hf = _config(vllm_cpu.pipeline_command("hf", "MODEL", "DATA", "RUN", 4))
    assert hf.rollout.micro_batch_size == vllm_cpu.PROMPTS  # HF's generate: all B sequences in one call
    rows = [{"step": 1, "timing/step": 9.0, "timing/rollout": 8.0}] + \
        [{"step": s, "timing/step": 2.0, "timing/rollout": 0.5} for s in (2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = {("demo", "hf"): vllm_cpu.step_times(str(tmp_path)), ("demo", "vllm"): {"step_s": 4.0, "rollout_s": 1.0}}
    assert steps[("demo", "hf")] == {"step_s": 2.0, "rollout_s": 0.5, "steps": 2}  # the first step dropped
    rollouts = {("demo", "hf"): {"tokens_per_s": 100.0, "mean_length": 32.0},
                ("demo", "vllm"): {"tokens_per_s": 300.0, "mean_length": 32.0}}
    text = vllm_cpu.report(rollouts, steps, "1")
    assert "B = 64 sequences a call: 8 prompts x n = 8" in text
    assert "| demo | hf | 100 (mean length 32.0, ? threads) | 2.00 |" in text
    assert "demo: rollout, vLLM is faster (3.00x); GRPO step, HF is faster (2.00x)" in text
