"""What the config and the builders decide before the first step: RLLaVA keys mapped, refused or warned about,
values checked at load, the strategy chosen, the LR schedule, and the pipeline modules not built yet."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

from rllava.config import ConfigError, load_config
from rllava.config.schema import resolve_strategy
from rllava.train import builders as B
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _error(args) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError) as err:
            load_config(args)
    return str(err.value)


def _warnings(args) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        load_config(args)
    return [str(w.message) for w in record]


# ------------------------------------------------------------------------- RLLaVA keys rllava has no feature for


@pytest.mark.parametrize("arg, message", [
    ("rollout.max_turns=5", "rollout.max_turns=5 is read only by agent rollouts (set rollout.agent.tools, e.g. "
                            "[search, zoom]); leave it at 10"),
    ("rollout.agent.tool_format=json", "rollout.agent.tool_format=json is read only by agent rollouts"),
    ("rollout.discount=0.5", "rollout.discount=0.5 is read only by agent rollouts"),
    ("reward.model.use_peft=true", "reward.model.use_peft=true is not read: the reward model is run, never trained"),
    ("reward.model.tokenizer_path=t", "reward.model.tokenizer_path=t is read only with a reward model: set "
                                      "reward.model.model_path=DIR"),
    ("actor.fsdp.ulysses_size=2", "actor.fsdp.ulysses_size=2 is not read in rllava; set actor.model.ulysses_size"),
    ("actor.fsdp.fsdp_size=4", "actor.fsdp.fsdp_size=4 is not available yet in rllava (HSDP shard groups)"),
    ("actor.fsdp.wrap_policy.min_num_params=1000", "actor.fsdp.wrap_policy={'min_num_params': 1000} is not available"),
    ("actor.fsdp.torch_dtype=bfloat16", "actor.fsdp.torch_dtype=bfloat16 is not read in rllava; set "
                                        "actor.model.torch_dtype (weights) or actor.fsdp.mixed_precision"),
    ("critic.model.ulysses_size=2", "critic.model.ulysses_size=2: the critic runs in the actor's sequence-parallel "
                                    "groups; set it to actor.model.ulysses_size=1"),
    ("critic.model.tokenizer_path=t", "critic.model.tokenizer_path=t is not read for the value model; "
                                      "set actor.model.tokenizer_path instead"),
    ("rollout.vllm.seed=3", "rollout.vllm.seed=3 is not read in rllava; set rollout.seed instead"),
    ("rollout.vllm.model=m", "rollout.vllm.model=m is not read in rllava; set actor.model.model_path instead"),
    ("rollout.name=vllm rollout.ignore_eos=true", "rollout.ignore_eos=true is implemented for rollout.name=hf only"),
    ("actor.optim.training_steps=100", "actor.optim.training_steps=100 is derived in rllava from trainer.max_steps"),
])
def test_keys_without_a_feature_are_one_line_errors(arg, message):
    assert _error(arg.split()).startswith(message)


@pytest.mark.parametrize("arg, message", [
    ("actor.use_torch_compile=true", "actor.use_torch_compile=true has no effect: rllava runs eager PyTorch"),
    ("actor.fsdp.use_orig_params=true", "actor.fsdp.use_orig_params=true has no effect: an FSDP1 switch"),
    ("actor.model.tie_word_embeddings=true", "actor.model.tie_word_embeddings=true has no effect"),
    ("data.num_workers=8", "data.num_workers=8 has no effect: batches are encoded in the training process"),
    ("data.filter_overlong_prompts_workers=16", "data.filter_overlong_prompts_workers=16 has no effect"),
    ("rollout.disable_tqdm=true", "rollout.disable_tqdm=true has no effect: rllava shows no generation progress bar"),
    ("trainer.nnodes=2", "trainer.nnodes=2 has no effect: the launcher sets the processes"),
    ("trainer.n_gpus_per_node=4", "trainer.n_gpus_per_node=4 has no effect"),
    ("rollout.tensor_parallel_size=2", "rollout.tensor_parallel_size ignored: rollout.name=hf"),
    ("rollout.vllm.gpu_memory_utilization=0.5", "rollout.vllm.gpu_memory_utilization ignored: rollout.name=hf"),
    ("rollout.name=vllm rollout.micro_batch_size=8", "rollout.micro_batch_size ignored: rollout.name=vllm"),
    ("critic.model.model_path=m critic.strategy=single critic.fsdp.reshard_after_forward=false",
     "critic.fsdp.reshard_after_forward ignored: critic.strategy=single"),
])
def test_tuning_keys_without_effect_warn_in_one_line(arg, message):
    assert any(w.startswith(message) for w in _warnings(arg.split())), _warnings(arg.split())


def test_a_key_without_effect_warns_once():
    """Not also as a key the strategy ignores (actor.strategy=auto on one process: no FSDP)."""
    assert _warnings(["actor.fsdp.use_orig_params=true"]) == [
        "actor.fsdp.use_orig_params=true has no effect: an FSDP1 switch: FSDP2 always trains the original parameters"]


def test_rllava_defaults_load_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config([])


# ------------------------------------------------------------------------- keys mapped to rllava's


def test_clip_ratio_drives_the_sides_left_at_their_default():
    """RLLaVA documents actor.clip_ratio as the symmetric epsilon (its losses fall back to it for null sides)."""
    a = load_config(["actor.clip_ratio=0.3"]).actor
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.3, 0.3)
    a = load_config(["actor.clip_ratio=0.3", "actor.clip_ratio_high=0.28"]).actor
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.3, 0.28)
    assert load_config(["actor.clip_ratio_high=0.28"]).actor.clip_ratio_low == 0.2


@pytest.mark.parametrize("value", ["none", "null", "None"])
def test_seed_none_strings_mean_null(value):
    assert load_config([f"rollout.seed={value}"]).rollout.seed is None
    if value != "null":  # YAML reads a bare null as null itself
        assert load_config([f"data.format_prompt={value}"]).data.format_prompt == value  # a string key keeps it


def test_defaults_follow_rllava():
    cfg = load_config([])
    assert cfg.algorithm.use_kl_loss is True and cfg.actor.kl_loss_coef == 0.01


@pytest.mark.parametrize("world, expected", [(1, "single"), (2, "fsdp2"), (8, "fsdp2")])
def test_strategy_auto_is_single_on_one_process_and_fsdp2_under_torchrun(world, expected):
    assert resolve_strategy("auto", world) == expected
    assert resolve_strategy("deepspeed", world) == "deepspeed"


def test_strategy_auto_passes_the_torchrun_world_size_check():
    cfg = load_config(["data.train_batch_size=4", "actor.ppo_mini_batch_size=4"])
    B.check_world_size(cfg, 2)  # auto under torchrun = fsdp2: accepted
    with pytest.raises(ConfigError, match="actor.strategy=single runs on one device"):
        B.check_world_size(load_config(["actor.strategy=single", "data.train_batch_size=4",
                                        "actor.ppo_mini_batch_size=4"]), 2)


# ------------------------------------------------------------------------- values checked at load


@pytest.mark.parametrize("arg, message", [
    ("rollout.val_override_config.temperature=-1", "rollout.val_override_config.temperature=-1 must be >= 0"),
    ("rollout.val_override_config.top_p=2", "rollout.val_override_config.top_p=2 must be in (0, 1]"),
    ("rollout.val_override_config.n=0", "rollout.val_override_config.n=0 must be > 0"),
    ("rollout.val_override_config.n=two", "rollout.val_override_config.n=two must be a number"),
    ("rollout.val_override_config.seed=3", "rollout.val_override_config.seed is not applied at validation "
                                           "(it overrides: n, temperature, top_p, top_k)"),
    ("rollout.val_override_config.temprature=0", "rollout.val_override_config.temprature is not a rollout key; "
                                                 "did you mean rollout.val_override_config.temperature?"),
    ("actor.optim.strategy=sgd", "actor.optim.strategy=sgd is not one of: adamw, adamw_bf16"),
    ("actor.optim.strategy=adamw_bf16", "actor.optim.strategy=adamw_bf16 is not available yet in rllava"),
    ("critic.model.model_path=m critic.optim.strategy=sgd", "critic.optim.strategy=sgd is not one of"),
    ("actor.optim.lr=inf", "actor.optim.lr=inf must be a finite number"),
    ("actor.optim.lr=nan", "actor.optim.lr=nan must be > 0"),
    ("actor.optim.num_cycles=1.0", "actor.optim.num_cycles=1.0 is read only by actor.optim.lr_scheduler_type=cosine"),
    ("actor.optim.min_lr_ratio=0.1", "actor.optim.min_lr_ratio=0.1 is read only by actor.optim.lr_scheduler_type"),
])
def test_values_are_checked_at_load(arg, message):
    assert _error(arg.split()).startswith(message)


def test_val_override_config_values_in_range_load():
    cfg = load_config(["rollout.val_override_config.temperature=0", "rollout.val_override_config.n=1",
                       "rollout.val_override_config.top_k=-1"])
    assert B.sampling_params(cfg, validation=True).temperature == 0


def _lrs(*args, updates=10):
    o = load_config([*args]).actor.optim
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=o.lr)
    sched, lrs = B.lr_scheduler(o, opt, updates), []
    for _ in range(updates):
        lrs.append(sched.get_last_lr()[0] / o.lr)
        opt.step()
        sched.step()
    return lrs


def test_cosine_reads_num_cycles_and_min_lr_ratio():
    half = _lrs("actor.optim.lr_scheduler_type=cosine")
    assert half[0] == 1.0 and half[-1] < 0.05  # one half-wave down to ~0
    full = _lrs("actor.optim.lr_scheduler_type=cosine", "actor.optim.num_cycles=1.0")
    assert full[5] < 0.01 and full[-1] > 0.9  # down and back up
    floor = _lrs("actor.optim.lr_scheduler_type=cosine", "actor.optim.min_lr_ratio=0.5")
    assert min(floor) >= 0.5 - 1e-6 and floor[-1] < 0.55


@pytest.mark.parametrize("world", [1, 8])
def test_lr_schedule_counts_the_optimizer_steps_each_rank_takes(monkeypatch, world):
    """Batch 128 prompts, mini-batches of 32, n = 8, 100 steps: each of W ranks holds 1024 / W rows in mini-batches
    of 256 / W, 4 optimizer steps a step, 400 in all, which the schedule plans on 1 rank or 8 (it planned 3,200 on
    8: 1/8 of a decay, warmup_ratio=0.1 over 80 % of the run). verl's scheduler runs over the steps it takes on each
    rank (verl/workers/fsdp_workers.py@b178a3c L579-586, L921). Critic and SFT (n = 1) count alike."""
    monkeypatch.setattr(B.D, "world_size", lambda: world)
    cfg = load_config(["data.train_batch_size=128", "actor.ppo_mini_batch_size=32", "rollout.n=8",
                       "critic.model.model_path=m", "critic.ppo_mini_batch_size=32"])
    for role in (cfg.actor, cfg.critic):
        assert B._schedule(cfg, 100, role, 8) == (256 // world, 400)
    assert B._schedule(cfg, 100, cfg.actor, 1) == (32 // world, 400)


def test_validation_off_loads_no_val_set():
    off = load_config(["trainer.val_before_train=false", "trainer.val_freq=-1"])
    assert not B.validates(off)
    assert B.validates(load_config([])) and B.validates(load_config(["trainer.val_before_train=false",
                                                                     "trainer.val_freq=5"]))


def test_val_files_are_not_opened_when_validation_is_off(tiny_model_dir, counting_dir):
    from rllava.model.processor import load_processor

    cfg = load_config([f"data.train_files={counting_dir}/train.jsonl", "data.val_files=no/such@test",
                       "data.prompt_key=problem", "trainer.val_before_train=false", "data.max_samples=4"])
    train, val = B.build_datasets(cfg, load_processor(tiny_model_dir))
    assert len(train) == 4 and val is None


def test_ignore_eos_generates_to_the_budget(tiny_model_dir):
    from rllava.data.protocol import Sample
    from rllava.engine.inference.base import SamplingParams
    from rllava.model.loader import build_policy

    cfg = load_config([f"actor.model.model_path={tiny_model_dir}", "rollout.ignore_eos=true",
                       "data.max_response_length=6"])
    model, processor = build_policy(cfg.actor.model, torch.device("cpu"))
    rollout = B.build_rollout(cfg, processor, torch.device("cpu"))
    rollout.engine.model = model
    assert rollout.engine.stop_token_ids == []  # the default stops at the tokenizer's EOS
    assert B.build_rollout(load_config([f"actor.model.model_path={tiny_model_dir}"]), processor,
                           torch.device("cpu")).engine.stop_token_ids != []
    sample = Sample(index=0, messages=[{"role": "user", "content": "count"}], images=[], ground_truth="1")
    (traj,) = rollout.generate([sample], SamplingParams(n=1, temperature=1.0, max_new_tokens=6))
    assert traj.finish_reason == "length" and traj.num_response_tokens == 6


# ------------------------------------------------------------------------- RLLaVA's other pipeline modules


def test_agentic_pipeline_without_tools_is_one_line():
    r = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.agentic", "config=examples/config.yaml"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("rllava: error: rllava.train.pipeline.agentic runs multi-turn agents: set "
                           "rollout.agent.tools")


def test_fsdp2_on_one_plain_process_runs_as_a_world_of_one(tmp_path, tiny_model_dir, counting_dir):
    """`python -m ... actor.strategy=fsdp2` without torchrun: no RANK traceback, a finished run."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    r = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
                        f"actor.model.model_path={tiny_model_dir}", f"data.train_files={counting_dir}/train.jsonl",
                        "data.max_samples=8", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2",
                        "trainer.max_steps=1", "trainer.val_before_train=false", "trainer.val_freq=-1",
                        "actor.strategy=fsdp2", *keys_for(out), "trainer.logger=[jsonl]"],
                       cwd=REPO, env={**env, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "final" / "model.safetensors").exists()
