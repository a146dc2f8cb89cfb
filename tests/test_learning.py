"""Learning checks (slow; `make test-slow`): every advantage estimator and every policy loss must *learn*.

From one SFT-warmed tiny Qwen2-VL (the demo's recipe, built once per session), each algorithm runs a short
GRPO-style RL run on the synthetic counting task; held-out accuracy sampled at the rollout temperature must
rise by a margin that one evaluation's noise (~2-3 points on 400 samples) cannot produce alone. The difficulty
curriculum (data.sampler=difficulty_pools) is checked against GRPO's epoch sampler on a skewed mix of prompts.
"""

import json
import os

import pytest

from rllava.config import load_config
from rllava.data.synthetic import make_counting
from rllava.model.tiny import build_tiny
from rllava.train.pipeline import rlvr, sft
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 60
MARGIN = 0.06


@pytest.fixture(scope="session")
def warm(tmp_path_factory):
    """(SFT-warmed model dir, data dir): 50 SFT steps, as `make demo` does."""
    root = tmp_path_factory.mktemp("learning")
    model = build_tiny("qwen2_vl", str(root / "model"), size="demo", seed=0)
    data = make_counting(str(root / "data"), n_train=4000, n_val=200, seed=0)
    os.chdir(REPO)
    out = sft.train(load_config([f"config=examples/tasks/counting/tiny_cpu_sft.yaml", f"actor.model.model_path={model}",
                               f"data.train_files={data['train']}", f"data.val_files={data['val']}",
                               "trainer.max_steps=50", "trainer.val_freq=0", *keys_for(str(root / "sft")),
                               "trainer.logger=[jsonl]"]))
    return os.path.join(out, "final"), data


def _lift(warm, tmp_path, *extra, key="val/accuracy"):
    model, data = warm
    out = rlvr.train(load_config([
        "config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
        f"data.train_files={data['train']}", f"data.val_files={data['val']}", f"trainer.max_steps={STEPS}",
        f"trainer.val_freq={STEPS}", "trainer.val_greedy=false", *keys_for(str(tmp_path / "rl")),
        "trainer.logger=[jsonl]", *extra]))
    vals = [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if key in r]
    start, end = vals[0][key], vals[-1][key]
    print(f"{' '.join(extra)}: held-out {key} {start:.3f} -> {end:.3f}")
    return start, end


# grpo_passk credits only the single best sample of a group, and only when it beats the runner-up (for 0/1
# rewards: exactly one success in the group), so ~10x fewer samples carry signal per step than with GRPO: at
# GRPO's lr it stays flat over 60 steps (pass@2 0.435 -> 0.440), lr 1.5e-3 collapses it (-> 0.0); lr 6e-4 for
# 100 steps: 0.435 -> 0.500 (measured; the closest to the margin of all these tests).
ESTIMATORS = {
    "grpo": [], "dr_grpo": ["actor.loss_agg_mode=seq-mean-token-sum-norm"], "grpo_passk": ["actor.optim.lr=6e-4", "trainer.max_steps=100"], "rloo": [],
    "reinforce_plus_plus": [], "reinforce_plus_plus_baseline": [], "remax": [], "opo": [], "gpg": [],
}
LOSSES = {
    "vanilla": [], "dapo": ["actor.clip_ratio_high=0.28"], "gspo": ["actor.clip_ratio_low=3e-4", "actor.clip_ratio_high=4e-4"],
    "geo_mean": ["actor.clip_ratio_low=0.4", "actor.clip_ratio_high=0.4"], "gpg": [], "clip_cov": [], "kl_cov": [],
    "cispo": [], "sapo": [], "decoupled_ppo": ["actor.policy_loss.behav_imp_weight_cap=5.0"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_estimator_learns(warm, tmp_path, name):
    # grpo_passk optimises the best of K samples, so it is judged on pass@2 (either of 2 samples right)
    key = "val/pass@2" if name == "grpo_passk" else "val/accuracy"
    start, end = _lift(warm, tmp_path, f"algorithm.adv_estimator={name}", *ESTIMATORS[name], key=key)
    assert end >= start + MARGIN


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_policy_loss_learns(warm, tmp_path, name):
    # Two mini-batches per step: the second is off-policy (ratio != 1), where the losses differ; on-policy
    # with one mini-batch every ratio-based loss has the same gradient -A grad logp.
    start, end = _lift(warm, tmp_path, f"actor.policy_loss.loss_mode={name}", "actor.ppo_mini_batch_size=4",
                       *LOSSES[name])
    assert end >= start + MARGIN


@pytest.mark.slow
def test_ppo_with_gae_critic_learns(warm, tmp_path):
    start, end = _lift(warm, tmp_path, "algorithm.adv_estimator=gae", f"critic.model.model_path={warm[0]}",
                       "critic.optim.lr=1e-3", "trainer.critic_warmup=5", "critic.ppo_micro_batch_size=64")
    assert end >= start + MARGIN


SKEWED_REWARD = """import importlib.util
spec = importlib.util.spec_from_file_location("counting", {path!r})
counting = importlib.util.module_from_spec(spec)
spec.loader.exec_module(counting)


def compute_score(response, ground_truth):
    if ground_truth in ("always", "never"):  # solved by every response / by none
        value = float(ground_truth == "always")
        return {{"overall": value, "format": value, "accuracy": value}}
    return counting.score_one(response, ground_truth)
"""


def _skewed_task(warm, root):
    """192 training prompts of the counting set: 64 that every response solves ("always"), 64 that none can
    ("never") and 64 learnable ones; the held-out set is the counting one."""
    _, data = warm
    with open(data["train"]) as f:
        rows = [json.loads(line) for line, _ in zip(f, range(192))]
    for i, row in enumerate(rows):
        row["answer"] = ("always", "never", row["answer"])[i % 3]
    os.makedirs(root, exist_ok=True)
    train = os.path.join(root, "train.jsonl")
    with open(train, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    os.symlink(os.path.join(os.path.dirname(data["train"]), "images"), os.path.join(root, "images"))
    reward = os.path.join(root, "skewed.py")
    with open(reward, "w") as f:
        f.write(SKEWED_REWARD.format(path=os.path.join(REPO, "examples", "reward_function", "counting.py")))
    return train, f"{reward}:compute_score"


@pytest.mark.slow
def test_difficulty_curriculum_wastes_fewer_groups(warm, tmp_path):
    """On a skewed mix (a third always solved, a third never, a third learnable), data.sampler=difficulty_pools at
    its defaults draws fewer groups without signal than GRPO's epoch sampler (measured 0.642 of a batch's groups
    against 0.760; asked: 0.08 fewer) and holds at least its held-out accuracy at the same 60 steps and seed
    (0.330 against 0.328; asked: within 0.02, under one evaluation's noise of ~0.023) (docs/proof.md, "A difficulty
    curriculum")."""
    model, data = warm
    train, reward = _skewed_task(warm, str(tmp_path / "skewed"))
    results = {}
    for sampler in ("epoch", "difficulty_pools"):
        out = rlvr.train(load_config([
            "config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={train}", f"data.val_files={data['val']}", f"reward.reward_function={reward}",
            f"trainer.max_steps={STEPS}", f"trainer.val_freq={STEPS}", "trainer.val_greedy=false",
            f"data.sampler={sampler}", *keys_for(str(tmp_path / sampler)), "trainer.logger=[jsonl]"]))
        rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        vals = [r["val/accuracy"] for r in rows if "val/accuracy" in r]
        waste = [r["batch/groups_without_signal"] for r in rows if "batch/groups_without_signal" in r]
        results[sampler] = (sum(waste) / len(waste), vals[0], vals[-1])
        print(f"data.sampler={sampler}: groups without signal {results[sampler][0]:.3f}, held-out accuracy "
              f"{vals[0]:.3f} -> {vals[-1]:.3f}")
    (grpo_waste, _, grpo_end), (pools_waste, _, pools_end) = results["epoch"], results["difficulty_pools"]
    assert pools_waste < grpo_waste - 0.08
    assert pools_end >= grpo_end - 0.02
