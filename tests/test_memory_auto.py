"""rllava.train.memory.auto: `actor.ppo_micro_batch_size=auto` and its twins are the largest micro-batch the planner
fits in the budget (less the margin), one more does not fit; without a GPU or a budget each is its default; a run
resolves them before its first step and says so in one line."""

import json
import os

import pytest

from rllava.config import load_config
from rllava.train.memory import auto, planner

TINY_CPU = "examples/tasks/counting/tiny_cpu.yaml"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4"]  # 8 rows, one mini-batch


def _cfg(model_path: str, *overrides: str):
    return load_config([f"config={TINY_CPU}", f"actor.model.model_path={model_path}", *SMALL, *overrides])


@pytest.mark.parametrize("top", [1, 2, 7, 40])
def test_largest_fitting_is_the_boundary_of_any_growing_peak(top):
    for peak_of in (lambda r: 10 * r, lambda r: r * r, lambda r: 100 + r ** 3, lambda r: 2 ** r):
        for limit in (0, 5, 10, 37, 100, 1000, 10 ** 9):
            want = max([r for r in range(1, top + 1) if peak_of(r) <= limit], default=1)
            got, peaks = auto.largest_fitting(peak_of, limit, top)
            assert got == want, (top, limit)
            assert all(peaks[r] == peak_of(r) for r in peaks) and len(peaks) <= 3 + 2 * top.bit_length()


@pytest.mark.parametrize("key, extra, phase", [
    ("actor.ppo_micro_batch_size", [], "update"),
    pytest.param("actor.log_prob_max_token_len_per_gpu", ["actor.model.dynamic_batching=true"], "old log-prob",
                 marks=pytest.mark.slow)])
def test_auto_is_the_largest_size_the_planner_fits_and_one_more_does_not(tiny_model_dir, key, extra, phase):
    """A made-up budget between the planner's peaks at 2 and 3 sequences per micro-batch (plus the margin):
    auto picks 2 (a token budget: 2 full-length rows), the planner's full plan at that size fits, at 3 it does not."""
    length = 128 + 10  # tiny_cpu.yaml's prompt + response
    tokens = key.endswith("_max_token_len_per_gpu")

    def peak(rows: int) -> int:
        value = rows * length if tokens else rows
        return {r["phase"]: r["peak"] for r in planner.plan(_cfg(tiny_model_dir, *extra, f"{key}={value}"),
                                                            device="cpu")}[phase]

    two, three = peak(2), peak(3)
    assert two < three
    budget = int((two + three) / 2 / (1 - auto.MARGIN))
    cfg = _cfg(tiny_model_dir, *extra, f"{key}=auto")
    lines = auto.resolve(cfg, budget, device="cpu")
    chosen = cfg.actor.__getattribute__(key.split(".")[1])
    assert chosen == (2 * length if tokens else 2), lines
    limit = budget * (1 - auto.MARGIN)
    assert two <= limit < three
    assert lines == [f"{key}=auto -> {chosen} (planned peak {planner.show(two)} of {planner.show(budget)} with a "
                     f"10% margin; 3 plans {planner.show(three)})"]


def test_without_gpu_or_budget_auto_is_the_default_and_a_budget_needs_an_auto(tiny_model_dir, capsys):
    cfg = _cfg(tiny_model_dir, "actor.ppo_micro_batch_size=auto", "actor.log_prob_micro_batch_size=auto",
               "actor.ppo_max_token_len_per_gpu=auto")
    auto.size_run(cfg)  # this machine: no GPU
    assert (cfg.actor.ppo_micro_batch_size, cfg.actor.log_prob_micro_batch_size) == (4, 16)
    assert cfg.actor.ppo_max_token_len_per_gpu == 16384
    assert capsys.readouterr().out.splitlines() == [
        "actor.ppo_micro_batch_size=auto -> 4 (no GPU and no trainer.memory_budget_gb: the default)",
        "actor.log_prob_micro_batch_size=auto -> 16 (no GPU and no trainer.memory_budget_gb: the default)",
        "actor.ppo_max_token_len_per_gpu=auto -> 16384 (no GPU and no trainer.memory_budget_gb: the default)"]
    with pytest.raises(Exception, match="an actor size set to auto: size it first"):
        planner.plan(_cfg(tiny_model_dir, "actor.fsdp.keep_gathered_units=auto"), device="cpu")
    with pytest.raises(Exception, match="trainer.memory_budget_gb=8.0 sizes the auto micro-batches"):
        _cfg(tiny_model_dir, "trainer.memory_budget_gb=8")
    with pytest.raises(Exception, match="actor.ppo_micro_batch_size=big must be > 0 or auto"):
        _cfg(tiny_model_dir, "actor.ppo_micro_batch_size=big")


def test_a_run_sizes_auto_before_its_first_step_and_says_so(tmp_path, tiny_model_dir, counting_dir, capfd,
                                                              monkeypatch):
    """rlvr with actor.ppo_micro_batch_size=auto and trainer.memory_budget_gb on CPU: the one line, and the run's
    config.yaml holds the number it trained with."""
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    monkeypatch.chdir(REPO)
    out = str(tmp_path / "run")
    reward = tmp_path / "distinct.py"
    reward.write_text("def compute_score(response, ground_truth):\n"
                      "    return {'overall': len(set(response)) / 20, 'accuracy': 0.0}\n")
    rlvr.main([f"config={TINY_CPU}", f"actor.model.model_path={tiny_model_dir}", *SMALL,
               f"data.train_files={counting_dir}/train.jsonl", "data.max_samples=4", "trainer.max_steps=1",
               "trainer.val_before_train=false", "trainer.val_freq=-1", *keys_for(out), "trainer.logger=[jsonl]",
               f"reward.reward_function={reward}:compute_score", "actor.ppo_micro_batch_size=auto",
               "trainer.memory_budget_gb=0.0249"])
    said = [line for line in capfd.readouterr().out.splitlines() if line.startswith("actor.ppo_micro_batch_size")]
    assert len(said) == 1 and "planned peak" in said[0], said
    chosen = int(said[0].split(" -> ")[1].split()[0])
    assert 1 < chosen < 8  # the budget is between one sequence's peak and the whole mini-batch's
    written = load_config([f"config={out}/config.yaml"])
    assert written.actor.ppo_micro_batch_size == chosen
    assert [json.loads(line)["step"] for line in open(os.path.join(out, "metrics.jsonl"))] == [1]


def test_prefetch_and_kept_units_reach_the_fsdp2_engines(tiny_model_dir, monkeypatch):
    """actor.fsdp.forward_prefetch / keep_gathered_units (and critic.fsdp's) reach FSDP2Engine (which shards with
    them: tests/engine/test_sharded_engines.py::test_offload_with_prefetch_and_kept_units_matches_one_process);
    critic.fsdp.keep_gathered_units=auto is refused (the planner sizes the actor's)."""
    import torch

    from rllava.algorithms.ppo import build_algorithm
    from rllava.engine.train.fsdp2 import FSDP2Engine
    from rllava.model.loader import build_policy
    from rllava.train import builders as B

    monkeypatch.setattr(FSDP2Engine, "prepare", lambda self, model, *_: setattr(self, "model", model) or model)
    cfg = _cfg(tiny_model_dir, "actor.strategy=fsdp2", "actor.fsdp.forward_prefetch=true",
               "actor.fsdp.keep_gathered_units=3", "algorithm.adv_estimator=gae", "critic.strategy=fsdp2",
               "critic.fsdp.forward_prefetch=true", "critic.fsdp.keep_gathered_units=2")
    model, _ = build_policy(cfg.actor.model, torch.device("cpu"))
    engine = B.build_engine(cfg, model, torch.device("cpu"), 2)
    assert engine.forward_prefetch and engine.keep_gathered_units == 3
    critic = B.build_critic(cfg, torch.device("cpu"), 2, build_algorithm(cfg.algorithm, cfg.actor))
    assert critic.engine.forward_prefetch and critic.engine.keep_gathered_units == 2
    with pytest.raises(Exception, match="critic.fsdp.keep_gathered_units=auto: the memory planner sizes the actor"):
        _cfg(tiny_model_dir, "algorithm.adv_estimator=gae", "critic.fsdp.keep_gathered_units=auto")
    with pytest.raises(Exception, match="actor.fsdp.keep_gathered_units=-1 must be >= 0 or auto"):
        _cfg(tiny_model_dir, "actor.fsdp.keep_gathered_units=-1")
