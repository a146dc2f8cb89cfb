"""The config schema: these dataclasses hold every key and its only default.

YAML files and dotted command-line arguments only override them (see `loader.py`). Key names and defaults
follow RLLaVA's `PPOConfig`; where rllava's default differs, the field comment says so and why.

Validation: each section checks its own fields in `check(prefix)`, which returns problem lines.
`PPOConfig.__post_init__` runs every section's check plus the cross-section rules, so any `PPOConfig` that
exists is valid, every error names its full dotted key, and all problems are reported at once.
Sections are not validated when built alone; call `section.check("rollout")` for that.

The file is long because it mirrors all ~220 of RLLaVA's keys, one commented line each.
"""

from __future__ import annotations

import difflib
import math
import os
import warnings
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Optional

from rllava.errors import ConfigError


# Names accepted by the validators below. Method names (adv_estimator, policy_loss.loss_mode) are not listed
# here: their registries own them and reject unknown names when the pipeline is built.
# RLLaVA's `fsdp` runs the FSDP2 engine; `auto` = `single` in one process, `fsdp2` under torchrun (WORLD_SIZE > 1)
ACTOR_STRATEGIES = ["auto", "single", "fsdp", "fsdp2", "deepspeed"]
ACTOR_STRATEGIES_PLANNED: list[str] = []
ROLLOUT_ENGINES = ["hf", "vllm", "sglang"]  # vllm / sglang: optional extras, pip install "rllava[vllm]"
ROLLOUT_ENGINES_PLANNED: list[str] = []
LOSS_AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KL_TYPES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"]  # "full": not built yet
KL_CTRL_TYPES = ["fixed", "adaptive"]
LOGGERS = ["console", "jsonl", "tensorboard", "wandb"]
REWARD_TYPES = ["auto", "batch", "sequential"]
LR_SCHEDULERS = ["constant", "linear", "cosine", "constant_with_warmup"]  # transformers.get_scheduler names
TORCH_DTYPES = ["float32", "bfloat16", "float16"]
CHECKPOINT_CONTENTS = ["model", "optimizer", "extra", "hf_model"]
DEVICES = ["auto", "cpu", "cuda"]
OPTIMIZERS = ["adamw"]  # actor/critic.optim.strategy: what rllava/train/builders.py builds


def _choice(problems: list[str], key: str, value: Any, choices: list, hint: str = "") -> None:
    """value in choices; otherwise the problem names the closest choice, or `hint` when given."""
    if value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"; {hint}" if hint else f"; did you mean {key}={close[0]}?" if close else ""
        problems.append(f"{key}={value} is not one of: {', '.join(map(str, choices))}{hint}")


def _each_choice(problems: list[str], key: str, items: list, choices: list) -> None:
    for item in items:
        if item not in choices:
            close = difflib.get_close_matches(str(item), [str(c) for c in choices], n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(f"{key} contains {item}, which is not one of: {', '.join(map(str, choices))}{hint}")


def _show(value: Any) -> str:
    """A value as the user would write it in YAML or on the command line."""
    if is_dataclass(value):
        return "{...}"
    if value is None or isinstance(value, bool):
        return {True: "true", False: "false", None: "null"}[value]
    return str(value)


def _available(problems: list[str], key: str, value: str, available: list[str], planned: list[str]) -> None:
    if value in planned:
        problems.append(f"{key}={value} is not available yet in rllava (supported: {', '.join(available)})")
    elif value not in available:
        _choice(problems, key, value, available + planned)


def _positive(problems: list[str], key: str, value: Any, *sentinels: Any) -> None:
    """value > 0, or one of the sentinels (e.g. -1 = 'all' / 'off')."""
    if value not in sentinels and not value > 0:
        also = f" (or {', '.join(map(_show, sentinels))})" if sentinels else ""
        problems.append(f"{key}={value} must be > 0{also}")


def _between(problems: list[str], key: str, value: Any, lo: float, hi: float) -> None:
    if value is not None and not lo <= value <= hi:
        problems.append(f"{key}={value} must be in [{lo}, {hi}]")


@dataclass
class DataConfig:
    train_files: str = ""  # training records: local .jsonl/.parquet/dir, or HF dataset "name@split"
    val_files: str = ""  # validation records, same forms; "" = no validation set
    train_image_dir: Optional[str] = None  # root for relative image paths in train records
    val_image_dir: Optional[str] = None  # root for relative image paths in val records
    prompt_key: str = "prompt"  # record field holding the question text
    answer_key: str = "answer"  # record field holding the ground truth passed to the reward
    image_key: str = "images"  # record field holding image(s)
    video_key: str = "videos"  # record field holding video(s)
    video_fps: float = 2.0  # frames sampled per second of video
    video_max_frames: int = 768  # rllava: frames per video at most (Qwen's cap); longer videos are thinned evenly
    video_min_pixels: Optional[int] = None  # rllava: pixels per video frame at least; None = min_pixels (RLLaVA's)
    video_max_pixels: Optional[int] = None  # rllava: pixels per video frame at most; None = max_pixels (RLLaVA's)
    max_prompt_length: int = 512  # prompt tokens (image tokens included); longer prompts are filtered
    max_response_length: int = 512  # tokens generated per response (alias: rollout.max_new_tokens)
    train_batch_size: int = 512  # prompts per training step (each gets rollout.n responses)
    val_batch_size: int = -1  # prompts per validation batch; -1 = the whole validation set
    format_prompt: Optional[str] = None  # Jinja template file wrapping the prompt text
    override_chat_template: Optional[str] = None  # chat template string replacing the tokenizer's
    shuffle: bool = True  # reshuffle training records every epoch
    seed: int = 1  # data-order RNG seed
    min_pixels: Optional[int] = 3136  # images are resized to at least this many pixels
    max_pixels: Optional[int] = 4194304  # images are resized to at most this many pixels
    num_workers: int = 0  # rllava default (RLLaVA: 8): prompts are encoded in the training process; > 0 warns
    filter_overlong_prompts: bool = True  # drop records whose prompt exceeds max_prompt_length
    filter_overlong_prompts_workers: int = 16  # processes used for that filtering
    dataset_class: Optional[str] = None  # custom dataset "path/file.py:Class"; None = built-in
    dataset_kwargs: Optional[dict[str, Any]] = None  # keyword arguments for dataset_class
    max_samples: int = -1  # rllava: use only the first N records (quick runs); -1 = all
    target_key: Optional[str] = None  # rllava: record field with a reference response (SFT target, expert)

    def video_pixels(self) -> tuple[Optional[int], Optional[int]]:
        """(min, max) pixels of one video frame: video_min/max_pixels, each falling back to min/max_pixels."""
        return (self.video_min_pixels if self.video_min_pixels is not None else self.min_pixels,
                self.video_max_pixels if self.video_max_pixels is not None else self.max_pixels)

    def check(self, prefix: str = "data") -> list[str]:
        p: list[str] = []
        for name in ("max_prompt_length", "max_response_length", "train_batch_size", "video_fps",
                     "video_max_frames"):
            _positive(p, f"{prefix}.{name}", getattr(self, name))
        _positive(p, f"{prefix}.val_batch_size", self.val_batch_size, -1)
        _positive(p, f"{prefix}.max_samples", self.max_samples, -1)
        for name in ("min_pixels", "max_pixels", "video_min_pixels", "video_max_pixels"):
            _positive(p, f"{prefix}.{name}", getattr(self, name), None)
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            p.append(f"{prefix}.min_pixels={self.min_pixels} is above {prefix}.max_pixels={self.max_pixels}")
        video_min, video_max = self.video_pixels()
        if (self.video_min_pixels or self.video_max_pixels) and video_min and video_max and video_min > video_max:
            p.append(f"{prefix}.video_min_pixels={_show(self.video_min_pixels)} is above {prefix}.video_max_pixels="
                     f"{_show(self.video_max_pixels)} (null = {prefix}.min_pixels={self.min_pixels} / "
                     f"{prefix}.max_pixels={self.max_pixels})")
        if self.num_workers < 0:
            p.append(f"{prefix}.num_workers={self.num_workers} must be >= 0 (0 = load in the main process)")
        return p


@dataclass
class KLControlConfig:
    type: str = "fixed"  # KL-in-reward coefficient controller: fixed | adaptive
    kl_coef: float = 0.001  # (initial) KL coefficient when algorithm.use_kl_in_reward
    horizon: int = 10000  # adaptive controller horizon
    target_kl: float = 0.1  # adaptive controller target KL


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0  # discount factor (GAE)
    lam: float = 1.0  # GAE lambda
    adv_estimator: str = "grpo"  # advantage estimator, by registered name (gae, grpo, rloo, ...)
    norm_adv_by_std_in_grpo: bool = True  # False gives Dr.GRPO's advantage
    use_kl_loss: bool = True  # add actor.kl_loss_coef * KL(policy || ref) to the actor loss (builds a reference)
    kl_penalty: str = "kl"  # KL estimator used in the reward: kl|k1|abs|mse|k2|low_var_kl|k3|full
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_kl_in_reward: bool = False  # subtract a KL penalty from the token rewards
    online_filtering: bool = False  # DAPO: drop groups whose mean filter_key score is outside the band
    filter_key: str = "overall"  # reward score used for online filtering
    filter_low: float = 0.01  # keep groups with mean score > filter_low
    filter_high: float = 0.99  # keep groups with mean score < filter_high
    unify_strategy: str = "none"  # SFT+RL mixing: none | switch | soft
    switch_gate: int = 0  # "switch": steps before switching
    success_reward_threshold: float = 1.0  # score counted as a success by SFT+RL strategies
    prefix_strategy: str = "none"  # expert-prefix strategy: none | random | hint
    min_prefix_ratio: float = 0.0  # shortest expert prefix, as a fraction of the expert response
    max_prefix_ratio: float = 1.0  # longest expert prefix, as a fraction of the expert response
    n_prefix: int = -1  # responses per group that get a prefix; -1 = all
    prefix_share_across_samples: bool = False  # one prefix length for the whole group
    hint_steps: int = 0  # UFT: steps over which the hint shrinks to nothing
    hint_min_ratio: float = 0.0  # RLLaVA marks deprecated: hints use min/max_prefix_ratio
    hint_max_ratio: float = 1.0  # RLLaVA marks deprecated: hints use min/max_prefix_ratio
    plugins: list[str] = field(default_factory=list)  # rllava: user .py files that register estimators/losses
    # rllava: truncated importance sampling for the rollout-engine vs trainer log-prob mismatch, with any loss:
    # none | token | sequence (actor.tis_imp_ratio_cap > 0, RLLaVA's key, means token with that cap)
    rollout_is: str = "none"
    rollout_is_cap: float = 2.0  # truncation of the importance weight

    def check(self, prefix: str = "algorithm") -> list[str]:
        p: list[str] = []
        _between(p, f"{prefix}.gamma", self.gamma, 0.0, 1.0)
        _between(p, f"{prefix}.lam", self.lam, 0.0, 1.0)
        _choice(p, f"{prefix}.kl_penalty", self.kl_penalty, KL_TYPES)
        _choice(p, f"{prefix}.kl_ctrl.type", self.kl_ctrl.type, KL_CTRL_TYPES)
        if self.filter_low > self.filter_high:
            p.append(f"{prefix}.filter_low={self.filter_low} is above {prefix}.filter_high={self.filter_high}")
        _choice(p, f"{prefix}.rollout_is", self.rollout_is, ["none", "token", "sequence"])
        _positive(p, f"{prefix}.rollout_is_cap", self.rollout_is_cap)
        _choice(p, f"{prefix}.unify_strategy", self.unify_strategy, ["none", "switch", "soft"])
        _choice(p, f"{prefix}.prefix_strategy", self.prefix_strategy, ["none", "random", "hint"])
        _between(p, f"{prefix}.min_prefix_ratio", self.min_prefix_ratio, 0.0, 1.0)
        _between(p, f"{prefix}.max_prefix_ratio", self.max_prefix_ratio, 0.0, 1.0)
        if self.min_prefix_ratio > self.max_prefix_ratio:
            p.append(f"{prefix}.min_prefix_ratio={self.min_prefix_ratio} is above "
                     f"{prefix}.max_prefix_ratio={self.max_prefix_ratio}")
        return p


@dataclass
class ModelConfig:
    model_path: Optional[str] = None  # HF hub id or local directory
    tokenizer_path: Optional[str] = None  # None = model_path
    torch_dtype: Optional[str] = None  # rllava: None = float32 on CPU, bfloat16 on CUDA (chosen by the builder)
    tie_word_embeddings: bool = False  # tie input and output embeddings
    attn_implementation: Optional[str] = "sdpa"  # rllava default (RLLaVA: flash_attention_2, GPU-only)
    override_config: dict[str, Any] = field(default_factory=dict)  # overrides of the HF model config
    enable_gradient_checkpointing: bool = False  # rllava default (RLLaVA: True); trades compute for memory
    enable_activation_offload: bool = False  # checkpointed activations kept in host memory (needs gradient checkpointing)
    trust_remote_code: bool = False  # rllava default (RLLaVA: True): run hub code only when asked
    freeze_vision_tower: bool = False  # do not train the vision encoder
    freeze_connector: bool = False  # rllava: do not train the vision-to-LLM connector (modular VLM; Qwen-VL: merger)
    freeze_llm: bool = False  # rllava: do not train the language model (decoder, embeddings, LM head)
    padding_free: bool = False  # rllava default (RLLaVA: True): run each micro-batch packed, without pad tokens
    dynamic_batching: bool = False  # rllava default (RLLaVA: True): micro-batches by *_max_token_len_per_gpu tokens
    ulysses_size: int = 1  # sequence-parallel degree
    use_peft: bool = False  # train LoRA adapters instead of all weights
    lora_task_type: str = "CAUSAL_LM"  # peft task type
    lora_r: int = 128  # LoRA rank
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj", "k_proj", "o_proj"])
    lora_alpha: int = 256  # LoRA scaling numerator
    lora_dropout: float = 0.05  # LoRA dropout
    lora_use_rslora: bool = False  # rank-stabilised LoRA scaling
    lora_weight_path: str = ""  # adapter weights to start from; "" = fresh adapters
    lora_bias: str = "none"  # peft bias mode: none | all | lora_only
    use_rslora: bool = False  # RLLaVA keeps this twin of lora_use_rslora
    lora_modules_to_save: Optional[list[str]] = None  # modules trained fully next to the adapters

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        if self.torch_dtype is not None:
            _choice(p, f"{prefix}.torch_dtype", self.torch_dtype, TORCH_DTYPES)
        _positive(p, f"{prefix}.ulysses_size", self.ulysses_size)
        if self.freeze_vision_tower and self.freeze_connector and self.freeze_llm and not self.use_peft:
            p.append(f"{prefix}.freeze_vision_tower, freeze_connector and freeze_llm are all true: nothing is left "
                     "to train; unfreeze one part (or set use_peft=true to train adapters)")
        if self.enable_activation_offload and not self.enable_gradient_checkpointing:
            p.append(f"{prefix}.enable_activation_offload=true offloads the activations that gradient checkpointing "
                     f"saves: set {prefix}.enable_gradient_checkpointing=true too")
        if self.use_peft:
            _positive(p, f"{prefix}.lora_r", self.lora_r)
            _choice(p, f"{prefix}.lora_bias", self.lora_bias, ["none", "all", "lora_only"])
            if not self.lora_target_modules and not self.lora_weight_path:
                p.append(f"{prefix}.lora_target_modules is empty: name the linear layers to adapt, e.g. [q_proj,v_proj]")
        return p


@dataclass
class OptimConfig:
    lr: float = 1e-6  # peak learning rate
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam betas (RLLaVA: a tuple)
    weight_decay: float = 1e-2  # decoupled weight decay
    strategy: str = "adamw"  # optimizer name
    lr_warmup_ratio: float = 0.0  # warmup steps as a fraction of training steps
    lr_warmup_steps: Optional[int] = None  # warmup steps; overrides lr_warmup_ratio when set
    lr_scheduler_type: str = "constant"  # constant|linear|cosine|constant_with_warmup
    min_lr_ratio: Optional[float] = None  # cosine floor as a fraction of lr
    num_cycles: float = 0.5  # cosine cycles over training
    warmup_style: str = "constant"  # RLLaVA's deprecated name for lr_scheduler_type; must stay "constant"
    training_steps: int = -1  # set by the trainer from trainer.max_steps / epochs; -1 = not yet known

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        _positive(p, f"{prefix}.lr", self.lr)
        if not math.isfinite(self.lr):
            p.append(f"{prefix}.lr={self.lr} must be a finite number, e.g. 1e-6")
        _choice(p, f"{prefix}.strategy", self.strategy, OPTIMIZERS)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            p.append(f"{prefix}.betas={self.betas} must be two numbers in [0, 1), e.g. [0.9,0.999]")
        if self.weight_decay < 0:
            p.append(f"{prefix}.weight_decay={self.weight_decay} must be >= 0")
        _between(p, f"{prefix}.lr_warmup_ratio", self.lr_warmup_ratio, 0.0, 1.0)
        if self.lr_warmup_steps is not None and self.lr_warmup_steps < 0:
            p.append(f"{prefix}.lr_warmup_steps={self.lr_warmup_steps} must be >= 0 (or null)")
        _choice(p, f"{prefix}.lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULERS)
        _between(p, f"{prefix}.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        if self.warmup_style != "constant":
            p.append(f"{prefix}.warmup_style={self.warmup_style} is RLLaVA's deprecated name; "
                     f"set {prefix}.lr_scheduler_type={self.warmup_style} instead")
        return p


@dataclass
class FSDPConfig:  # used when actor.strategy is fsdp/fsdp2; the three offload switches by every engine
    wrap_policy: dict[str, Any] = field(default_factory=dict)  # FSDP auto-wrap policy
    enable_cpu_offload: bool = False  # optimizer on CPU over fp32 master weights; device keeps params + grads (any engine)
    use_orig_params: bool = False  # FSDP1 use_orig_params
    torch_dtype: Optional[str] = None  # parameter dtype under FSDP
    offload_params: bool = False  # params and grads on CPU while a rollout engine with its own weights runs (any engine)
    offload_optimizer: bool = False  # optimizer state on CPU outside the update stage (any engine)
    reshard_after_forward: bool = True  # free gathered params after forward
    forward_prefetch: bool = False  # prefetch next all-gather during forward
    fsdp_size: int = -1  # shard group size; -1 = world size
    ulysses_size: int = 1  # sequence-parallel degree
    mixed_precision: Optional[dict[str, Any]] = None  # param/reduce/buffer dtypes


@dataclass
class DeepSpeedConfig:  # used only when actor.strategy=deepspeed (rllava/engine/train/deepspeed.py)
    zero_stage: int = 3  # ZeRO stage: 1 optimizer state, 2 + gradients, 3 + parameters sharded
    enable_cpu_offload: bool = True  # ZeRO-Offload: fp32 masters and Adam (DeepSpeedCPUAdam) on the CPU
    torch_dtype: str = "bf16"  # training dtype: bf16 | fp16 | fp32 (bf16/fp16: fp32 masters in the optimizer)
    contiguous_gradients: bool = True  # DeepSpeed contiguous_gradients
    overlap_comm: bool = True  # DeepSpeed overlap_comm
    reduce_scatter: bool = True  # DeepSpeed reduce_scatter
    stage3_prefetch_bucket_size: float = 1e8  # ZeRO-3 prefetch bucket (elements)
    stage3_param_persistence_threshold: float = 1e5  # ZeRO-3 params below this stay gathered

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        _choice(p, f"{prefix}.zero_stage", self.zero_stage, [1, 2, 3])
        _choice(p, f"{prefix}.torch_dtype", self.torch_dtype, ["bf16", "fp16", "fp32"])
        return p


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # policy loss, by registered name (alias: algorithm.policy_loss_fn)
    clip_cov_ratio: float = 0.0002  # clip_cov: fraction of tokens clipped
    clip_cov_lb: float = 1.0  # clip_cov: lower covariance bound
    clip_cov_ub: float = 5.0  # clip_cov: upper covariance bound
    kl_cov_ratio: float = 0.0002  # kl_cov: fraction of tokens with the KL penalty
    ppo_kl_coef: float = 0.1  # kl_cov: KL penalty coefficient
    cispo_clip_ratio_low: float = 1.0  # rllava, cispo: IS weight floor 1 - this (1.0 = no floor, as the paper)
    cispo_clip_ratio_high: float = 0.28  # rllava, cispo: IS weight cap 1 + this


@dataclass
class CheckpointConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])  # + hf_model
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])  # on resume
    async_save: bool = False  # save in a background thread (not available yet: saves are synchronous)

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        for name in ("save_contents", "load_contents"):
            _each_choice(p, f"{prefix}.{name}", getattr(self, name), CHECKPOINT_CONTENTS)
        return p


@dataclass
class ActorConfig:
    strategy: str = "auto"  # auto (one process: single; torchrun: fsdp2) | single | fsdp/fsdp2 | deepspeed (docs/engines.md)
    ppo_mini_batch_size: int = 256  # prompts per optimizer step (x rollout.n responses)
    ppo_micro_batch_size: int = 4  # sequences per forward/backward (gradient accumulation unit)
    log_prob_micro_batch_size: int = 16  # sequences per forward when computing old log-probs
    # Token budgets replace the two micro-batch sizes with model.dynamic_batching. A micro-batch's tokens are
    # rows x its longest row, or with model.padding_free the sum of its rows' lengths; a row over the budget
    # runs alone. The no-grad pass keeps no activations for a backward, so it can take more.
    ppo_max_token_len_per_gpu: int = 16384  # verl: tokens per forward/backward when model.dynamic_batching
    log_prob_max_token_len_per_gpu: int = 32768  # verl: tokens per old-log-prob forward when model.dynamic_batching
    # Only one chunk's [tokens x vocab] logits is alive at a time (1024 x 152k vocab: 0.6 GB in fp32): with grad
    # each chunk is recomputed in the backward (activation checkpointing of the LM head, log-softmax, entropy).
    logprob_chunk_size: int = 512  # rllava: trained tokens per LM-head chunk; 0 or -1 = all at once (full logits)
    max_grad_norm: float = 1.0  # clip the gradient norm to this
    skip_grad_norm: float = 80.0  # skip the optimizer step when the pre-clip grad norm exceeds this
    clip_ratio: float = 0.2  # symmetric clip epsilon: drives clip_ratio_low/high where those are left at 0.2
    clip_ratio_low: float = 0.2  # lower clip epsilon (DAPO clip-higher uses low != high)
    clip_ratio_high: float = 0.2  # upper clip epsilon
    clip_ratio_c: float = 3.0  # dual-clip constant C, applied where advantage < 0
    clip_upper_bound: float = 1.0  # upper bound used by some SFT+RL losses
    loss_agg_mode: str = "token-mean"  # token-mean|seq-mean-token-sum|seq-mean-token-mean|seq-mean-token-sum-norm
    entropy_coeff: float = 0.0  # entropy bonus coefficient
    tis_imp_ratio_cap: float = -1.0  # truncated importance sampling cap (rollout vs train); -1 = off
    ppo_epochs: int = 1  # passes over each rollout batch
    use_torch_compile: bool = False  # rllava default (RLLaVA: True): rllava runs eager; true warns at start-up
    model: ModelConfig = field(default_factory=ModelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    kl_loss_coef: float = 0.01  # KL loss coefficient when algorithm.use_kl_loss
    kl_loss_type: str = "low_var_kl"  # KL estimator in the loss: kl|k1|abs|mse|k2|low_var_kl|k3|full
    # SFT+RL hybrid losses (LUFFY, SRFT, HPT, CHORD); read only by those losses.
    loss_remove_clip: bool = False  # drop PPO clipping
    off_policy_reshape: str = "no_reshape"  # off-policy ratio shaping (LUFFY)
    off_policy_reshape_weight: float = 0.1  # shaping weight
    off_policy_reshape_pow_exp: float = 0.5  # shaping exponent
    off_policy_cliprange: float = 0.2  # clip range for off-policy tokens
    off_policy_normalize: bool = False  # normalise off-policy loss separately
    off_policy_max_clip: float = -1  # upper ratio clip for off-policy tokens; -1 = off
    off_policy_min_clip: float = -1  # lower ratio clip for off-policy tokens; -1 = off
    all_max_clip: float = -1  # ratio clip for all tokens; -1 = off
    on_policy_reshape: str = "no_reshape"  # on-policy ratio shaping
    on_policy_reshape_weight: float = 0.1  # shaping weight
    on_policy_reshape_pow_exp: float = 0.5  # shaping exponent
    srft_type: str = "paper"  # SRFT variant
    hpt_hint_loss_coef: float = 0.0  # HPT hint-token loss coefficient
    sft_loss_coef: float = 1.0  # weight of the SFT term in hybrid losses

    def check(self, prefix: str = "actor") -> list[str]:
        p: list[str] = []
        _available(p, f"{prefix}.strategy", self.strategy, ACTOR_STRATEGIES, ACTOR_STRATEGIES_PLANNED)
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size", "log_prob_micro_batch_size", "ppo_epochs",
                     "max_grad_norm", "ppo_max_token_len_per_gpu", "log_prob_max_token_len_per_gpu"):
            _positive(p, f"{prefix}.{name}", getattr(self, name))
        _positive(p, f"{prefix}.logprob_chunk_size", self.logprob_chunk_size, 0, -1)
        for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            if getattr(self, name) < 0:
                p.append(f"{prefix}.{name}={getattr(self, name)} must be >= 0")
        if self.clip_ratio_c <= 1:
            p.append(f"{prefix}.clip_ratio_c={self.clip_ratio_c} must be > 1 (dual-clip constant, e.g. 3.0)")
        _choice(p, f"{prefix}.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _choice(p, f"{prefix}.kl_loss_type", self.kl_loss_type, KL_TYPES)
        p += self.model.check(f"{prefix}.model")
        p += self.optim.check(f"{prefix}.optim")
        p += self.checkpoint.check(f"{prefix}.checkpoint")
        if self.strategy == "deepspeed":
            p += self.deepspeed.check(f"{prefix}.deepspeed")
        return p

    def ignored_keys(self, prefix: str = "actor") -> list[str]:
        """fsdp/deepspeed keys changed from their defaults although this strategy does not read them."""
        sections = {"single": ("fsdp", "deepspeed"), "deepspeed": ("fsdp",)}.get(self.strategy, ("deepspeed",))
        return [f"{prefix}.{s}.{f.name}" for s in sections for f in fields(getattr(self, s))
                if getattr(getattr(self, s), f.name) != getattr(type(getattr(self, s))(), f.name)
                and f"{s}.{f.name}" not in ENGINE_OFFLOAD_KEYS]


@dataclass
class RefConfig:  # rllava section: the frozen reference policy, built only when algorithm.use_kl_loss
    model_path: Optional[str] = None  # None = the actor's initial weights (actor.model.model_path)
    log_prob_micro_batch_size: int = 16  # sequences per forward when computing ref log-probs
    log_prob_max_token_len_per_gpu: int = 32768  # verl: tokens per ref forward with actor.model.dynamic_batching

    def check(self, prefix: str = "ref") -> list[str]:
        p: list[str] = []
        _positive(p, f"{prefix}.log_prob_micro_batch_size", self.log_prob_micro_batch_size)
        _positive(p, f"{prefix}.log_prob_max_token_len_per_gpu", self.log_prob_max_token_len_per_gpu)
        return p


@dataclass
class CriticConfig:  # PPO value model: the backbone of critic.model.model_path (default: the actor's) + a value head
    strategy: str = "auto"  # training strategy, as actor.strategy (auto: single, or fsdp2 under torchrun)
    ppo_mini_batch_size: int = 256  # prompts per critic optimizer step
    ppo_micro_batch_size: int = 4  # sequences per critic forward/backward
    log_prob_micro_batch_size: int = 16  # sequences per forward when computing values
    ppo_max_token_len_per_gpu: int = 32768  # verl: tokens per critic train micro-batch with model.dynamic_batching
    forward_max_token_len_per_gpu: int = 32768  # verl: tokens per value forward with model.dynamic_batching
    max_grad_norm: float = 1.0  # clip the critic gradient norm to this
    cliprange_value: float = 0.5  # value-loss clip range
    loss_avg_mode: str = "token"  # value-loss averaging: token | seq
    ppo_epochs: int = 1  # passes over each rollout batch
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)

    def check(self, prefix: str = "critic") -> list[str]:
        p: list[str] = []
        _available(p, f"{prefix}.strategy", self.strategy, ACTOR_STRATEGIES, ACTOR_STRATEGIES_PLANNED)
        if self.strategy == "deepspeed":
            p += self.deepspeed.check(f"{prefix}.deepspeed")
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size", "log_prob_micro_batch_size",
                     "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu", "ppo_epochs"):
            _positive(p, f"{prefix}.{name}", getattr(self, name))
        return p


@dataclass
class VLLMConfig:  # used only when rollout.name=vllm (rllava/engine/inference/vllm.py)
    model: str = ""  # filled from actor.model.model_path by the engine
    seed: Optional[int] = 1  # RLLaVA's; rllava seeds vLLM from rollout.seed
    skip_tokenizer_init: bool = False  # vLLM skip_tokenizer_init
    load_format: str = "auto"  # RLLaVA's; rllava reads rollout.load_format
    dtype: str = "float16"  # vLLM dtype (RLLaVA's fp16 rollout vs bf16 training is a known mismatch)
    pipeline_parallel_size: int = 1  # vLLM pipeline parallelism; must be 1 (vLLM runs in the training ranks)
    max_model_len: Optional[int] = None  # vLLM max_model_len; None = prompt + response length
    gpu_memory_utilization: float = 0.9  # fraction of GPU memory vLLM may take
    max_num_batched_tokens: int = 8192  # vLLM scheduler token budget
    disable_log_stats: bool = True  # vLLM disable_log_stats
    enforce_eager: bool = True  # no CUDA graphs
    enable_chunked_prefill: bool = False  # vLLM chunked prefill
    distributed_executor_backend: Optional[str] = None  # null or external_launcher (what rllava uses)
    tokenizer: Optional[str] = None  # vLLM tokenizer path
    chat_template: Optional[str] = None  # unused: vLLM gets token ids (see data.override_chat_template)


@dataclass
class SGLangConfig:  # used only when rollout.name=sglang (rllava/engine/inference/sglang.py)
    dtype: str = "bfloat16"  # SGLang dtype
    mem_fraction_static: Optional[float] = 0.6  # fraction of GPU memory SGLang may take
    tp_size: int = 1  # SGLang tensor parallelism (same as rollout.tensor_parallel_size; set one)
    skip_server_warmup: bool = False  # skip the server warmup request


@dataclass
class RolloutConfig:
    # rllava default "hf" (RLLaVA: vllm): HF generate on the training model; vllm/sglang hold their own copy.
    # Alias: rollout.engine.
    name: str = "hf"
    n: int = 1  # responses sampled per prompt (group size)
    temperature: float = 1.0  # sampling temperature; 0 = greedy
    top_p: float = 1.0  # nucleus sampling mass, in (0, 1]
    top_k: int = -1  # top-k sampling; -1 = off
    tensor_parallel_size: int = 1  # inference-engine tensor parallelism
    seed: Optional[int] = 1  # sampling seed; null = random (RLLaVA also took the strings "none"/"null")
    limit_images: int = 0  # max images per prompt for the engine; 0 = no limit
    ignore_eos: bool = False  # keep generating past EOS
    disable_tqdm: bool = False  # hide the generation progress bar
    micro_batch_size: int = 2  # prompts per generate call
    val_override_config: dict[str, Any] = field(default_factory=dict)  # rollout.* keys changed for validation
    partial_rollout: bool = False  # resume unfinished generations next step (SGLang)
    async_mode: bool = False  # generate asynchronously from training
    bucket_size: int = 512  # MB per weight-sync bucket to the engine
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    load_format: str = "dummy"  # engine weight init before the first sync
    max_turns: int = 10  # agent rollouts: max model turns per episode
    discount: float = 0.9  # agent rollouts: per-turn discount
    tool_config_path: Optional[str] = None  # agent rollouts: tool definitions file
    env_config_path: Optional[str] = None  # agent rollouts: environment config file
    # RLLaVA copies the next keys from their owners in post_init; rllava reads the owners instead
    # (see DERIVED_KEYS). They are accepted when left alone or equal to the owner's value.
    prompt_length: int = -1  # = data.max_prompt_length
    response_length: int = -1  # = data.max_response_length
    trust_remote_code: bool = True  # = actor.model.trust_remote_code
    adv_estimator: str = "grpo"  # = algorithm.adv_estimator
    min_pixels: Optional[int] = None  # = data.min_pixels
    max_pixels: Optional[int] = None  # = data.max_pixels
    video_fps: float = 2.0  # = data.video_fps

    def check(self, prefix: str = "rollout") -> list[str]:
        p: list[str] = []
        _available(p, f"{prefix}.name", self.name, ROLLOUT_ENGINES, ROLLOUT_ENGINES_PLANNED)
        _positive(p, f"{prefix}.n", self.n)
        _positive(p, f"{prefix}.micro_batch_size", self.micro_batch_size)
        if self.temperature < 0:
            p.append(f"{prefix}.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            p.append(f"{prefix}.top_p={self.top_p} must be in (0, 1]; 1.0 turns nucleus sampling off")
        if self.top_k != -1 and self.top_k <= 0:
            p.append(f"{prefix}.top_k={self.top_k} must be > 0, or -1 to turn top-k off")
        if self.limit_images < 0:
            p.append(f"{prefix}.limit_images={self.limit_images} must be >= 0 (0 = no limit)")
        sampling = ["n", "temperature", "top_p", "top_k"]  # what validation sampling reads (builders.sampling_params)
        for key, value in self.val_override_config.items():
            if key not in sampling:
                close = difflib.get_close_matches(str(key), sampling, n=1)
                hint = f"; did you mean {prefix}.val_override_config.{close[0]}?" if close else ""
                p.append(f"{prefix}.val_override_config.{key} is not a sampling key ({', '.join(sampling)}){hint}")
            elif not isinstance(value, (int, float)) or isinstance(value, bool):
                p.append(f"{prefix}.val_override_config.{key}={_show(value)} must be a number")
            else:  # the same rules as the training values
                p += [q.replace(f"{prefix}.{key}=", f"{prefix}.val_override_config.{key}=")
                      for q in RolloutConfig(**{key: value}).check(prefix) if q.startswith(f"{prefix}.{key}=")]
        return p


@dataclass
class OverlongBufferConfig:  # verl's names
    enable: bool = False  # DAPO soft overlong punishment of training rewards
    len: int = 0  # tokens before data.max_response_length where the penalty starts
    penalty_factor: float = 1.0  # penalty at the full length


@dataclass
class RewardConfig:
    reward_type: str = "auto"  # rllava default (RLLaVA: batch): auto|batch|sequential; auto = from the function
    reward_function: Optional[str] = None  # "path/file.py:fn" (":fn" omitted = main)
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments for fn
    skip_special_tokens: bool = True  # decode responses without special tokens before scoring
    num_cpus: int = 1  # 1 = score in this process; N > 1 = a pool of N worker processes (hung workers are killed)
    timeout: Optional[float] = 60.0  # rllava: seconds per reward call (a batch reward: per batch); null = no limit
    on_error: str = "raise"  # rllava: a call that raises/times out/returns a non-number: raise | zero (score 0, counted)
    reward_function_name: Optional[str] = None  # RLLaVA fills it from reward_function; must stay null
    model: ModelConfig = field(default_factory=ModelConfig)  # reward model (not used by rule rewards)
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # rllava (verl's keys)

    def check(self, prefix: str = "reward") -> list[str]:
        p: list[str] = []
        _choice(p, f"{prefix}.reward_type", self.reward_type, REWARD_TYPES)
        _positive(p, f"{prefix}.num_cpus", self.num_cpus)
        _positive(p, f"{prefix}.timeout", self.timeout, None)
        _choice(p, f"{prefix}.on_error", self.on_error, ["raise", "zero"])
        if self.overlong_buffer.enable and self.overlong_buffer.len <= 0:
            p.append(f"{prefix}.overlong_buffer.len={self.overlong_buffer.len} must be > 0 when "
                     f"{prefix}.overlong_buffer.enable=true")
        if self.reward_function_name is not None:
            p.append(f"{prefix}.reward_function_name={self.reward_function_name} is derived in rllava; "
                     f"set {prefix}.reward_function=path/file.py:{self.reward_function_name} instead")
        p += self.model.check(f"{prefix}.model")
        return p


@dataclass
class TrainerConfig:
    total_epochs: int = 15  # passes over the training data (unless max_steps is set)
    max_steps: Optional[int] = None  # training steps; overrides total_epochs (aliases: total_steps, ...)
    project_name: str = "rllava"  # logger project name
    experiment_name: str = "agent"  # logger run name
    # console|jsonl|tensorboard|wandb. rllava default (RLLaVA: console, tensorboard) needs no extra package.
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])
    nnodes: int = 1  # nodes (multi-process strategies)
    n_gpus_per_node: int = 8  # GPUs per node (multi-process strategies)
    max_try_make_batch: int = 20  # online filtering: max generation rounds per batch; -1 = no limit
    critic_warmup: int = 0  # steps training only the critic
    val_freq: int = -1  # validate every N steps; -1 = never (except val_before_train)
    val_before_train: bool = True  # validate once before the first step
    val_only: bool = False  # validate, then exit
    val_generations_to_log: int = 0  # validation samples written to the logger
    save_freq: int = -1  # checkpoint every N steps and at the last step (<dir>/global_step_N); -1 or 0 = never
    save_limit: int = -1  # checkpoints kept, the newest; -1 = all
    save_model_only: bool = False  # save weights only (no optimizer, LR schedule, RNG): resume is then not exact
    outputs_dir: Optional[str] = None  # rllava meaning: None = outputs/<experiment_name> (RLLaVA: project/exp)
    save_checkpoint_path: Optional[str] = None  # None = <outputs_dir>/checkpoints
    load_checkpoint_path: Optional[str] = None  # checkpoint to resume from (a global_step_N dir, or a dir of them)
    find_last_checkpoint: bool = True  # resume=auto: resume from the newest checkpoint in save_checkpoint_path
    resume: str = "auto"  # rllava: auto (load_checkpoint_path, else the newest saved: see README) | none | PATH
    overwrite: bool = False  # rllava: a new run into an outputs_dir holding another run's outputs deletes them first
    hf_merge_lora: bool = True  # rllava: LoRA in an HF export: merged into the weights (false: base + adapter/)
    samples_freq: int = 10  # rllava: write sample generations to <outputs_dir>/samples.jsonl every N steps; -1 = never
    samples_to_log: int = 4  # rllava: generations per write (prompt, images, response, reward)
    async_training: bool = False  # overlap rollout and training
    seed: int = 1  # rllava: model-init and sampling RNG seed
    val_greedy: bool = False  # rllava: also validate greedily, logged under val_greedy/
    device: str = "auto"  # rllava: auto | cpu | cuda (auto = cuda when available)

    def check(self, prefix: str = "trainer") -> list[str]:
        p: list[str] = []
        _positive(p, f"{prefix}.total_epochs", self.total_epochs)
        _positive(p, f"{prefix}.max_steps", self.max_steps, None)
        _each_choice(p, f"{prefix}.logger", self.logger, LOGGERS)
        if len(set(self.logger)) != len(self.logger):
            p.append(f"{prefix}.logger={self.logger} lists a logger twice")
        _choice(p, f"{prefix}.device", self.device, DEVICES, hint=f"for a GPU set {prefix}.device=cuda")
        if self.val_generations_to_log < 0:
            p.append(f"{prefix}.val_generations_to_log={self.val_generations_to_log} must be >= 0")
        _positive(p, f"{prefix}.save_freq", self.save_freq, -1, 0)
        _positive(p, f"{prefix}.save_limit", self.save_limit, -1)
        _positive(p, f"{prefix}.samples_freq", self.samples_freq, -1, 0)
        _positive(p, f"{prefix}.samples_to_log", self.samples_to_log)
        if self.resume == "none" and self.load_checkpoint_path:
            p.append(f"{prefix}.resume=none contradicts {prefix}.load_checkpoint_path={self.load_checkpoint_path}")
        if self.resume not in ("auto", "none") and self.load_checkpoint_path not in (None, self.resume):
            p.append(f"{prefix}.resume={self.resume} and {prefix}.load_checkpoint_path={self.load_checkpoint_path} "
                     "name different checkpoints: set one")
        return p


# Accepted for RLLaVA compatibility but not built yet: (key, is_turned_on, the value to set instead).
# Delete a line when its feature lands.
# RLLaVA's FSDP offload switches, read by every train engine (single device included).
ENGINE_OFFLOAD_KEYS = ("fsdp.enable_cpu_offload", "fsdp.offload_params", "fsdp.offload_optimizer")

NOT_BUILT_YET: list[tuple[str, Callable[[Any], bool], str]] = [
    ("actor.model.ulysses_size", lambda v: v > 1, "1"),
    ("algorithm.kl_penalty", lambda v: v == "full", "low_var_kl"),  # full-vocabulary KL
    ("actor.kl_loss_type", lambda v: v == "full", "low_var_kl"),
    ("trainer.async_training", lambda v: v, "false"),
    ("actor.checkpoint.async_save", lambda v: v, "false"),  # checkpoints are written synchronously
    ("rollout.async_mode", lambda v: v, "false"),
    ("actor.loss_remove_clip", lambda v: v, "false"),
    ("algorithm.unify_strategy", lambda v: v != "none", "none"),
    ("algorithm.prefix_strategy", lambda v: v != "none", "none"),
    ("algorithm.hint_steps", lambda v: v > 0, "0"),
    ("data.dataset_class", lambda v: v is not None, "null"),
    # multi-turn agents (rollout drivers beside roles/rollout.py): not built yet
    ("rollout.max_turns", lambda v: v != 10, "10"),
    ("rollout.discount", lambda v: v != 0.9, "0.9"),
    ("rollout.tool_config_path", lambda v: v is not None, "null"),
    ("rollout.env_config_path", lambda v: v is not None, "null"),
    ("rollout.partial_rollout", lambda v: v, "false"),
    ("rollout.ignore_eos", lambda v: v, "false"),
    # hybrid SFT+RL losses (LUFFY, SRFT, HPT, CHORD): not built yet
    *[(f"actor.{name}", (lambda d: lambda v: v != d)(default), _show(default)) for name, default in (
        ("off_policy_reshape", "no_reshape"), ("off_policy_reshape_weight", 0.1), ("off_policy_reshape_pow_exp", 0.5),
        ("off_policy_cliprange", 0.2), ("off_policy_normalize", False), ("off_policy_max_clip", -1),
        ("off_policy_min_clip", -1), ("all_max_clip", -1), ("on_policy_reshape", "no_reshape"),
        ("on_policy_reshape_weight", 0.1), ("on_policy_reshape_pow_exp", 0.5), ("srft_type", "paper"),
        ("hpt_hint_loss_coef", 0.0), ("sft_loss_coef", 1.0), ("clip_upper_bound", 1.0))],
    # the hybrid strategies' schedules (read only with unify_strategy / prefix_strategy, themselves not built yet)
    *[(f"algorithm.{name}", (lambda d: lambda v: v != d)(default), _show(default)) for name, default in (
        ("switch_gate", 0), ("success_reward_threshold", 1.0), ("min_prefix_ratio", 0.0), ("max_prefix_ratio", 1.0),
        ("n_prefix", -1), ("prefix_share_across_samples", False), ("hint_min_ratio", 0.0), ("hint_max_ratio", 1.0))],
    # FSDP layouts rllava does not build: it shards each decoder layer (the model's _no_split_modules) over all ranks
    ("actor.fsdp.ulysses_size", lambda v: v > 1, "1"),
    ("actor.fsdp.fsdp_size", lambda v: v != -1, "-1"),
    ("actor.fsdp.wrap_policy", lambda v: bool(v), "{}"),
]
# Keys with a better home in rllava: (key, is_set, the key to set instead).
MOVED_KEYS: list[tuple[str, Callable[[Any], bool], str]] = [
    ("actor.fsdp.torch_dtype", lambda v: v is not None, "actor.model.torch_dtype"),
]
# Keys that only tune an engine rllava does not run here: accepted with a one-line warning when set.
TUNING_KEYS: list[tuple[str, Callable[[Any], bool], str]] = [
    ("actor.use_torch_compile", lambda v: v, "rllava runs eager (torch.compile is not used)"),
    ("actor.fsdp.forward_prefetch", lambda v: v, "FSDP2 already prefetches the next layer's all-gather"),
    ("data.num_workers", lambda v: v > 0, "prompts are encoded in the training process, one at a time"),
]

# RLLaVA copies these values into rollout.* in post_init; rllava keeps one owner per value.
DERIVED_KEYS = {
    "rollout.prompt_length": "data.max_prompt_length",
    "rollout.response_length": "data.max_response_length",
    "rollout.trust_remote_code": "actor.model.trust_remote_code",
    "rollout.adv_estimator": "algorithm.adv_estimator",
    "rollout.min_pixels": "data.min_pixels",
    "rollout.max_pixels": "data.max_pixels",
    "rollout.video_fps": "data.video_fps",
}


def get_key(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


@dataclass
class PPOConfig:
    data: DataConfig = field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    critic: Optional[CriticConfig] = None  # PPO critic; null = none (GRPO-style estimators)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        for section in (self.actor, self.critic):  # `auto`: what works where the config is loaded
            if section is not None and section.strategy == "auto":
                section.strategy = "fsdp2" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "single"
        self.validate()

    def validate(self) -> None:
        """Raise one ConfigError listing every problem; warn about keys the chosen strategy ignores."""
        p: list[str] = []
        for name in ("data", "algorithm", "actor", "ref", "rollout", "reward", "trainer"):
            p += getattr(self, name).check(name)
        if self.critic is not None:
            p += self.critic.check("critic")
        if self.actor.ppo_mini_batch_size > 0 and self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            p.append(f"data.train_batch_size={self.data.train_batch_size} must be a multiple of "
                     f"actor.ppo_mini_batch_size={self.actor.ppo_mini_batch_size} (both count prompts)")
        p += self._derived_problems() + self._not_built_problems()
        if p:
            raise ConfigError(p)
        ignored = self.actor.ignored_keys("actor")
        if ignored:
            warnings.warn(f"{', '.join(ignored)} ignored: actor.strategy={self.actor.strategy}", stacklevel=2)
        for key, is_set, why in TUNING_KEYS:
            if is_set(get_key(self, key)):
                warnings.warn(f"{key}={_show(get_key(self, key))} ignored: {why}", stacklevel=2)

    def _derived_problems(self) -> list[str]:
        p = []
        for key, owner in DERIVED_KEYS.items():
            value, owner_value = get_key(self, key), get_key(self, owner)
            default = getattr(RolloutConfig(), key.split(".")[-1])
            if value != default and value != owner_value:
                p.append(f"{key}={_show(value)} is read from {owner}={_show(owner_value)} in rllava; "
                         f"set {owner} instead")
        return p

    def _not_built_problems(self) -> list[str]:
        p = []
        for key, is_on, off in NOT_BUILT_YET:
            value = get_key(self, key)
            if is_on(value):
                p.append(f"{key}={_show(value)} is not available yet in rllava; set {key}={off}")
        for key, is_set, instead in MOVED_KEYS:
            if is_set(get_key(self, key)):
                p.append(f"{key}={_show(get_key(self, key))} is not read in rllava; set {instead} instead")
        # reward models (a sequence-classification scorer or a judge) are not built yet: rule rewards only
        changed = [f.name for f in fields(ModelConfig) if getattr(self.reward.model, f.name) != getattr(ModelConfig(), f.name)]
        if changed:
            p.append(f"reward.model.{changed[0]} is set, but reward models are not available yet in rllava; "
                     "score with reward.reward_function=path/file.py:fn and leave reward.model.* unset")
        if self.critic is not None and self.critic.model.ulysses_size > 1:
            p.append(f"critic.model.ulysses_size={self.critic.model.ulysses_size} is not available yet in rllava; "
                     "set critic.model.ulysses_size=1")
        return p
