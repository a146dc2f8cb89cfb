"""rllava.config: schema defaults, YAML + command-line loading, aliases, and error messages."""

import os
import warnings

import pytest
from omegaconf import OmegaConf

from rllava.config import (
    ALIASES,
    ConfigError,
    CriticConfig,
    ModelConfig,
    PPOConfig,
    RolloutConfig,
    config_to_yaml,
    load_config,
)
from rllava.config.schema import NOT_BUILT_YET

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# RLLaVA's examples/config.yaml (snapshot 4753d4a), verbatim.
EXAMPLE_YAML = """\
data:
  train_files: hiyouga/math12k@train
  val_files: hiyouga/math12k@test
  prompt_key: problem
  answer_key: answer
  image_key: images
  video_key: videos
  video_fps: 2.0
  max_prompt_length: 512
  max_response_length: 512
  train_batch_size: 16
  val_batch_size: 128
  format_prompt: ./examples/format_prompt/math.jinja
  override_chat_template: null
  shuffle: true
  seed: 1
  min_pixels: 3136
  max_pixels: 4194304
  filter_overlong_prompts: true

algorithm:
  adv_estimator: grpo
  online_filtering: false  # dapo filter groups
  filter_key: overall
  filter_low: 0.01
  filter_high: 0.99

actor:
  ppo_mini_batch_size: 4
  ppo_micro_batch_size: 1
  log_prob_micro_batch_size: 2
  max_grad_norm: 1.0
  model:
    model_path: Qwen/Qwen2.5-7B-Instruct
    enable_gradient_checkpointing: true
    trust_remote_code: true
    freeze_vision_tower: false
  optim:
    lr: 1.0e-6
    weight_decay: 1.0e-2
    strategy: adamw  # {adamw, adamw_bf16}
    lr_warmup_ratio: 0.0
  fsdp:
    enable_cpu_offload: true
    use_orig_params: false
    offload_params: true  # true: more CPU memory; false: more GPU memory
    offload_optimizer: true  # true: more CPU memory; false: more GPU memory
rollout:
  n: 5
  temperature: 1.0
  top_p: 1.0
  limit_images: 0
  tensor_parallel_size: 1
  disable_tqdm: false
  vllm:
    gpu_memory_utilization: 0.4
    enforce_eager: true
    enable_chunked_prefill: false
  val_override_config:
    temperature: 0.0
    top_p: 1.0
    top_k: -1
    n: 1
critic: null

reward:
  reward_type: batch
  reward_function: ./examples/reward_function/math.py:compute_score
  skip_special_tokens: true
trainer:
  total_epochs: 15
  max_steps: null
  project_name: rllava
  experiment_name: qwen2_5_7b_math_grpo
  logger: ["console", "tensorboard"]
  nnodes: 1
  n_gpus_per_node: 8
  max_try_make_batch: 20  # -1 means no limit
  val_freq: 5  # -1 to disable
  val_before_train: true
  val_only: false
  val_generations_to_log: 3
  save_freq: 20  # -1 to disable
  save_limit: 2  # -1 to disable
  save_model_only: false
  save_checkpoint_path: null
  load_checkpoint_path: null
  find_last_checkpoint: true
"""

# RLLaVA's schema defaults (its PPOConfig dataclasses); `*` marks keys it fills in post_init.
RLLAVA_SCHEMA = """\
data.{train_files:'', val_files:'', train_image_dir:None, val_image_dir:None, prompt_key:prompt, answer_key:answer, image_key:images, video_key:videos, video_fps:2.0, max_prompt_length:512, max_response_length:512, train_batch_size:512, val_batch_size:-1, format_prompt:None, override_chat_template:None, shuffle:True, seed:1, min_pixels:3136, max_pixels:4194304, num_workers:8, filter_overlong_prompts:True, filter_overlong_prompts_workers:16, dataset_class:None, dataset_kwargs:None}
trainer.{total_epochs:15, max_steps:None, project_name:rllava, experiment_name:agent, logger:[console,tensorboard], nnodes:1, n_gpus_per_node:8, max_try_make_batch:20, critic_warmup:0, val_freq:-1, val_before_train:True, val_only:False, val_generations_to_log:0, save_freq:-1, save_limit:-1, save_model_only:False, outputs_dir:None, save_checkpoint_path:None, load_checkpoint_path:None, find_last_checkpoint:True, async_training:False}
algorithm.{gamma:1.0, lam:1.0, adv_estimator:grpo, norm_adv_by_std_in_grpo:True, use_kl_loss:True, kl_penalty:kl, kl_ctrl.{type:fixed, kl_coef:0.001, horizon:10000, target_kl:0.1}, use_kl_in_reward:False, online_filtering:False, filter_key:overall, filter_low:0.01, filter_high:0.99, unify_strategy:none, switch_gate:0, success_reward_threshold:1.0, prefix_strategy:none, min_prefix_ratio:0.0, max_prefix_ratio:1.0, n_prefix:-1, prefix_share_across_samples:False, hint_steps:0, hint_min_ratio:0.0, hint_max_ratio:1.0}
actor.{strategy:fsdp2, ppo_mini_batch_size:256, ppo_micro_batch_size:4, log_prob_micro_batch_size:16, max_grad_norm:1.0, skip_grad_norm:80.0, clip_ratio:0.2, clip_ratio_low:0.2, clip_ratio_high:0.2, clip_ratio_c:3.0, clip_upper_bound:1.0, loss_agg_mode:token-mean, entropy_coeff:0.0, tis_imp_ratio_cap:-1.0, ppo_epochs:1, use_torch_compile:True, kl_loss_coef:0.01, kl_loss_type:low_var_kl, loss_remove_clip:False, off_policy_reshape:no_reshape, off_policy_reshape_weight:0.1, off_policy_reshape_pow_exp:0.5, off_policy_cliprange:0.2, off_policy_normalize:False, off_policy_max_clip:-1, off_policy_min_clip:-1, all_max_clip:-1, on_policy_reshape:no_reshape, on_policy_reshape_weight:0.1, on_policy_reshape_pow_exp:0.5, srft_type:paper, hpt_hint_loss_coef:0.0, sft_loss_coef:1.0}
actor.model.{model_path:None, tokenizer_path:None, torch_dtype:None, tie_word_embeddings:False, attn_implementation:flash_attention_2, override_config:{}, enable_gradient_checkpointing:True, enable_activation_offload:False, trust_remote_code:True, freeze_vision_tower:False, padding_free:True, dynamic_batching:True, ulysses_size:1, use_peft:False, lora_task_type:CAUSAL_LM, lora_r:128, lora_target_modules:[q_proj,v_proj,k_proj,o_proj], lora_alpha:256, lora_dropout:0.05, lora_use_rslora:False, lora_weight_path:'', lora_bias:none, use_rslora:False, lora_modules_to_save:None}
actor.checkpoint.{save_contents:[model,optimizer,extra], load_contents:[model,optimizer,extra], async_save:False}
actor.optim.{lr:1e-06, betas:[0.9,0.999], weight_decay:0.01, strategy:adamw, lr_warmup_ratio:0.0, lr_warmup_steps:None, lr_scheduler_type:constant, min_lr_ratio:None, num_cycles:0.5, warmup_style:constant, training_steps:-1}
actor.policy_loss.{loss_mode:vanilla, clip_cov_ratio:0.0002, clip_cov_lb:1.0, clip_cov_ub:5.0, kl_cov_ratio:0.0002, ppo_kl_coef:0.1}
actor.fsdp.{wrap_policy:{}, enable_cpu_offload:False, use_orig_params:False, torch_dtype:None, offload_params:False, offload_optimizer:False, reshard_after_forward:True, forward_prefetch:False, fsdp_size:-1, ulysses_size:1, mixed_precision:None}
actor.deepspeed.{zero_stage:3, enable_cpu_offload:True, torch_dtype:bf16, contiguous_gradients:True, overlap_comm:True, reduce_scatter:True, stage3_prefetch_bucket_size:1e8, stage3_param_persistence_threshold:1e5}
reward.{reward_type:batch, reward_function:None, reward_function_kwargs:{}, skip_special_tokens:True, num_cpus:1, reward_function_name:None}
reward.model.{model_path:None, tokenizer_path:None, torch_dtype:None, tie_word_embeddings:False, attn_implementation:flash_attention_2, override_config:{}, enable_gradient_checkpointing:True, enable_activation_offload:False, trust_remote_code:True, freeze_vision_tower:False, padding_free:True, dynamic_batching:True, ulysses_size:1, use_peft:False, lora_task_type:CAUSAL_LM, lora_r:128, lora_target_modules:[q_proj,v_proj,k_proj,o_proj], lora_alpha:256, lora_dropout:0.05, lora_use_rslora:False, lora_weight_path:'', lora_bias:none, use_rslora:False, lora_modules_to_save:None}
rollout.{name:vllm, n:1, temperature:1.0, top_p:1.0, top_k:-1, tensor_parallel_size:1, seed:1, limit_images:0, ignore_eos:False, disable_tqdm:False, micro_batch_size:2, val_override_config:{}, partial_rollout:False, async_mode:False, bucket_size:512, load_format:dummy, max_turns:10, discount:0.9, tool_config_path:None, env_config_path:None, prompt_length:-1*, response_length:-1*, trust_remote_code:True*, adv_estimator:grpo*, min_pixels:None*, max_pixels:None*, video_fps:2.0*}
rollout.vllm.{model:'', seed:1, skip_tokenizer_init:False, load_format:auto, dtype:float16, pipeline_parallel_size:1, max_model_len:None, gpu_memory_utilization:0.9, max_num_batched_tokens:8192, disable_log_stats:True, enforce_eager:True, enable_chunked_prefill:False, distributed_executor_backend:None, tokenizer:None, chat_template:None}
rollout.sglang.{dtype:bfloat16, mem_fraction_static:0.6, tp_size:1, skip_server_warmup:False}
"""
RLLAVA_CRITIC = {"strategy": "auto",  # rllava default, as for actor.strategy
                 "ppo_mini_batch_size": 256, "ppo_micro_batch_size": 4,
                 "log_prob_micro_batch_size": 16, "max_grad_norm": 1.0, "cliprange_value": 0.5,
                 "loss_avg_mode": "token", "ppo_epochs": 1}

# Where rllava's default deliberately differs from RLLaVA's (each is explained in schema.py).
RLLAVA_DIFFERENCES = {
    "actor.strategy": "auto",  # single on one process, fsdp2 under torchrun (RLLaVA: fsdp2 everywhere)
    "rollout.name": "hf",
    "actor.model.attn_implementation": "sdpa",
    "actor.model.enable_gradient_checkpointing": False,
    "actor.model.padding_free": False,
    "actor.model.dynamic_batching": False,
    "actor.model.trust_remote_code": False,
    **{f"reward.model.{k}": v for k, v in [("attn_implementation", "sdpa"), ("enable_gradient_checkpointing", False),
                                           ("padding_free", False), ("dynamic_batching", False),
                                           ("trust_remote_code", False)]},  # RLLaVA's ModelConfig, as actor.model
    "reward.reward_type": "auto",
    "trainer.logger": ["console", "jsonl"],
    "rollout.discount": 0.95,  # GiGPO's gamma (RLLaVA declares 0.9 and reads it nowhere)
    "actor.off_policy_reshape": None,  # the loss's own: LUFFY's / SRFT's p_div_p_0.1 (the default)
    # Tuning knobs rllava has nothing to tune with: the honest default, and a change warns (NO_EFFECT_KEYS).
    "data.num_workers": 0,
    "data.filter_overlong_prompts_workers": 1,
    "actor.use_torch_compile": False,
}


def _split_top(text):
    """Split on commas outside [] and {}."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()] if cur.strip() else parts


def _scalar(text):
    text = text.rstrip("*")
    named = {"None": None, "True": True, "False": False, "''": "", "{}": {}}
    if text in named:
        return named[text]
    if text.startswith("["):
        return [_scalar(t) for t in _split_top(text[1:-1])]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parse_schema_block(block):
    out = {}

    def walk(prefix, body):
        for item in _split_top(body):
            if ".{" in item:
                name, inner = item.split(".{", 1)
                walk(f"{prefix}.{name}", inner[:-1])
            else:
                key, value = item.split(":", 1)
                out[f"{prefix}.{key}"] = _scalar(value)

    for line in block.strip().splitlines():
        prefix, body = line.split(".{", 1)
        walk(prefix, body[:-1])
    return out


def _get(obj, dotted):
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _leaves(node, prefix=""):
    out = {}
    for k, v in node.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _write(tmp_path, text, name="config.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _load_quiet(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(args)


# ---------------------------------------------------------------- defaults


def test_every_rllava_schema_key_has_rllava_default_or_a_listed_difference():
    expected = _parse_schema_block(RLLAVA_SCHEMA)
    assert len(expected) == 243
    cfg = PPOConfig()
    for key, rllava_default in expected.items():
        want = RLLAVA_DIFFERENCES.get(key, rllava_default)
        assert _get(cfg, key) == want, f"{key}: {_get(cfg, key)!r} != {want!r}"
    assert set(RLLAVA_DIFFERENCES) <= set(expected)
    assert cfg.critic is None
    assert cfg.reward.model == ModelConfig()  # RLLaVA: same keys and defaults as actor.model
    assert cfg.actor.model.torch_dtype is None and cfg.trainer.outputs_dir is None
    critic = CriticConfig()
    for key, value in RLLAVA_CRITIC.items():
        assert getattr(critic, key) == value, key


def test_rllava_only_keys_and_their_defaults():
    cfg = load_config([])
    assert cfg == PPOConfig()
    assert (cfg.trainer.seed, cfg.trainer.val_greedy, cfg.trainer.device) == (1, False, "auto")
    assert (cfg.ref.model_path, cfg.ref.log_prob_micro_batch_size) == (None, 16)
    assert cfg.data.max_samples == -1
    assert cfg.actor.optim.lr_scheduler_type == "constant"


# ---------------------------------------------------------------- RLLaVA's example config


def test_example_config_loads_every_key_with_its_value(tmp_path):
    path = _write(tmp_path, EXAMPLE_YAML)
    # Its fsdp offload switches are read by every train engine: no warning. Its vLLM keys are, with rollout.name
    # left at rllava's hf: one line says so.
    with pytest.warns(UserWarning) as record:
        cfg = load_config([f"config={path}"])
    assert [str(w.message) for w in record] == [
        "rollout.vllm.gpu_memory_utilization ignored: rollout.name=hf"]
    expected = _leaves(OmegaConf.to_container(OmegaConf.create(EXAMPLE_YAML)))
    assert len(expected) == 74  # the 74 keys of rllava_example_config_keys.txt
    for key, value in expected.items():
        assert _get(cfg, key) == value, key
    assert cfg.actor.optim.lr == 1e-6 and cfg.rollout.val_override_config["temperature"] == 0.0
    assert cfg.trainer.save_freq == 20


def test_examples_config_is_rllavas_value_for_value():
    """A RLLaVA script says config=examples/config.yaml: what it does not set must mean what it meant there."""
    ours = _leaves(OmegaConf.to_container(OmegaConf.load(os.path.join(REPO, "examples", "config.yaml"))))
    assert ours == _leaves(OmegaConf.to_container(OmegaConf.create(EXAMPLE_YAML)))  # RLLaVA's file, as data
    with warnings.catch_warnings(record=True) as said:  # its vLLM keys are not the user's: no warning
        warnings.simplefilter("always")
        load_config(["config=" + os.path.join(REPO, "examples", "config.yaml")])
    assert [str(w.message) for w in said] == []


@pytest.mark.parametrize("args, message", [
    ("trainer.resume=none trainer.load_checkpoint_path=ck", "trainer.resume=none contradicts trainer.load_checkpoint_path=ck"),
    ("trainer.resume=a trainer.load_checkpoint_path=b", "trainer.resume=a and trainer.load_checkpoint_path=b name different"),
    ("trainer.save_limit=0", "trainer.save_limit=0 must be > 0 (or -1)"),
    ("trainer.samples_to_log=0", "trainer.samples_to_log=0 must be > 0"),
])
def test_checkpoint_key_conflicts(args, message):
    with pytest.raises(ConfigError) as err:
        _load_quiet(args.split())
    assert message in str(err.value)


# ---------------------------------------------------------------- argument forms


@pytest.mark.parametrize("form", ["config={}", "--config={}", "--config {}"])
def test_config_file_forms(tmp_path, form):
    path = _write(tmp_path, "rollout:\n  n: 3\n")
    cfg = load_config(form.format(path).split(" ") + ["rollout.temperature=0.5"])
    assert (cfg.rollout.n, cfg.rollout.temperature) == (3, 0.5)


def test_command_line_overrides_yaml_and_parses_values(tmp_path):
    path = _write(tmp_path, "actor:\n  optim:\n    lr: 1.0e-5\ntrainer:\n  logger: [console]\n")
    cfg = load_config([f"config={path}", "actor.optim.lr=1e-3", "trainer.logger=[console,jsonl]",
                       "data.train_files=x.jsonl", "trainer.max_steps=null", "data.val_batch_size=${data.seed}"])
    assert cfg.actor.optim.lr == 1e-3
    assert cfg.trainer.logger == ["console", "jsonl"]
    assert cfg.data.train_files == "x.jsonl" and cfg.trainer.max_steps is None
    assert cfg.data.val_batch_size == 1


def test_a_command_line_value_that_is_not_yaml_is_its_text():
    """RLLaVA's LUFFY scripts write `data.expert_template='{{ thinking }} {{ answer }}'`: a Jinja template, not
    YAML (a flow mapping that does not parse): the value is the text, and the other overrides still parse."""
    cfg = load_config(["config=examples/config.yaml", "actor.policy_loss.loss_mode=luffy",
                       "algorithm.prefix_strategy=random", "data.expert_template={{ thinking }} {{ answer }}", "data.target_key=solution",
                       "actor.optim.lr=3e-4", "trainer.logger=[console,jsonl]"])
    assert cfg.data.expert_template == "{{ thinking }} {{ answer }}"
    assert cfg.actor.optim.lr == 3e-4 and cfg.trainer.logger == ["console", "jsonl"]


def test_warnings_only_about_keys_the_user_set(tmp_path):
    """A key the run ignores is warned about when the user set it (command line, a config file of theirs), not
    when a base config of examples/ carries it (RLLaVA's base sets vLLM keys a run with rollout.name=hf never
    reads)."""
    base = os.path.join(REPO, "examples", "config.yaml")
    mine = _write(tmp_path, open(base).read())  # the same file, copied: the user's now
    with warnings.catch_warnings(record=True) as shipped:
        warnings.simplefilter("always")
        load_config([f"config={base}", "rollout.name=hf"])
    with warnings.catch_warnings(record=True) as copied:
        warnings.simplefilter("always")
        load_config([f"config={mine}", "rollout.name=hf"])
    with warnings.catch_warnings(record=True) as cli:
        warnings.simplefilter("always")
        load_config([f"config={base}", "rollout.name=hf", "rollout.vllm.gpu_memory_utilization=0.5"])
    assert [str(w.message) for w in shipped] == []
    assert any("rollout.vllm.gpu_memory_utilization ignored: rollout.name=hf" in str(w.message) for w in copied)
    assert [str(w.message) for w in cli] == ["rollout.vllm.gpu_memory_utilization ignored: rollout.name=hf"]


def test_a_tilde_in_a_path_key_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = _write(tmp_path, "data:\n  format_prompt: ~/t.jinja\n")
    cfg = load_config([f"config={path}", "trainer.outputs_dir=~/runs/x", "algorithm.plugins=[~/p.py]",
                       "actor.model.model_path=~/model", "data.prompt_key=~not_a_path"])
    assert cfg.trainer.outputs_dir == str(tmp_path / "runs" / "x") and cfg.algorithm.plugins == [str(tmp_path / "p.py")]
    assert cfg.actor.model.model_path == str(tmp_path / "model") and cfg.data.format_prompt == str(tmp_path / "t.jinja")
    assert cfg.data.prompt_key == "~not_a_path"  # not a path key: the text


@pytest.mark.parametrize("args, message", [
    (["--config"], "--config needs a file: --config examples/config.yaml"),
    (["rollout.n"], "command-line argument 'rollout.n' is not key=value (e.g. actor.optim.lr=1e-6) or config=FILE"),
    (["--rollout.n=2"], "command-line argument '--rollout.n=2' is not key=value"),
    (["config=a.yaml", "--config", "b.yaml"], "two config files given ('a.yaml' and 'b.yaml')"),
])
def test_bad_arguments(args, message):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(args)
    assert message in str(err.value)


def test_missing_file_bad_yaml_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config([f"config={tmp_path}/nope.yaml"])
    assert str(err.value) == f"config file '{tmp_path}/nope.yaml' not found (config={tmp_path}/nope.yaml)"
    bad = _write(tmp_path, "rollout:\n  n: [1,\n", "bad.yaml")
    with pytest.raises(ConfigError) as err:
        load_config([f"--config={bad}"])
    assert str(err.value).startswith(f"config file '{bad}' is not valid YAML: ")
    assert "line" in str(err.value)
    listed = _write(tmp_path, "- a\n- b\n", "list.yaml")
    with pytest.raises(ConfigError, match="must hold a mapping of sections"):
        load_config([f"config={listed}"])


# ---------------------------------------------------------------- unknown keys and wrong types


def test_unknown_key_in_yaml_names_file_and_suggests(tmp_path):
    path = _write(tmp_path, "actor:\n  optim:\n    lrr: 1.0e-3\n", "x.yaml")
    with pytest.raises(ConfigError) as err:
        load_config([f"config={path}"])
    assert str(err.value) == f"unknown config key 'actor.optim.lrr' (in {path}); did you mean 'actor.optim.lr'?"


@pytest.mark.parametrize("key, suggestion", [
    ("actor.optim.lrr", "actor.optim.lr"),  # typo in the last part
    ("actor.lr", "actor.optim.lr"),  # right name, wrong section
    ("rollout.max_prompt_length", "data.max_prompt_length"),
    ("actor.modle.model_path", "actor.model.model_path"),  # typo in a section name
    ("rollout.max_new_token", "rollout.max_new_tokens"),  # aliases are suggested too
    ("actor.optim.learning_rate", "actor.optim.lr"),  # other frameworks' names (loader.OTHER_NAMES)
    ("num_generations", "rollout.n"), ("trainer.beta", "actor.kl_loss_coef"),
    ("max_completion_length", "data.max_response_length"),
    ("trainer.foo", None),
])
def test_unknown_key_on_command_line(key, suggestion):
    with pytest.raises(ConfigError) as err:
        load_config([f"{key}=1"])
    message = f"unknown config key '{key}' (on the command line)"
    assert str(err.value) == message + (f"; did you mean '{suggestion}'?" if suggestion else "")


def test_all_unknown_keys_reported_at_once():
    with pytest.raises(ConfigError) as err:
        load_config(["actor.optim.lrr=1", "rollout.nn=2"])
    assert err.value.problems == [
        "unknown config key 'actor.optim.lrr' (on the command line); did you mean 'actor.optim.lr'?",
        "unknown config key 'rollout.nn' (on the command line); did you mean 'rollout.n'?",
    ]


@pytest.mark.parametrize("arg, message", [
    ("rollout.n=abc", "config key 'rollout.n' expects int, got 'abc' (on the command line)"),
    ("rollout.n=null", "config key 'rollout.n' expects int, got None (on the command line)"),
    ("trainer.max_steps=ten", "config key 'trainer.max_steps' expects int or null, got 'ten' (on the command line)"),
    ("trainer.logger=console", "config key 'trainer.logger' expects list[str], got 'console' (on the command line); "
                               "write a list, e.g. trainer.logger=[a,b]"),
    ("rollout.val_override_config=3", "config key 'rollout.val_override_config' expects a mapping, got 3"),
    ("actor=3", "config key 'actor' is a section; give its keys (actor.<key>=...), got 3 (on the command line)"),
])
def test_wrong_type(arg, message):
    with pytest.raises(ConfigError) as err:
        load_config([arg])
    assert str(err.value).startswith(message)


def test_wrong_type_in_yaml_names_file(tmp_path):
    path = _write(tmp_path, "rollout:\n  temperature: hot\n")
    with pytest.raises(ConfigError) as err:
        load_config([f"config={path}"])
    assert str(err.value) == f"config key 'rollout.temperature' expects float, got 'hot' (in {path})"


def test_dict_fields_accept_any_sub_keys(tmp_path):
    path = _write(tmp_path, "rollout:\n  val_override_config:\n    temperature: 0.0\n    n: 1\n")
    cfg = load_config([f"config={path}", "rollout.val_override_config.temperature=0.5",
                       "reward.reward_function_kwargs.format_weight=0.1", "reward.reward_function_kwargs.a.b=c",
                       "actor.model.override_config.rope_theta=1000"])
    assert cfg.rollout.val_override_config == {"temperature": 0.5, "n": 1}
    assert cfg.reward.reward_function_kwargs == {"format_weight": 0.1, "a": {"b": "c"}}
    assert cfg.actor.model.override_config == {"rope_theta": 1000}


def test_val_override_config_keys_must_be_rollout_keys():
    with pytest.raises(ConfigError) as err:
        load_config(["rollout.val_override_config.temprature=0"])
    assert str(err.value) == ("rollout.val_override_config.temprature is not a rollout key; "
                              "did you mean rollout.val_override_config.temperature?")


# ---------------------------------------------------------------- aliases


@pytest.mark.parametrize("alias, value, canonical", [
    ("rollout.engine", "hf", "rollout.name"),
    ("rollout.max_new_tokens", 64, "data.max_response_length"),
    ("algorithm.policy_loss_fn", "gspo", "actor.policy_loss.loss_mode"),
    ("trainer.total_steps", 7, "trainer.max_steps"),
    ("trainer.total_training_steps", 7, "trainer.max_steps"),
])
def test_alias_sets_canonical_key_from_cli_and_yaml(tmp_path, alias, value, canonical):
    assert ALIASES[alias] == canonical
    assert _get(load_config([f"{alias}={value}"]), canonical) == value
    section, name = alias.split(".")
    path = _write(tmp_path, f"{section}:\n  {name}: {value}\n")
    assert _get(load_config([f"config={path}"]), canonical) == value


def test_alias_conflicts(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(["trainer.total_steps=5", "trainer.max_steps=6"])
    assert str(err.value) == ("config keys 'trainer.total_steps' and 'trainer.max_steps' both set 'trainer.max_steps', "
                              "to 5 and 6 (on the command line); keep only 'trainer.max_steps'")
    path = _write(tmp_path, "trainer:\n  total_steps: 5\n  total_training_steps: 9\n")
    with pytest.raises(ConfigError) as err:
        load_config([f"config={path}"])
    assert "'trainer.total_steps' and 'trainer.total_training_steps'" in str(err.value)
    assert f"(in {path})" in str(err.value)
    # Equal values are no conflict; a command-line alias overriding the file's canonical key is no conflict.
    assert load_config(["trainer.total_steps=5", "trainer.max_steps=5"]).trainer.max_steps == 5
    path = _write(tmp_path, "trainer:\n  max_steps: 5\n")
    assert load_config([f"config={path}", "trainer.total_steps=8"]).trainer.max_steps == 8


# ---------------------------------------------------------------- not built yet, strategies, warnings


@pytest.mark.parametrize("arg, message", [
    ("actor.model.use_peft=true actor.model.lora_r=0", "actor.model.lora_r=0 must be"),
    ("actor.logprob_chunk_size=-2", "actor.logprob_chunk_size=-2 must be > 0 (or 0, -1)"),
    ("actor.ppo_max_token_len_per_gpu=0", "actor.ppo_max_token_len_per_gpu=0 must be > 0"),
    ("actor.model.ulysses_size=2 actor.model.shared_prefix=true",
     "actor.model.ulysses_size=2 runs sdpa or eager attention without the shared-prefix layout"),
    ("actor.model.ulysses_size=2 actor.model.attn_implementation=flash_attention_2",
     "actor.model.ulysses_size=2 runs sdpa or eager attention without the shared-prefix layout"),
    ("trainer.async_training=true", "trainer.async_training=true generates in processes of their own"),
    ("rollout.async_mode=true rollout.name=hf", "rollout.async_mode=true keeps a vLLM / SGLang engine awake"),
    ("actor.model.enable_activation_offload=true",
     "actor.model.enable_activation_offload=true offloads the activations that gradient checkpointing saves"),
    ("data.dataset_class=x.py:D", "data.dataset_class=x.py:D: rllava runs no dataset class of a file"),
    ("data.dataset_kwargs.k=v", "data.dataset_kwargs is read only by data.dataset_class; leave it at null"),
    ("rollout.partial_rollout_tokens=4", "rollout.partial_rollout_tokens=4 is for rollout.partial_rollout=true"),
    ("actor.strategy=deepspeed actor.deepspeed.zero_stage=4",
     "actor.deepspeed.zero_stage=4 is not one of: 1, 2, 3"),
    ("rollout.name=vlm", "rollout.name=vlm is not one of: hf, vllm, sglang; did you mean rollout.name=vllm?"),
])
def test_not_built_yet(arg, message):
    with pytest.raises(ConfigError) as err:
        _load_quiet(arg.split())
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("arg, name", [("rollout.name=vllm", "vllm"), ("rollout.engine=sglang", "sglang")])
def test_rollout_engines_are_accepted(arg, name):
    """Valid names: whether the package is installed is checked when the engine is built (one-line error)."""
    assert _load_quiet([arg]).rollout.name == name


def test_not_built_yet_list_is_checked_by_the_tests_above():
    assert len(NOT_BUILT_YET) == 0  # one parametrized case above per entry (and data.dataset_class, read by name)


def test_ulysses_turns_the_shared_prefix_default_off():
    """actor.model.ulysses_size > 1 (sequence parallelism) runs without the shared-prefix layout unless asked."""
    assert _load_quiet([]).actor.model.use_shared_prefix
    assert not _load_quiet(["actor.model.ulysses_size=2"]).actor.model.use_shared_prefix


def test_critic_null_loads(tmp_path):
    path = _write(tmp_path, "critic: null\n")
    assert load_config([f"config={path}"]).critic is None


def test_unknown_strategy_lists_choices():
    with pytest.raises(ConfigError) as err:
        load_config(["actor.strategy=singel"])
    assert str(err.value) == ("actor.strategy=singel is not one of: auto, single, fsdp, fsdp2, deepspeed, accelerate; "
                              "did you mean actor.strategy=single?")


def test_fsdp_keys_warn_under_single_strategy():
    with pytest.warns(UserWarning) as record:
        load_config(["actor.strategy=single", "actor.fsdp.reshard_after_forward=false",
                     "actor.deepspeed.zero_stage=2", "actor.fsdp.offload_params=true"])  # offload: every engine's
    assert [str(w.message) for w in record] == [
        "actor.fsdp.reshard_after_forward, actor.deepspeed.zero_stage ignored: actor.strategy=single"]
    with pytest.warns(UserWarning, match="actor.deepspeed.zero_stage ignored: actor.strategy=auto"):
        load_config(["actor.deepspeed.zero_stage=2"])  # auto on one process = single
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config([])  # defaults: no warning


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("args, message", [
    (["rollout.top_p=1.5"], "rollout.top_p=1.5 must be in (0, 1]; 1.0 turns nucleus sampling off"),
    (["rollout.top_p=0"], "rollout.top_p=0.0 must be in (0, 1]"),
    (["rollout.temperature=-0.1"], "rollout.temperature=-0.1 must be >= 0 (0 = greedy)"),
    (["rollout.n=0"], "rollout.n=0 must be > 0"),
    (["actor.ppo_mini_batch_size=0"], "actor.ppo_mini_batch_size=0 must be > 0"),
    (["data.train_batch_size=10", "actor.ppo_mini_batch_size=4"],
     "data.train_batch_size=10 must be a multiple of actor.ppo_mini_batch_size=4 (both count prompts)"),
    (["actor.loss_agg_mode=token_mean"],
     "actor.loss_agg_mode=token_mean is not one of: token-mean, seq-mean-token-sum, seq-mean-token-mean, "
     "seq-mean-token-sum-norm; did you mean actor.loss_agg_mode=token-mean?"),
    (["algorithm.kl_penalty=low-var-kl"], "algorithm.kl_penalty=low-var-kl is not one of: kl, k1, abs, mse, k2, "
                                          "low_var_kl, k3, full; did you mean algorithm.kl_penalty=low_var_kl?"),
    (["actor.kl_loss_type=k4"], "actor.kl_loss_type=k4 is not one of: kl, k1, abs, mse, k2, low_var_kl, k3, full"),
    (["trainer.logger=[console,clearml]"],
     "trainer.logger contains clearml, which is not one of: console, jsonl, tensorboard, wandb, mlflow, swanlab, "
     "trackio"),
    (["actor.checkpoint.save_contents=[model,optimiser]"],
     "actor.checkpoint.save_contents contains optimiser, which is not one of: model, optimizer, extra, hf_model; "
     "did you mean optimizer?"),
    (["reward.reward_type=batched"], "reward.reward_type=batched is not one of: auto, batch, sequential; "
                                     "did you mean reward.reward_type=batch?"),
    (["actor.optim.lr_scheduler_type=cosin"], "actor.optim.lr_scheduler_type=cosin is not one of: constant, linear, "
                                              "cosine, constant_with_warmup; did you mean"),
    (["actor.optim.warmup_style=cosine"], "actor.optim.warmup_style=cosine is RLLaVA's deprecated name; "
                                          "set actor.optim.lr_scheduler_type=cosine instead"),
    (["trainer.device=gpu"], "trainer.device=gpu is not one of: auto, cpu, cuda; for a GPU set trainer.device=cuda"),
    (["actor.model.torch_dtype=bf16"], "actor.model.torch_dtype=bf16 is not one of: float32, bfloat16, float16"),
    (["rollout.prompt_length=100"], "rollout.prompt_length=100 is read from data.max_prompt_length=512 in rllava; "
                                    "set data.max_prompt_length instead"),
    (["reward.reward_function_name=fn"], "reward.reward_function_name=fn is derived in rllava; "
                                         "set reward.reward_function=path/file.py:fn instead"),
])
def test_validation_errors(args, message):
    with pytest.raises(ConfigError) as err:
        load_config(args)
    assert str(err.value).startswith(message)


def test_validation_reports_all_problems_and_is_a_value_error():
    with pytest.raises(ValueError) as err:
        load_config(["rollout.top_p=1.5", "rollout.n=0"])
    assert isinstance(err.value, ConfigError)
    assert str(err.value) == ("2 config problems:\n"
                              "  - rollout.n=0 must be > 0\n"
                              "  - rollout.top_p=1.5 must be in (0, 1]; 1.0 turns nucleus sampling off")


def test_derived_rollout_key_equal_to_its_owner_is_accepted():
    cfg = load_config(["rollout.prompt_length=512", "rollout.min_pixels=3136", "rollout.adv_estimator=grpo"])
    assert cfg.rollout.prompt_length == 512


def test_direct_construction_is_validated():
    with pytest.raises(ConfigError, match=r"rollout.top_p=2.0 must be in \(0, 1\]"):
        PPOConfig(rollout=RolloutConfig(top_p=2.0))


# ---------------------------------------------------------------- saving the resolved config


def test_config_to_yaml_round_trips(tmp_path):
    cfg = load_config(["actor.optim.lr=3e-4", "rollout.n=4", "trainer.logger=[console]",
                       "rollout.val_override_config.temperature=0.0", "reward.reward_function_kwargs.k=v"])
    text = config_to_yaml(cfg)
    assert "critic: null" in text and "lr: 0.0003" in text
    path = _write(tmp_path, text, "resolved.yaml")
    assert load_config([f"config={path}"]) == cfg


def test_a_runs_config_yaml_writes_the_values_that_ran(tmp_path):
    """Where RLLaVA's config fills a key from others (the checkpoint folder, the tokenizer, the rollout's lengths),
    a run's config.yaml writes the value that ran, not None / -1 (issue 49); read back with other keys, the filled
    values follow those keys."""
    cfg = load_config(["actor.model.model_path=/m", "data.max_prompt_length=128", "trainer.outputs_dir=/o"])
    path = _write(tmp_path, config_to_yaml(cfg, ran=True), "resolved.yaml")
    ran = OmegaConf.load(path)
    assert (ran.trainer.save_checkpoint_path, ran.actor.model.tokenizer_path, ran.rollout.prompt_length,
            ran.rollout.response_length) == ("/o/rllava/agent/checkpoints", "/m", 128, 512)
    assert load_config([f"config={path}"]) == cfg
    moved = load_config([f"config={path}", "actor.model.model_path=/n", "data.max_prompt_length=64",
                         "trainer.experiment_name=other"])
    assert moved == load_config(["actor.model.model_path=/n", "data.max_prompt_length=64", "trainer.outputs_dir=/o",
                                 "trainer.experiment_name=other"])


def test_docs_config_md_is_generated_from_the_schema():
    """docs/config.md cannot drift: regenerate with `python -m rllava.commands.docs`."""
    from rllava.commands.docs import render_config as render

    path = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "config.md")
    with open(path) as f:
        assert f.read() == render(), "docs/config.md is stale: run python -m rllava.commands.docs"


def test_critic_from_the_command_line():
    cfg = _load_quiet(["critic.model.model_path=/m", "critic.cliprange_value=0.2"])
    assert cfg.critic.model.model_path == "/m" and cfg.critic.cliprange_value == 0.2 and cfg.critic.strategy == "auto"


def test_bare_key_on_the_command_line_is_the_empty_string_for_string_keys():
    """`data.val_files=` (no validation set) as RLLaVA's scripts write it; a number key stays an error."""
    assert _load_quiet(["data.val_files=", "data.train_files=x.jsonl"]).data.val_files == ""
    with pytest.raises(ConfigError, match="'actor.ppo_epochs' expects int, got None"):
        _load_quiet(["actor.ppo_epochs="])


def test_examples_config_grounding_is_rllavas_value_for_value():
    """RLLaVA's grounding and OVD scripts say config=examples/config_grounding.yaml: every key and value of RLLaVA's
    file (tests/config/rllava_scripts/config_grounding.txt, as data) is rllava's, and it loads without a word."""
    with open(os.path.join(os.path.dirname(__file__), "rllava_scripts", "config_grounding.txt")) as f:
        theirs = OmegaConf.from_dotlist([line.strip() for line in f if line.strip() and not line.startswith("#")])
    path = os.path.join(REPO, "examples", "config_grounding.yaml")
    ours = _leaves(OmegaConf.to_container(OmegaConf.load(path)))
    assert ours == _leaves(OmegaConf.to_container(theirs)) and len(ours) == 74
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        cfg = load_config([f"config={path}"])
    assert [str(w.message) for w in said] == []
    assert (cfg.actor.model.model_path, cfg.data.min_pixels, cfg.rollout.n, cfg.reward.skip_special_tokens) == (
        "Qwen/Qwen2-VL-2B-Instruct", 262144, 3, False)
