"""RLLaVA's own scripts run here unchanged: their keys (tests/config/rllava_scripts/*.txt, copied from RLLaVA's
examples/config.yaml and example scripts) load and train for 2 steps on the tiny model. Only what a CPU test must
change is swapped: the model, the data (and a prompt template or reward file rllava does not have), sizes and
lengths, the rollout engine (vLLM is GPU-only), the outputs dir and max_steps. Every other key is RLLaVA's."""

import json
import os
import warnings

import pytest
from omegaconf import OmegaConf

from rllava.errors import RllavaError
from rllava.reward.function import RewardFunction
from rllava.train.pipeline import rlvr, sft_rl

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rllava_scripts")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ["grpo", "dapo", "drgrpo", "rloo", "counting_clevr", "luffy_clevr"]
# the data's own field names, swapped with the data (the synthetic counting records: problem, answer, images,
# solution); the LUFFY script's expert text is then `solution` + "\n" + the answer (RLHFDatasetWithTargetClevr)
DATA_FIELDS = {"luffy_clevr": ["data.answer_key=answer", "data.image_key=images",
                               "data.dataset_kwargs.target_key=solution"]}
REWARD = os.path.join(HERE, "reward.py")


def _keys(name: str) -> list[str]:
    return [line.strip() for line in open(os.path.join(HERE, f"{name}.txt"))
            if line.strip() and not line.startswith("#")]


def _sequential_form() -> str:
    """RLLaVA's sequential reward takes one dict per call; rllava's older sequential took (response, ground_truth).
    The stand-in reward has both: use the one rllava's reward_type=sequential accepts."""
    try:
        RewardFunction(f"{REWARD}:compute_score", "sequential")
        return "compute_score"
    except RllavaError:
        return "compute_score_two_args"


def _swaps(script_keys, model, data, out) -> list[str]:
    """The CPU test's swaps, given after RLLaVA's keys (later keys win)."""
    reward = dict(k.split("=", 1) for k in script_keys).get("reward.reward_type", "batch")
    fn = _sequential_form() if reward == "sequential" else "compute_score_batch"
    swaps = [f"actor.model.model_path={model}", f"data.train_files={data}/train.jsonl",
             f"data.val_files={data}/val.jsonl", f"reward.reward_function={REWARD}:{fn}", "rollout.name=hf",
             "data.max_samples=16", "data.train_batch_size=4", "data.val_batch_size=8", "rollout.n=2",
             "data.max_response_length=8", "data.max_pixels=12544", "actor.ppo_micro_batch_size=8",
             "actor.log_prob_micro_batch_size=8", "trainer.max_steps=2", f"trainer.outputs_dir={out}"]
    if any(k.startswith("data.format_prompt=") and not os.path.isfile(os.path.join(REPO, k.split("=", 1)[1]))
           for k in script_keys):  # r1v.jinja: not one of rllava's templates
        swaps.append("data.format_prompt=./examples/format_prompt/counting.jinja")
    if any(k.startswith("data.max_response_length=") for k in script_keys):  # the script's own length, on CPU
        swaps.append("data.max_response_length=8")
    return swaps


def test_script_key_files_hold_only_rllava_keys_and_values():
    for name in ["config", *SCRIPTS]:
        text = open(os.path.join(HERE, f"{name}.txt")).read()
        assert text.startswith("# RLLaVA's examples/") and "TinyLoopX/RLLaVA@" in text.splitlines()[0]
        assert all("=" in k for k in _keys(name))


@pytest.mark.parametrize("script", SCRIPTS)
def test_rllava_script_runs_two_steps_unchanged(script, tmp_path, tiny_model_dir, counting_dir, monkeypatch):
    monkeypatch.chdir(REPO)  # RLLaVA's scripts name files relative to the repository root
    base = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.from_dotlist(_keys("config")), base)  # RLLaVA's examples/config.yaml
    keys, out = _keys(script), tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. rollout.vllm.* ignored with rollout.name=hf: said, and tested elsewhere
        module = sft_rl if script.startswith("luffy") else rlvr  # RLLaVA's hybrid scripts run its sft_rl module
        module.main([f"config={base}", *keys, *_swaps(keys, tiny_model_dir, counting_dir, out),
                     *DATA_FIELDS.get(script, [])])
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert (out / "final" / "model.safetensors").exists()
    if script == "dapo":
        assert all("batch/sampling_rounds" in r for r in rows if "reward/mean" in r)
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]  # val_before_train, and at the last step
    if script == "rloo":  # KL in the reward (use_kl_in_reward), none in the loss (use_kl_loss=false)
        assert all("actor/reward_kl" in r and "actor/kl_loss" not in r for r in steps)
    if script == "grpo":  # RLLaVA's default use_kl_loss=true: the KL term is in the loss
        assert all("actor/kl_loss" in r for r in steps)
    if script == "luffy_clevr":  # the expert response (the Clevr class: field + "\n" + answer) is in each group
        assert all(r["hybrid/prefix_tokens_mean"] > 0 and r["hybrid/off_policy_token_share"] > 0 for r in steps)
