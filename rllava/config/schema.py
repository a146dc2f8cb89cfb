"""The config schema: these dataclasses hold every key (all ~220 of RLLaVA's, one commented line each) and its
only default, which YAML files and dotted command-line arguments override (`loader.py`). Names and defaults follow
RLLaVA's `PPOConfig`; where rllava's default differs, the field comment says so and why.

Validation: `PPOConfig.__post_init__` runs each section's `check(prefix)` (a section built alone is not validated:
call `section.check("rollout")`) and the cross-section rules, so any `PPOConfig` that exists is valid; every error
names its full dotted key, and all problems are reported at once.
"""

import contextvars
import difflib
import functools
import math
import os
import re
import types
import typing
import warnings
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Optional, Union

from rllava.errors import ConfigError


# Names the validators below accept (not method names, e.g. adv_estimator: their registries check those at build)
# RLLaVA's `fsdp` runs the FSDP2 engine; `accelerate` reads its plugin from Accelerate's config, no fsdp.* key
ACTOR_STRATEGIES = ["auto", "single", "fsdp", "fsdp2", "deepspeed", "accelerate"]
OPTIMIZERS = ["adamw"]  # what builders._engine builds (torch.optim.AdamW)
OPTIMIZERS_PLANNED = ["adamw_bf16"]  # RLLaVA's AdamW with bf16 states
VAL_OVERRIDE_KEYS = ["n", "temperature", "top_p", "top_k"]  # the rollout keys builders.sampling_params reads
ROLLOUT_ENGINES = ["hf", "vllm", "sglang"]  # vllm / sglang: optional extras, pip install "rllava[vllm]"
HF_DECODE_MODES = ["eager", "static", "compiled"]  # rollout.hf_decode (rllava.engine.inference.hf)
LOSS_AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
KL_TYPES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"]  # full: over the vocabulary (single engine)
REWARD_TYPES = ["auto", "batch", "sequential"]
# a named set of data.val_files: its records, and what it reads in place of the data / reward sections' keys
VAL_SET_KEYS = ["path", "format_prompt", "prompt_key", "answer_key", "image_key", "image_dir", "reward_function",
                "reward_function_kwargs"]
REWARD_ENTRY_KEYS = ["function", "weight", "name", "kwargs", "reward_type"]  # an entry of reward.reward_functions
# ... or a model entry, {type: classifier|judge|embedding, model: DIR, ...}: rllava.reward.models checks its keys
LR_SCHEDULERS = ["constant", "linear", "cosine", "constant_with_warmup"]  # transformers.get_scheduler names
TORCH_DTYPES = ["float32", "bfloat16", "float16"]


def resolve_strategy(strategy: str, world: Optional[int] = None, fsdp: Any = None, device: Any = None) -> str:
    """The train engine `actor.strategy` (or `critic.strategy`) means in this process. `auto`: `fsdp2` under
    torchrun (WORLD_SIZE > 1), and on one process when the role's `fsdp` keeps the weights on the host (RLLaVA's
    enable_cpu_offload / offload_params) and `device` (a torch.device or cpu | cuda | auto; None/auto: CUDA when
    available) is CUDA: FSDP2's CPUOffloadPolicy, as in RLLaVA (FSDP everywhere), trains a 4B model on one 24 GB
    GPU. Otherwise `single`: a CPU has no device memory to save, and one plain process needs no process group."""
    if strategy != "auto":
        return strategy
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    if world > 1 or fsdp is None or not (fsdp.enable_cpu_offload or fsdp.offload_params):
        return "fsdp2" if world > 1 else "single"
    import torch  # here: the config module itself loads without torch
    cuda = torch.cuda.is_available() if device in (None, "auto") else torch.device(device).type == "cuda"
    return "fsdp2" if cuda else "single"


def run_dir(outputs_dir: Optional[str], project_name: str, experiment_name: str) -> str:
    """RLLaVA's layout: <trainer.outputs_dir>/<project_name>/<experiment_name>, so runs sharing an outputs_dir
    (RLLaVA's scripts all say outputs) each get their own folder. No outputs_dir: outputs/<project>/<experiment>
    (RLLaVA: <project>/<experiment> in the working directory, which in a clone is the package's own folder)."""
    return os.path.join(outputs_dir or "outputs", project_name, experiment_name)


def _closest(value: Any, choices) -> Optional[str]:
    return next(iter(difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)), None)


def _choice(problems: list[str], key: str, value: Any, choices: list, hint: str = "", each: bool = False) -> None:
    """value (`each`: every item of the list value) in choices; else the problem names the closest, or `hint`."""
    for item in value if each else [value]:
        if item not in choices:
            close = _closest(item, choices)
            why = f"; {hint}" if hint else f"; did you mean {'' if each else key + '='}{close}?" if close else ""
            what = f"{key} contains {item}, which" if each else f"{key}={item}"
            problems.append(f"{what} is not one of: {', '.join(map(str, choices))}{why}")


def _show(value: Any) -> str:
    """A value as the user would write it in YAML or on the command line."""
    if value is None or isinstance(value, bool):
        return {True: "true", False: "false", None: "null"}[value]
    return "{...}" if is_dataclass(value) else str(value)


def _positive(problems: list[str], key: str, value: Any, *sentinels: Any) -> None:
    """value > 0, or one of the sentinels (e.g. -1 = 'all' / 'off')."""
    if value not in sentinels and not value > 0:
        also = f" (or {', '.join(map(_show, sentinels))})" if sentinels else ""
        problems.append(f"{key}={value} must be > 0{also}")


def _between(problems: list[str], key: str, value: Any, lo: float, hi: float) -> None:
    if value is not None and not lo <= value <= hi:
        problems.append(f"{key}={value} must be in [{lo}, {hi}]")


def _nonnegative(problems: list[str], key: str, value: Any, meaning: str = "") -> None:
    """value >= 0 (or None); `meaning` says what 0 (or null) stands for."""
    if value is not None and value < 0:
        problems.append(f"{key}={value} must be >= 0" + (f" ({meaning})" if meaning else ""))


def _val_set_problems(val_files: Any, sets: Optional[dict[str, dict[str, Any]]], key: str) -> list[str]:
    """data.val_files: a path, or named sets each with a path, text values and only VAL_SET_KEYS."""
    if not isinstance(val_files, (str, dict)) or val_files == {}:
        return [f"{key}={val_files!r}: give a path, or named sets {{name: path, name: {{path: ..., prompt_key: ...}}}}"]
    p = []
    for name, entry in (sets or {}).items():
        if not name or "/" in name:
            p.append(f"{key}: the set name {name!r} names its metrics (val/<name>/accuracy): use one without '/'")
        unknown = sorted(set(entry) - set(VAL_SET_KEYS))
        if unknown:
            p.append(f"{key}.{name}.{unknown[0]} is not a set key (valid: {', '.join(VAL_SET_KEYS)})")
        if not entry.get("path") or not isinstance(entry["path"], str):
            p.append(f"{key}.{name}.path: give the set's records (a file, directory or hub name)")
        for k in set(entry) & set(VAL_SET_KEYS) - {"path", "reward_function_kwargs"}:
            if entry[k] is not None and not isinstance(entry[k], str):
                p.append(f"{key}.{name}.{k}={entry[k]!r} must be a string")
        if entry.get("reward_function_kwargs") is not None and not entry.get("reward_function"):
            p.append(f"{key}.{name}.reward_function_kwargs is for the set's own reward_function: set that too")
    return p


@dataclass
class DataConfig:
    train_files: str = ""  # training records: local .jsonl/.parquet/dir, HF dataset "name@split", or reasoning_gym:<task>?size=N&seed=S (docs/data.md)
    val_files: Any = ""  # validation records, same forms; "" = no validation set; or named sets {name: path or {path: ..., prompt_key: ...}}, each logged as val/<name>/... (docs/experiments.md)
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
    sampler: str = "epoch"  # rllava: the prompt sampler (rllava.algorithms.curriculum): epoch (a fresh shuffle per epoch) or difficulty_pools (a curriculum on running pass rates, docs/experiments.md), or one a plugin registers
    sampler_kwargs: Optional[dict[str, Any]] = None  # rllava: its keys; difficulty_pools: easy_weight (0.2), medium_weight (1.0), hard_weight (0.2): a pool's prompts' relative draw rate; hard_max (0.25), medium_max (0.75): the pools' pass-rate bounds; ema (0.5); set_aside_after (2) groups without signal in a row, for readmit_after (20) batches
    min_pixels: Optional[int] = 3136  # images are resized to at least this many pixels
    max_pixels: Optional[int] = 4194304  # images are resized to at most this many pixels
    num_workers: int = 0  # rllava default 0 (RLLaVA: 8 DataLoader workers): batches are encoded in the training process; > 0 warns
    filter_overlong_prompts: bool = True  # drop records whose prompt exceeds max_prompt_length
    filter_overlong_prompts_workers: int = 1  # rllava default 1 (RLLaVA: 16): the filter runs in the training process; > 1 warns
    dataset_class: Optional[str] = None  # RLLaVA's "path/custom_datasets.py:RLHFDatasetWithTarget[Clevr]" (expert response) or "...:AgentSearchDataset" (final-answer rows), read by class name (its file is not run)
    dataset_kwargs: Optional[dict[str, Any]] = None  # its keyword arguments: target_key (the expert field), max_target_length (8192), strip_target_think_tag (true)
    max_samples: int = -1  # rllava: use only the first N records (quick runs); -1 = all
    target_key: Optional[str] = None  # rllava: record field with a reference response (SFT target, expert)
    expert_template: Optional[str] = None  # rllava: hybrids without data.target_key: Jinja text over `answer` + fields
    expert_files: Optional[str] = None  # rllava, CHORD: demonstration records (data.target_key); null = the train set
    expert_batch_size: int = 0  # rllava, CHORD: demonstration rows per step; 0 = from algorithm.expert_data_ratio

    def video_pixels(self) -> tuple[Optional[int], Optional[int]]:
        """(min, max) pixels of one video frame: video_min/max_pixels, each falling back to min/max_pixels."""
        return (self.video_min_pixels if self.video_min_pixels is not None else self.min_pixels,
                self.video_max_pixels if self.video_max_pixels is not None else self.max_pixels)

    def val_sets(self) -> Optional[dict[str, dict[str, Any]]]:
        """data.val_files' named form as {name: {path, ...its VAL_SET_KEYS}} (a bare path: {path}); None for the
        single form, a path (metrics val/...)."""
        if not isinstance(self.val_files, dict):
            return None
        return {str(name): dict(entry) if isinstance(entry, dict) else {"path": entry}
                for name, entry in self.val_files.items()}

    def check(self, prefix: str = "data") -> list[str]:
        p: list[str] = _val_set_problems(self.val_files, self.val_sets(), f"{prefix}.val_files")
        for name, *allowed in (("max_prompt_length",), ("max_response_length",), ("train_batch_size",), ("video_fps",),
                               ("video_max_frames",), ("val_batch_size", -1), ("max_samples", -1), ("min_pixels", None),
                               ("max_pixels", None), ("video_min_pixels", None), ("video_max_pixels", None)):
            _positive(p, f"{prefix}.{name}", getattr(self, name), *allowed)
        if self.min_pixels and self.max_pixels and self.min_pixels > self.max_pixels:
            p.append(f"{prefix}.min_pixels={self.min_pixels} is above {prefix}.max_pixels={self.max_pixels}")
        video_min, video_max = self.video_pixels()
        if (self.video_min_pixels or self.video_max_pixels) and video_min and video_max and video_min > video_max:
            p.append(f"{prefix}.video_min_pixels={_show(self.video_min_pixels)} is above {prefix}.video_max_pixels="
                     f"{_show(self.video_max_pixels)} (null = {prefix}.min_pixels={self.min_pixels} / "
                     f"{prefix}.max_pixels={self.max_pixels})")
        _nonnegative(p, f"{prefix}.num_workers", self.num_workers, "0 = load in the main process")
        return p


@dataclass
class KLControlConfig:
    type: str = "fixed"  # KL-in-reward coefficient controller: fixed | adaptive (by the whole batch's KL, all ranks)
    kl_coef: float = 0.001  # (initial) KL coefficient when algorithm.use_kl_in_reward
    horizon: int = 10000  # adaptive controller horizon
    target_kl: float = 0.1  # adaptive controller target KL


@dataclass
class DistillConfig:  # rllava: on-policy distillation (rllava.algorithms.distill, docs/algorithms.md)
    teacher_path: Optional[str] = None  # the frozen teacher (any model rllava loads, the student's tokenizer); None = off
    loss: str = "full"  # full (exact reverse KL over the vocabulary) | k1 | k3 (sampled), by registered name
    coef: float = 1.0  # weight of the distillation term in the actor loss
    use_reward: bool = True  # false: pure distillation (the reward is scored and logged, advantages are zero)
    route_field: Optional[str] = None  # multi-teacher: the record field (data.<field>) whose value picks the teacher
    teachers: dict[str, str] = field(default_factory=dict)  # multi-teacher: route_field value -> teacher path (others: teacher_path)
    engine: str = "hf"  # hf (the teacher runs in this process) | vllm | sglang (its log-probs only: k1 / k3)
    offload: bool = False  # the teacher's weights stay in host memory outside its passes (FSDP2: CPU offload)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # engine=vllm|sglang: passed to vllm.LLM / sglang.Engine

    @property
    def on(self) -> bool:
        return bool(self.teacher_path or self.teachers)

    def check(self, prefix: str = "algorithm.distill") -> list[str]:
        p: list[str] = []  # (the loss is looked up at build time: a plugin may register it)
        _choice(p, f"{prefix}.engine", self.engine, ["hf", "vllm", "sglang"])
        _nonnegative(p, f"{prefix}.coef", self.coef)
        if bool(self.teachers) != bool(self.route_field):
            p.append(f"{prefix}.teachers and {prefix}.route_field go together: the field's value picks a teacher "
                     f"(e.g. {prefix}.route_field=data_source {prefix}.teachers='{{chart: /models/a}}')")
        for key in ("loss", "coef", "use_reward", "engine", "offload", "engine_kwargs"):
            if not self.on and getattr(self, key) != getattr(DistillConfig(), key):
                p.append(f"{prefix}.{key}={_show(getattr(self, key))} is read only with a teacher: set "
                         f"{prefix}.teacher_path (or {prefix}.teachers)")
        if self.engine != "hf" and self.loss == "full":
            p.append(f"{prefix}.engine={self.engine} gives one teacher log-prob per token; {prefix}.loss=full needs "
                     f"its whole distribution: use {prefix}.loss=k1 (or k3), or {prefix}.engine=hf")
        if self.engine == "hf" and self.engine_kwargs:
            p.append(f"{prefix}.engine_kwargs are for engine=vllm|sglang; this teacher runs in the trainer (engine=hf)")
        return p


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0  # discount factor (GAE)
    lam: float = 1.0  # GAE lambda
    adv_estimator: str = "grpo"  # advantage estimator, by registered name (gae, grpo, rloo, ...)
    norm_adv_by_std_in_grpo: bool = True  # False gives Dr.GRPO's advantage
    step_advantage_w: float = 1.0  # GiGPO (adv_estimator=gigpo): weight of the step-level advantage (verl-agent's name)
    gigpo_mean_std_cross_steps: bool = False  # GiGPO: episode mean/std over turns (verl-agent's default), not episodes (paper Eq. 3)
    use_kl_loss: bool = True  # add actor.kl_loss_coef * KL(policy || ref) to the actor loss (builds a reference model)
    kl_penalty: str = "kl"  # KL estimator in the reward: kl|k1|abs|mse|k2|low_var_kl|k3|full (exact, over the vocabulary)
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_kl_in_reward: bool = False  # subtract a KL penalty from the token rewards
    ref_reset_freq: int = 0  # rllava: every k steps (after the update) the policy becomes the reference; 0 = never. RLLaVA paper, Algorithm 1 line 3 (pi_ref <- pi_theta): steps k j + 1 .. k (j + 1) use the policy of step k j as the reference; checkpoints keep its weights. Not with LoRA (the reference is the adapter-free base)
    online_filtering: bool = False  # DAPO: drop groups whose mean filter_key score is outside the band
    filter_key: str = "overall"  # reward score used for online filtering
    filter_low: float = 0.01  # keep groups with mean score > filter_low
    filter_high: float = 0.99  # keep groups with mean score < filter_high
    # SFT+RL hybrids (docs/algorithms.md; actor.policy_loss.loss_mode=luffy|srft|uft|hpt|chord)
    unify_strategy: str = "none"  # HPT: none | switch (SFT on a demonstration where a prompt is unsolved) | soft (always)
    switch_gate: int = 0  # HPT switch: a prompt solved this many times or fewer trains on its demonstration
    success_reward_threshold: float = 1.0  # HPT, SRFT: a rollout scoring at least this counts as solved (correct)
    prefix_strategy: str = "none"  # LUFFY/SRFT: random (expert prefixes in the group) | UFT: hint | none
    min_prefix_ratio: float = 0.0  # random: shortest expert prefix (fraction); hint: final chunk probability p
    max_prefix_ratio: float = 1.0  # random: longest expert prefix (fraction); hint: initial chunk probability p
    n_prefix: int = -1  # responses per group that start with an expert prefix; -1 = all
    prefix_share_across_samples: bool = False  # one prefix length per prompt instead of one per response
    hint_steps: int = 0  # UFT: steps over which p(t) decays (cosine); no hint afterwards
    hint_chunks: int = 5  # rllava, UFT: the expert solution is split into this many chunks; Binomial(chunks, p(t)) shown
    hint_min_ratio: float = 0.0  # RLLaVA's deprecated name: hints read algorithm.min_prefix_ratio
    hint_max_ratio: float = 1.0  # RLLaVA's deprecated name: hints read algorithm.max_prefix_ratio
    strategy: str = "none"  # RLLaVA's CHORD task: mix_chord = actor.policy_loss.loss_mode=chord | none
    expert_data_ratio: float = 0.2  # CHORD: share of a step's rows that are demonstrations
    mu_warmup_steps: int = 200  # CHORD: mu rises linearly from 0 to mu_peak over these steps
    mu_decay_steps: int = 400  # CHORD: then decays (cosine) to mu_valley over these steps
    mu_peak: float = 0.5  # CHORD: highest SFT weight mu
    mu_valley: float = 0.02  # CHORD: final SFT weight mu
    enable_phi_function: bool = False  # CHORD-phi: weight each SFT token by phi(p) = p (1 - p)
    use_token_level_loss_in_sft: bool = True  # hybrids' SFT term: mean over tokens (else per sequence, then over them)
    clip_range: float = 0.2  # RLLaVA's CHORD name of the PPO clip: read from actor.clip_ratio
    plugins: list[str] = field(default_factory=list)  # rllava: user .py files that register estimators/losses
    rollout_is: str = "none"  # rllava: truncated importance sampling of the rollout-engine vs trainer log-prob mismatch, any loss: none | token | sequence (actor.tis_imp_ratio_cap > 0, RLLaVA's key, means token with that cap)
    rollout_is_cap: float = 2.0  # truncation of the importance weight
    rollout_rs: Optional[str] = None  # rllava (verl's rollout correction, rllava.algorithms.correction): rejection sampling, tokens or sequences whose trainer/sampler divergence is out of bounds leave the loss; comma-separated options, all must pass: token_k1..3, seq_sum_k1..3, seq_mean_k1..3 (seq_mean_k1 = geometric-mean ratio), seq_max_k2|k3 (one bad token vetoes its row), e.g. seq_mean_k1 or token_k1,seq_max_k3
    rollout_rs_threshold: Optional[str] = None  # one for all options or one per option, comma-separated: k1 ratio bounds "lower_upper" (or "upper": lower = 1/upper), k2/k3 an upper bound; no default (verl's presets: seq_sum_k1 0.5_2.0, seq_mean_k1 0.999_1.001, seq_mean_k3 0.01)
    distill: DistillConfig = field(default_factory=DistillConfig)  # rllava: on-policy distillation from a teacher

    def check(self, prefix: str = "algorithm") -> list[str]:
        p: list[str] = self.distill.check(f"{prefix}.distill")
        for name in ("gamma", "lam", "mu_peak", "mu_valley", "min_prefix_ratio", "max_prefix_ratio"):
            _between(p, f"{prefix}.{name}", getattr(self, name), 0.0, 1.0)
        _choice(p, f"{prefix}.kl_penalty", self.kl_penalty, KL_TYPES)
        _choice(p, f"{prefix}.kl_ctrl.type", self.kl_ctrl.type, ["fixed", "adaptive"])
        _nonnegative(p, f"{prefix}.ref_reset_freq", self.ref_reset_freq, "0 = never reset the reference")
        if self.filter_low > self.filter_high:
            p.append(f"{prefix}.filter_low={self.filter_low} is above {prefix}.filter_high={self.filter_high}")
        _choice(p, f"{prefix}.rollout_is", self.rollout_is, ["none", "token", "sequence"])
        _positive(p, f"{prefix}.rollout_is_cap", self.rollout_is_cap)
        if self.rollout_rs is not None:
            from rllava.algorithms.correction import parse_rs_thresholds  # imported on use
            try:
                parse_rs_thresholds(self.rollout_rs, self.rollout_rs_threshold)
            except ValueError as e:
                p.append(f"{prefix}.rollout_rs={self.rollout_rs}, {prefix}.rollout_rs_threshold="
                         f"{_show(self.rollout_rs_threshold)}: {e}")
        elif self.rollout_rs_threshold is not None:
            p.append(f"{prefix}.rollout_rs_threshold={self.rollout_rs_threshold} is read only with "
                     f"{prefix}.rollout_rs set (e.g. seq_mean_k1)")
        _choice(p, f"{prefix}.unify_strategy", self.unify_strategy, ["none", "switch", "soft"])
        _choice(p, f"{prefix}.strategy", self.strategy, ["none", "mix_chord"])
        _between(p, f"{prefix}.expert_data_ratio", self.expert_data_ratio, 0.0, 0.99)
        for name in ("mu_warmup_steps", "mu_decay_steps", "hint_steps", "switch_gate"):
            _nonnegative(p, f"{prefix}.{name}", getattr(self, name))
        _positive(p, f"{prefix}.hint_chunks", self.hint_chunks)
        _choice(p, f"{prefix}.prefix_strategy", self.prefix_strategy, ["none", "random", "hint"])
        if self.min_prefix_ratio > self.max_prefix_ratio:
            p.append(f"{prefix}.min_prefix_ratio={self.min_prefix_ratio} is above "
                     f"{prefix}.max_prefix_ratio={self.max_prefix_ratio}")
        return p


MASKABLE_ATTENTION = ("sdpa", "eager", None)  # attention that takes a 4-D mask (model.shared_prefix); None: sdpa


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
    shared_prefix: Optional[bool] = None  # rllava: the training forward runs each group's prompt once, its K responses attending to it (exact); None = on where the attention takes a custom mask (sdpa, eager), off under flash_attention_2
    dynamic_batching: bool = False  # rllava default (RLLaVA: True): micro-batches by *_max_token_len_per_gpu tokens
    ulysses_size: int = 1  # Ulysses sequence parallelism: each sequence of the training passes split over this many ranks of a torchrun launch (a multiple of it), attention over the whole through all-to-alls; sdpa / eager attention, no shared_prefix (docs/engines.md)
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

    @property
    def use_shared_prefix(self) -> bool:
        """shared_prefix as set, or by default wherever the attention can take its mask."""
        if self.shared_prefix is not None:
            return self.shared_prefix
        return self.attn_implementation in MASKABLE_ATTENTION and self.ulysses_size == 1

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        if self.torch_dtype is not None:
            _choice(p, f"{prefix}.torch_dtype", self.torch_dtype, TORCH_DTYPES)
        _positive(p, f"{prefix}.ulysses_size", self.ulysses_size)
        if self.ulysses_size > 1 and (self.shared_prefix or self.attn_implementation not in MASKABLE_ATTENTION):
            p.append(f"{prefix}.ulysses_size={self.ulysses_size} runs sdpa or eager attention without the "
                     f"shared-prefix layout: set {prefix}.attn_implementation=sdpa and {prefix}.shared_prefix=false")
        if self.freeze_vision_tower and self.freeze_connector and self.freeze_llm and not self.use_peft:
            p.append(f"{prefix}.freeze_vision_tower, freeze_connector and freeze_llm are all true: nothing is left "
                     "to train; unfreeze one part (or set use_peft=true to train adapters)")
        if self.enable_activation_offload and not self.enable_gradient_checkpointing:
            p.append(f"{prefix}.enable_activation_offload=true offloads the activations that gradient checkpointing "
                     f"saves: set {prefix}.enable_gradient_checkpointing=true too")
        if self.shared_prefix and self.attn_implementation not in MASKABLE_ATTENTION:
            p.append(f"{prefix}.shared_prefix=true needs attention that takes a custom mask ({prefix}.attn_implementation "
                     f"sdpa or eager, not {self.attn_implementation}); set {prefix}.shared_prefix=false")
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
    strategy: str = "adamw"  # optimizer: adamw (RLLaVA's adamw_bf16 is not available yet)
    lr_warmup_ratio: float = 0.0  # warmup as a fraction of the run's optimizer steps (each rank's: steps x epochs x mini-batches)
    lr_warmup_steps: Optional[int] = None  # warmup steps; overrides lr_warmup_ratio when set
    lr_scheduler_type: str = "constant"  # constant|linear|cosine|constant_with_warmup
    min_lr_ratio: Optional[float] = None  # cosine only: the LR floor as a fraction of lr; None = decays to 0
    num_cycles: float = 0.5  # cosine only: cosine cycles over training (0.5 = one half-wave down)
    warmup_style: str = "constant"  # RLLaVA's deprecated name for lr_scheduler_type; must stay "constant"
    training_steps: int = -1  # derived from trainer.max_steps / total_epochs; must stay -1

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        _positive(p, f"{prefix}.lr", self.lr)
        if self.lr > 0 and not math.isfinite(self.lr):
            p.append(f"{prefix}.lr={self.lr} must be a finite number, e.g. 1e-6")
        if self.strategy in OPTIMIZERS_PLANNED:
            p.append(f"{prefix}.strategy={self.strategy} is not available yet in rllava (supported: "
                     f"{', '.join(OPTIMIZERS)})")
        else:
            _choice(p, f"{prefix}.strategy", self.strategy, OPTIMIZERS + OPTIMIZERS_PLANNED)
        if self.lr_scheduler_type != "cosine" and (self.min_lr_ratio is not None or self.num_cycles != 0.5):
            which = "min_lr_ratio" if self.min_lr_ratio is not None else "num_cycles"
            p.append(f"{prefix}.{which}={_show(getattr(self, which))} is read only by {prefix}.lr_scheduler_type=cosine "
                     f"(it is {self.lr_scheduler_type})")
        if self.training_steps != -1:
            p.append(f"{prefix}.training_steps={self.training_steps} is derived in rllava from trainer.max_steps "
                     "(or total_epochs); set trainer.max_steps instead")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            p.append(f"{prefix}.betas={self.betas} must be two numbers in [0, 1), e.g. [0.9,0.999]")
        _nonnegative(p, f"{prefix}.weight_decay", self.weight_decay)
        _between(p, f"{prefix}.lr_warmup_ratio", self.lr_warmup_ratio, 0.0, 1.0)
        _nonnegative(p, f"{prefix}.lr_warmup_steps", self.lr_warmup_steps, "or null")
        _choice(p, f"{prefix}.lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULERS)
        _between(p, f"{prefix}.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        if self.warmup_style != "constant":
            p.append(f"{prefix}.warmup_style={self.warmup_style} is RLLaVA's deprecated name; "
                     f"set {prefix}.lr_scheduler_type={self.warmup_style} instead")
        return p


@dataclass
class FSDPConfig:  # used when actor.strategy is fsdp/fsdp2; the three offload switches by every engine
    wrap_policy: dict[str, Any] = field(default_factory=dict)  # FSDP auto-wrap policy
    enable_cpu_offload: bool = False  # FSDP2: CPUOffloadPolicy (shards on CPU); single: CPU optimizer over fp32 masters
    use_orig_params: bool = False  # FSDP1 use_orig_params
    torch_dtype: Optional[str] = None  # parameter dtype under FSDP
    offload_params: bool = False  # FSDP2: CPUOffloadPolicy (RLLaVA's); else params+grads on CPU while vLLM/SGLang run
    offload_optimizer: bool = False  # optimizer state on CPU outside the update stage (any engine)
    reshard_after_forward: bool = True  # free gathered params after forward
    forward_prefetch: bool = False  # FSDP2: each unit (decoder layer, vision block) starts the next one's all-gather, with CPU offload its host-to-device copy, as it starts its own forward (FSDP2 prefetches one unit in backward by itself); + one unit's gathered weights
    keep_gathered_units: Union[int, str] = 0  # rllava, FSDP2: the last N units (forward order) keep their gathered weights from forward to backward in the update (one all-gather / host-to-device copy per micro-batch, not two; + N units' weights); auto (actor only) = as many as the memory planner fits beside the micro-batches (rllava.train.memory.auto; no GPU and no budget: 0)
    fsdp_size: int = -1  # shard group size; -1 = world size
    ulysses_size: int = 1  # RLLaVA keeps this twin of model.ulysses_size, which is the one read
    mixed_precision: Optional[dict[str, Any]] = None  # param/reduce/buffer dtypes

    def check(self, prefix: str) -> list[str]:
        """Keys rllava's FSDP2 engine has no counterpart for: a one-line error naming what to set instead."""
        p: list[str] = []
        if self.wrap_policy:
            p.append(f"{prefix}.wrap_policy={self.wrap_policy} is not available yet in rllava: FSDP2 shards each "
                     f"decoder layer / vision block (the model's _no_split_modules); set {prefix}.wrap_policy={{}}")
        model = prefix.rsplit(".", 1)[0] + ".model"
        if self.torch_dtype is not None:
            p.append(f"{prefix}.torch_dtype={self.torch_dtype} is not read in rllava; set {model}.torch_dtype "
                     f"(weights) or {prefix}.mixed_precision (compute dtypes) instead")
        if self.ulysses_size != 1:
            p.append(f"{prefix}.ulysses_size={self.ulysses_size} is not read in rllava; set {model}.ulysses_size "
                     "instead")
        keep = self.keep_gathered_units
        if keep == "auto" and not prefix.startswith("actor."):
            p.append(f"{prefix}.keep_gathered_units=auto: the memory planner sizes the actor's only; give a number")
        elif keep != "auto" and (isinstance(keep, str) or keep < 0):
            p.append(f"{prefix}.keep_gathered_units={_show(keep)} must be >= 0 or auto (sized by the memory planner)")
        if self.fsdp_size not in (-1, int(os.environ.get("WORLD_SIZE", "1"))):
            p.append(f"{prefix}.fsdp_size={self.fsdp_size} is not available yet in rllava (HSDP shard groups); "
                     f"set {prefix}.fsdp_size=-1 (shard over every process)")
        return p


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
    tau_pos: float = 1.0  # sapo: gate temperature for tokens with a positive advantage (verl's name)
    tau_neg: float = 1.05  # sapo: gate temperature for tokens with a negative advantage (verl's name)
    behav_imp_weight_cap: Optional[float] = None  # decoupled_ppo (AReaL's name): tokens whose behaviour weight pi_prox / pi_behav exceeds it are filtered out; None = no filter (AReaL's default), else > 1


@dataclass
class CheckpointConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])  # + hf_model
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])  # on resume
    async_save: bool = False  # engines' state staged to host memory, written in a background thread meanwhile

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        for name in ("save_contents", "load_contents"):
            _choice(p, f"{prefix}.{name}", getattr(self, name), ["model", "optimizer", "extra", "hf_model"], each=True)
        return p


# The actor's micro-batch sizes that take `auto` (rllava.train.memory.auto; where nothing can be planned, no GPU and
# no trainer.memory_budget_gb, each takes its schema default): the sequence counts, then dynamic batching's budgets.
AUTO_SIZES = ("ppo_micro_batch_size", "log_prob_micro_batch_size", "ppo_max_token_len_per_gpu",
              "log_prob_max_token_len_per_gpu")


@dataclass
class ActorConfig:
    strategy: str = "auto"  # auto (RLLaVA: fsdp2): fsdp2 under torchrun or with fsdp CPU offload on a GPU, else single | single | fsdp2 | deepspeed | accelerate (HF Accelerate: trainer.accelerate_config, docs/engines.md); fsdp2 (or deepspeed) on one plain `python -m` process runs as a world of one (docs/engines.md)
    ppo_mini_batch_size: int = 256  # prompts per optimizer step (x rollout.n responses)
    ppo_micro_batch_size: Union[int, str] = 4  # sequences per forward/backward (gradient accumulation unit); rllava: auto = the largest the memory planner fits in the device (trainer.memory_budget_gb), said in one line before the first step (docs/performance.md; no GPU and no budget: 4)
    log_prob_micro_batch_size: Union[int, str] = 16  # sequences per forward when computing old log-probs; rllava: auto = the largest the planner fits (as ppo_micro_batch_size; no GPU and no budget: 16)
    ppo_max_token_len_per_gpu: Union[int, str] = 16384  # verl: tokens per forward/backward when model.dynamic_batching (instead of ppo_micro_batch_size): a micro-batch's tokens are rows x its longest row, or with model.padding_free the sum of its rows' lengths; a row over the budget runs alone; rllava: auto = as many full-length rows as the planner fits (no GPU and no budget: 16384)
    log_prob_max_token_len_per_gpu: Union[int, str] = 32768  # verl: tokens per old-log-prob forward when model.dynamic_batching (instead of log_prob_micro_batch_size); it can take more: the no-grad pass keeps no activations for a backward; rllava: auto as ppo_max_token_len_per_gpu (no GPU and no budget: 32768)
    logprob_chunk_size: int = 512  # rllava: trained tokens per LM-head chunk; 0 or -1 = all at once (full logits). Only one chunk's [tokens x vocab] logits is alive at a time (1024 x 152k vocab: 0.6 GB in fp32): with grad each chunk is recomputed in the backward (activation checkpointing of the LM head, log-softmax, entropy)
    max_grad_norm: float = 1.0  # clip the gradient norm to this
    skip_grad_norm: float = 80.0  # skip the optimizer step when the pre-clip grad norm exceeds this
    clip_ratio: float = 0.2  # PPO clip epsilon (symmetric): drives clip_ratio_low/high where they are left at 0.2
    clip_ratio_low: float = 0.2  # lower clip epsilon (DAPO clip-higher uses low != high)
    clip_ratio_high: float = 0.2  # upper clip epsilon
    clip_ratio_c: float = 3.0  # dual-clip constant C, applied where advantage < 0
    clip_upper_bound: float = 1.0  # SRFT (srft_type=classic_rl): the ratio's upper clamp is max(this, 1 + clip_ratio_high)
    loss_agg_mode: str = "token-mean"  # token-mean|seq-mean-token-sum|seq-mean-token-mean|seq-mean-token-sum-norm
    entropy_coeff: float = 0.0  # entropy bonus coefficient
    loss_terms: dict[str, float] = field(default_factory=dict)  # rllava: {name: coef} of registered terms added to the loss (@register_loss_term in a file of algorithm.plugins)
    tis_imp_ratio_cap: float = -1.0  # truncated importance sampling cap (rollout vs train); -1 = off
    ppo_epochs: int = 1  # passes over each rollout batch
    use_torch_compile: bool = False  # rllava default (RLLaVA: True): rllava does not torch.compile; true warns
    model: ModelConfig = field(default_factory=ModelConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    kl_loss_coef: float = 0.01  # KL loss coefficient when algorithm.use_kl_loss
    kl_loss_type: str = "low_var_kl"  # KL estimator in the loss: kl|k1|abs|mse|k2|low_var_kl|k3|full (exact, over the vocabulary)
    # SFT+RL hybrid losses (loss_mode=luffy|srft|uft|hpt|chord; rllava.algorithms.hybrid, docs/algorithms.md)
    loss_remove_clip: bool = False  # hybrids: no PPO clip on the policy's own tokens
    off_policy_reshape: Optional[str] = None  # LUFFY/SRFT expert-token shaping f(p): no_reshape|logp|p_logp|square_root|pow|p_div_p_<gamma>; rllava default null = the loss's own, p_div_p_0.1 (RLLaVA: no_reshape)
    off_policy_reshape_weight: float = 0.1  # weight of the logp / p_logp shapings
    off_policy_reshape_pow_exp: float = 0.5  # exponent of the pow shaping
    off_policy_cliprange: float = 0.2  # declared by RLLaVA, read by none of its losses: not accepted
    off_policy_normalize: bool = False  # declared by RLLaVA, read by none of its losses: not accepted
    off_policy_max_clip: float = -1  # LUFFY/SRFT: upper clamp of the shaped expert ratio; -1 = off
    off_policy_min_clip: float = -1  # LUFFY/SRFT: lower clamp of the shaped expert ratio; -1 = off
    all_max_clip: float = -1  # LUFFY/SRFT: no loss on tokens with p above this; -1 = off
    on_policy_reshape: str = "no_reshape"  # LUFFY's shaping of the own ratio r: logp = log r, p_logp, p_div_p_<g> = f(p)/f(p_old); rllava_<kind>: RLLaVA's (as off_policy_reshape, on r)
    on_policy_reshape_weight: float = 0.1  # weight of the logp / p_logp shapings
    on_policy_reshape_pow_exp: float = 0.5  # exponent of the pow shaping
    srft_type: str = "paper"  # SRFT's own-token term: paper (log p) | exp (p) | classic_rl (ratio) | minus_old
    hpt_hint_loss_coef: float = 0.0  # declared by RLLaVA, read by none of its losses: not accepted
    sft_loss_coef: float = 1.0  # HPT, UFT, SRFT: coefficient of the SFT term (CHORD: mu(t))

    def __post_init__(self) -> None:
        # RLLaVA's losses take clip_ratio_low/high, falling back to clip_ratio only when null (never, with its 0.2
        # defaults): here clip_ratio is the symmetric epsilon it is documented as, for the sides left at 0.2.
        if self.clip_ratio != 0.2:
            self.clip_ratio_low = self.clip_ratio if self.clip_ratio_low == 0.2 else self.clip_ratio_low
            self.clip_ratio_high = self.clip_ratio if self.clip_ratio_high == 0.2 else self.clip_ratio_high

    def check(self, prefix: str = "actor") -> list[str]:
        p: list[str] = []
        _choice(p, f"{prefix}.strategy", self.strategy, ACTOR_STRATEGIES)
        for name in ("ppo_mini_batch_size", "ppo_epochs", "max_grad_norm"):
            _positive(p, f"{prefix}.{name}", getattr(self, name))
        for name in AUTO_SIZES:
            value = getattr(self, name)
            if isinstance(value, str) and value != "auto" or not isinstance(value, str) and not value > 0:
                p.append(f"{prefix}.{name}={_show(value)} must be > 0 or auto (sized by the memory planner)")
        _positive(p, f"{prefix}.logprob_chunk_size", self.logprob_chunk_size, 0, -1)
        for name in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
            _nonnegative(p, f"{prefix}.{name}", getattr(self, name))
        if self.clip_ratio_c <= 1:
            p.append(f"{prefix}.clip_ratio_c={self.clip_ratio_c} must be > 1 (dual-clip constant, e.g. 3.0)")
        _choice(p, f"{prefix}.loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _choice(p, f"{prefix}.kl_loss_type", self.kl_loss_type, KL_TYPES)
        for name in ("tau_pos", "tau_neg"):
            _positive(p, f"{prefix}.policy_loss.{name}", getattr(self.policy_loss, name))
        cap = self.policy_loss.behav_imp_weight_cap
        if cap is not None and not cap > 1:
            p.append(f"{prefix}.policy_loss.behav_imp_weight_cap={cap} must be > 1 (or null: no filter)")
        elif cap is not None and self.policy_loss.loss_mode != "decoupled_ppo":
            p.append(f"{prefix}.policy_loss.behav_imp_weight_cap={cap} is read only by actor.policy_loss.loss_mode="
                     f"decoupled_ppo (this run: {self.policy_loss.loss_mode})")
        for name in ("model", "optim", "checkpoint", "fsdp") + (("deepspeed",) if self.strategy == "deepspeed" else ()):
            p += getattr(self, name).check(f"{prefix}.{name}")
        return p

    def ignored_keys(self, prefix: str = "actor") -> list[str]:
        """fsdp/deepspeed keys changed from their defaults although this strategy does not read them."""
        strategy = resolve_strategy(self.strategy, fsdp=self.fsdp)
        sections = {"single": ("fsdp", "deepspeed"), "deepspeed": ("fsdp",),
                    "accelerate": ("fsdp", "deepspeed")}.get(strategy, ("deepspeed",))
        return [f"{prefix}.{s}.{f.name}" for s in sections for f in fields(getattr(self, s))
                if getattr(getattr(self, s), f.name) != getattr(type(getattr(self, s))(), f.name)
                and (strategy == "accelerate" or f"{s}.{f.name}" not in ENGINE_OFFLOAD_KEYS)]


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
    strategy: str = "auto"  # training strategy, as actor.strategy (rllava default auto; RLLaVA: fsdp2)
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
        _choice(p, f"{prefix}.strategy", self.strategy, ACTOR_STRATEGIES)
        if self.strategy == "deepspeed":
            p += self.deepspeed.check(f"{prefix}.deepspeed")
        for name in ("ppo_mini_batch_size", "ppo_micro_batch_size", "log_prob_micro_batch_size",
                     "ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu", "ppo_epochs"):
            _positive(p, f"{prefix}.{name}", getattr(self, name))
        _choice(p, f"{prefix}.loss_avg_mode", self.loss_avg_mode, ["token", "seq"])
        p += self.model.check(f"{prefix}.model") + self.optim.check(f"{prefix}.optim") + self.fsdp.check(f"{prefix}.fsdp")
        # The value model scores the actor's tokens with the actor's processor, and its config is the checkpoint's.
        for name, instead in (("tokenizer_path", "actor.model.tokenizer_path"),
                              ("tie_word_embeddings", f"{prefix}.model.override_config")):
            if getattr(self.model, name) != getattr(ModelConfig(), name):
                p.append(f"{prefix}.model.{name}={_show(getattr(self.model, name))} is not read for the value model; "
                         f"set {instead} instead")
        return p

    ignored_keys = ActorConfig.ignored_keys  # the same strategy / fsdp / deepspeed keys (validate passes "critic")


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
class AgentConfig:  # rllava section: multi-turn agent rollouts (rllava.agent), on when `tools` is not empty
    tools: list[str] = field(default_factory=list)  # registered tools the agent may call, e.g. [search, zoom]
    tool_kwargs: dict[str, Any] = field(default_factory=dict)  # options per tool: tool_kwargs.search.corpus=...
    tool_format: str = "tags"  # how a call is written: tags (<zoom>[...]</zoom>), json (<tool_call>{...}</tool_call>), or fenced (tags, and a ```python block calls `code`)
    tool_workers: int = 8  # tool calls of one round run at once, at most this many (the code tool's sandboxes); 1 = one by one
    round_image_mb: int = 1024  # MB of observation images a round adds (RGB, after data.max_pixels); more: dropped
    answer_tag: str = "answer"  # a turn with <answer>...</answer> ends the episode
    invalid_call_penalty: float = 0.0  # tool-level reward of a turn whose call fails (verl's zoom: -0.05)
    observation_role: str = "user"  # the chat role observations are shown in (user, or tool where the template has it)
    plugins: list[str] = field(default_factory=list)  # user .py files that @register_tool their own tools
    program: Optional[str] = None  # an agent written for an OpenAI client, path/agent.py:run (rllava.agent.program)
    episode_timeout: float = 600.0  # seconds an agent program's episode may run; past it: scored 0, a warning
    environment: Optional[str] = None  # a verifiers Environment as the agent: verifiers:<module or env.py>[:function] (rllava.agent.verifiers_env)
    environment_kwargs: dict[str, Any] = field(default_factory=dict)  # keyword arguments of rollout.agent.environment's load function

    def own(self) -> str | None:
        """The key of an agent that brings its own tools and episodes ("program" or "environment"), else None."""
        if self.program:
            return "program"
        if self.environment:
            return "environment"
        return None

    def check(self, prefix: str) -> list[str]:
        p: list[str] = []
        _positive(p, f"{prefix}.episode_timeout", self.episode_timeout)
        if self.program:
            path, _, name = self.program.rpartition(":")
            if not path.endswith(".py") or not name:
                p.append(f"{prefix}.program={self.program!r}: expected path/to/agent.py:function_name")
            elif not os.path.isfile(os.path.expanduser(path)):
                p.append(f"{prefix}.program={self.program!r}: file {path!r} does not exist")
        if self.program and self.environment:
            p.append(f"{prefix}.program and {prefix}.environment both give the agent: set one")
        if self.environment and not self.environment.startswith("verifiers:"):
            p.append(f"{prefix}.environment={self.environment!r}: expected verifiers:<module or path/env.py>[:function]")
        if self.environment_kwargs and not self.environment:
            p.append(f"{prefix}.environment_kwargs is for {prefix}.environment: set that too")
        own = self.own()
        if own and (self.tools or self.plugins):
            p.append(f"{prefix}.{own} runs an agent of its own: its tools are its own, unset {prefix}.tools/plugins")
        _choice(p, f"{prefix}.tool_format", self.tool_format, ["tags", "json", "fenced"])
        _positive(p, f"{prefix}.tool_workers", self.tool_workers)
        _positive(p, f"{prefix}.round_image_mb", self.round_image_mb)
        _choice(p, f"{prefix}.observation_role", self.observation_role, ["user", "tool"])
        if not re.fullmatch(r"[A-Za-z_][\w-]*", self.answer_tag):
            p.append(f"{prefix}.answer_tag={self.answer_tag!r} must be a tag name (e.g. answer)")
        if self.invalid_call_penalty > 0:
            p.append(f"{prefix}.invalid_call_penalty={self.invalid_call_penalty} must be <= 0 (a penalty)")
        return p


@dataclass
class RolloutConfig:
    name: str = "hf"  # rollout engine (alias: rollout.engine): rllava default hf (RLLaVA: vllm), HF generate on the training model; vllm/sglang hold their own copy
    n: int = 1  # responses sampled per prompt (group size)
    temperature: float = 1.0  # sampling temperature; 0 = greedy
    top_p: float = 1.0  # nucleus sampling mass, in (0, 1]
    top_k: int = -1  # top-k sampling; -1 = off
    tensor_parallel_size: int = 1  # inference-engine tensor parallelism
    seed: Optional[int] = 1  # sampling seed; null (or the strings none/null, as RLLaVA) = random
    limit_images: int = 0  # max images per prompt for the engine; 0 = no limit
    ignore_eos: bool = False  # keep generating past EOS, to max_response_length (rollout.name=hf only)
    disable_tqdm: bool = False  # hide the generation progress bar (rllava shows none: true warns)
    micro_batch_size: int = 2  # prompts per generate call
    hf_decode: str = "eager"  # rllava: rollout.name=hf's KV cache (rllava.engine.inference.hf.HFRolloutEngine's docstring): eager (the growing DynamicCache) | static (a preallocated StaticCache: fixed decode shapes, the same tokens and log-probs) | compiled (static, and generate compiles the decode step: CUDA graphs; CUDA and actor.strategy single only); models with sliding-window or linear-attention layers stay eager; eager by default: compiled was no faster on an H200 (docs/performance.md)
    val_override_config: dict[str, Any] = field(default_factory=dict)  # validation sampling: n/temperature/top_p/top_k
    partial_rollout: bool = False  # resume unfinished generations next step (roles.rollout.PartialRollouts): responses are written in rounds of at most partial_rollout_tokens tokens; once a step has its batch of complete groups, the others pause until the next
    partial_rollout_tokens: int = 0  # rllava: tokens per response per round (0 = data.max_response_length / 4)
    async_mode: bool = False  # RLLaVA's async generation: vLLM / SGLang keep their memory between rollouts (no sleep / wake); agent episodes go on as soon as their own tool call returns (no rounds; rllava.agent.rollout)
    bucket_size: int = 512  # MB per weight-sync bucket to the engine
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    load_format: str = "dummy"  # engine weight init before the first sync
    agent: AgentConfig = field(default_factory=AgentConfig)  # multi-turn agent rollouts (rollout.agent.tools; RLLaVA's agentic pipeline)
    max_turns: int = 10  # agent rollouts: max model turns per episode
    discount: float = 0.95  # agent rollouts: per-turn discount of GiGPO's step returns (RLLaVA 0.9, unread there)
    tool_config_path: Optional[str] = None  # agent: YAML of tool classes (RLLaVA's files; docs/agents.md)
    env_config_path: Optional[str] = None  # agent: YAML of an environment class, one per episode (RLLaVA's)
    # RLLaVA copies these from their owners (DERIVED_KEYS); rllava reads the owners: these stay unset or equal to them
    prompt_length: int = -1  # = data.max_prompt_length
    response_length: int = -1  # = data.max_response_length
    trust_remote_code: bool = True  # = actor.model.trust_remote_code
    adv_estimator: str = "grpo"  # = algorithm.adv_estimator
    min_pixels: Optional[int] = None  # = data.min_pixels
    max_pixels: Optional[int] = None  # = data.max_pixels
    video_fps: float = 2.0  # = data.video_fps

    def check(self, prefix: str = "rollout") -> list[str]:
        p: list[str] = []
        _choice(p, f"{prefix}.name", self.name, ROLLOUT_ENGINES)
        _positive(p, f"{prefix}.n", self.n)
        _positive(p, f"{prefix}.micro_batch_size", self.micro_batch_size)
        _choice(p, f"{prefix}.hf_decode", self.hf_decode, HF_DECODE_MODES)
        _positive(p, f"{prefix}.max_turns", self.max_turns)
        p += self.agent.check(f"{prefix}.agent")
        own = self.agent.own()
        if own and (self.partial_rollout or self.tool_config_path or self.env_config_path):
            p.append(f"{prefix}.agent.{own} runs whole episodes in one step: unset {prefix}.partial_rollout, "
                     f"tool_config_path and env_config_path")
        _nonnegative(p, f"{prefix}.temperature", self.temperature, "0 = greedy")
        if not 0 < self.top_p <= 1:
            p.append(f"{prefix}.top_p={self.top_p} must be in (0, 1]; 1.0 turns nucleus sampling off")
        if self.top_k != -1 and self.top_k <= 0:
            p.append(f"{prefix}.top_k={self.top_k} must be > 0, or -1 to turn top-k off")
        _nonnegative(p, f"{prefix}.limit_images", self.limit_images, "0 = no limit")
        if self.ignore_eos and self.name != "hf":
            p.append(f"{prefix}.ignore_eos=true is implemented for {prefix}.name=hf only (it is {self.name})")
        # validation's sampling keys and values, checked at load: not at the first validation, after training
        good, own, key = {}, [f.name for f in fields(self)], f"{prefix}.val_override_config"
        for name, value in self.val_override_config.items():
            if name not in own:
                close = _closest(name, own)
                p.append(f"{key}.{name} is not a {prefix} key" + (f"; did you mean {key}.{close}?" if close else ""))
            elif name not in VAL_OVERRIDE_KEYS:
                p.append(f"{key}.{name} is not applied at validation (it overrides: {', '.join(VAL_OVERRIDE_KEYS)})")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or (name in ("n", "top_k")
                                                                                  and value != int(value)):
                p.append(f"{key}.{name}={_show(value)} must be a number")
            else:
                good[name] = int(value) if name in ("n", "top_k") else value
        if not good:
            return p
        sampling = RolloutConfig(**{**{k: getattr(self, k) for k in VAL_OVERRIDE_KEYS}, "name": self.name, **good})
        return p + [line for line in sampling.check(key) if line.split("=")[0].rsplit(".", 1)[-1] in good]


@dataclass
class OverlongBufferConfig:  # verl's names
    enable: bool = False  # DAPO soft overlong punishment of training rewards
    len: int = 0  # tokens before data.max_response_length where the penalty starts
    penalty_factor: float = 1.0  # penalty at the full length


# What a reward model reads of its ModelConfig (reward.model): the rest is for training
REWARD_MODEL_KEYS = ["model_path", "tokenizer_path", "torch_dtype", "attn_implementation", "trust_remote_code",
                     "override_config"]


def _model_entry(entry: dict) -> bool:
    """An entry of reward.reward_functions that is a model (reward model, judge, embedding), not a function."""
    return "function" not in entry and ("model" in entry or "type" in entry)


@dataclass
class RepetitionPenaltyConfig:  # rllava: n-gram repetition penalty of training rewards (rllava.reward.shaping)
    enable: bool = False  # add -penalty_factor * (repeated n-grams / n-grams) of each response to its training reward
    ngram_size: int = 10  # n: tokens per n-gram
    penalty_factor: float = 1.0  # penalty of a response made of one repeated n-gram


@dataclass
class RewardConfig:
    reward_type: str = "auto"  # rllava default (RLLaVA: batch): auto|batch|sequential; auto = from the function
    reward_function: Optional[str] = None  # "path/file.py:fn"
    reward_function_kwargs: dict[str, Any] = field(default_factory=dict)  # extra keyword arguments for fn
    reward_functions: list[dict[str, Any]] = field(default_factory=list)  # rllava: several, r = sum of weight * score: [{function: a.py:fn, weight: 0.2, name, kwargs, reward_type}, ...]; logged as reward/<name>_mean
    skip_special_tokens: bool = True  # decode responses without special tokens before scoring
    num_cpus: int = 1  # 1 = score in this process; N > 1 = a pool of N worker processes (hung workers are killed)
    timeout: Optional[float] = 60.0  # rllava: seconds per reward call (a batch reward: per batch); null = no limit
    strict: Optional[bool] = None  # rllava: true = a failing reward call (raise, timeout, non-finite) stops the run; null/false = the sample scores fallback_score, counted in reward/errors
    fallback_score: float = 0.0  # rllava: the score of a failed sample when not strict
    on_error: Optional[str] = None  # rllava, older spelling: raise = strict=true, zero = strict=false, fallback 0
    reward_function_name: Optional[str] = None  # RLLaVA fills it from reward_function; must stay null
    model: ModelConfig = field(default_factory=ModelConfig)  # RLLaVA/verl's reward model (rllava.reward.models, docs/reward_models.md): a one-label sequence-classification checkpoint, its logit for prompt + response a reward; reads model_path, tokenizer_path, torch_dtype, attn_implementation, trust_remote_code, override_config (other keys: an error)
    model_weight: float = 1.0  # rllava: reward = reward_function's score + model_weight x the reward model's logit
    model_micro_batch_size: int = 16  # rllava: sequences per reward-model forward
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)  # rllava (verl's keys)
    repetition_penalty: RepetitionPenaltyConfig = field(default_factory=RepetitionPenaltyConfig)  # rllava

    def check(self, prefix: str = "reward") -> list[str]:
        p: list[str] = []
        _choice(p, f"{prefix}.reward_type", self.reward_type, REWARD_TYPES)
        _positive(p, f"{prefix}.num_cpus", self.num_cpus)
        _positive(p, f"{prefix}.timeout", self.timeout, None)
        if self.on_error is not None:
            _choice(p, f"{prefix}.on_error", self.on_error, ["raise", "zero"])
        said = {"raise": True, "zero": False}.get(self.on_error)
        if said is not None and self.strict is not None and self.strict != said:
            p.append(f"{prefix}.on_error={self.on_error} contradicts {prefix}.strict={_show(self.strict)}: keep "
                     f"{prefix}.strict")
        if not math.isfinite(self.fallback_score):
            p.append(f"{prefix}.fallback_score={self.fallback_score} must be a finite number")
        elif self.fallback_score != 0 and (self.on_error is not None or self.strict):
            p.append(f"{prefix}.fallback_score={self.fallback_score} is never used with " + (
                f"on_error={self.on_error} (the older key: it stops the run or scores 0): use {prefix}.strict=false"
                if self.on_error else "strict=true (a failure stops the run): set strict=false or drop it"))
        self._check_sources(p, prefix)
        if self.overlong_buffer.enable and self.overlong_buffer.len <= 0:
            p.append(f"{prefix}.overlong_buffer.len={self.overlong_buffer.len} must be > 0 when "
                     f"{prefix}.overlong_buffer.enable=true")
        _positive(p, f"{prefix}.repetition_penalty.ngram_size", self.repetition_penalty.ngram_size)
        _nonnegative(p, f"{prefix}.repetition_penalty.penalty_factor", self.repetition_penalty.penalty_factor,
                     "it is subtracted")
        if self.reward_function_name is not None:
            p.append(f"{prefix}.reward_function_name={self.reward_function_name} is derived in rllava; "
                     f"set {prefix}.reward_function=path/file.py:{self.reward_function_name} instead")
        m = self.model
        for name in [f.name for f in fields(m) if getattr(m, f.name) != getattr(ModelConfig(), f.name)]:
            if name not in REWARD_MODEL_KEYS:
                p.append(f"{prefix}.model.{name}={_show(getattr(m, name))} is not read: the reward model is run, never "
                         f"trained (it reads {', '.join(REWARD_MODEL_KEYS)}); leave it at "
                         f"{_show(getattr(ModelConfig(), name))}")
            elif not m.model_path:
                p.append(f"{prefix}.model.{name}={_show(getattr(m, name))} is read only with a reward model: set "
                         f"{prefix}.model.model_path=DIR (a sequence-classification checkpoint)")
        for name, default in (("model_weight", 1.0), ("model_micro_batch_size", 16)):
            if getattr(self, name) != default and not m.model_path:
                p.append(f"{prefix}.{name}={getattr(self, name)} is read only with a reward model: set "
                         f"{prefix}.model.model_path=DIR")
        if m.torch_dtype is not None:
            _choice(p, f"{prefix}.model.torch_dtype", m.torch_dtype, TORCH_DTYPES)
        _positive(p, f"{prefix}.model_micro_batch_size", self.model_micro_batch_size)
        if not math.isfinite(self.model_weight):
            p.append(f"{prefix}.model_weight={self.model_weight} must be a finite number")
        return p

    def error_policy(self) -> tuple[bool, float]:
        """(strict, fallback score) from reward.strict / fallback_score, or the older reward.on_error."""
        if self.on_error is not None:
            return self.on_error == "raise", 0.0
        return bool(self.strict), self.fallback_score

    def sources(self) -> list[dict[str, Any]]:
        """Every reward function as {function, weight, kwargs, reward_type, name, key, kwargs_key} (the last two
        name its keys in errors): reward.reward_functions' entries, or reward.reward_function, weight 1."""
        if not self.reward_functions:
            if not self.reward_function and self.model.model_path:
                return []  # the reward model alone scores (rllava.reward.models.model_sources)
            return [{"function": self.reward_function, "weight": 1.0, "kwargs": dict(self.reward_function_kwargs),
                     "reward_type": self.reward_type, "name": str(self.reward_function or "").rpartition(":")[2],
                     "key": "reward.reward_function", "kwargs_key": "reward.reward_function_kwargs"}]
        return [{"entry": e, "weight": e.get("weight", 1.0), "name": e.get("name") or e.get("type") or "classifier",
                 "key": f"reward.reward_functions[{i}]"} if _model_entry(e) else
                {"function": e.get("function"), "weight": e.get("weight", 1.0), "kwargs": dict(e.get("kwargs") or {}),
                 "reward_type": e.get("reward_type", self.reward_type),
                 "name": e.get("name") or str(e.get("function") or "").rpartition(":")[2],
                 "key": f"reward.reward_functions[{i}].function", "kwargs_key": f"reward.reward_functions[{i}].kwargs"}
                for i, e in enumerate(self.reward_functions)]

    def _check_sources(self, p: list[str], prefix: str) -> None:
        if not self.reward_functions:
            return
        if self.reward_function:
            p.append(f"{prefix}.reward_function and {prefix}.reward_functions are both set: keep one "
                     f"({{function: {self.reward_function}, weight: 1.0}} in reward_functions is the same reward; "
                     "either one on the command line replaces the config file's other)")
        if self.reward_function_kwargs:
            p.append(f"{prefix}.reward_function_kwargs is for {prefix}.reward_function: give each entry of "
                     f"{prefix}.reward_functions its own kwargs: {{function: ..., kwargs: {{...}}}}")
        for i, e in enumerate(self.reward_functions):
            key = f"{prefix}.reward_functions[{i}]"
            w = e.get("weight", 1.0)
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                p.append(f"{key}.weight={_show(w)} must be a finite number")
            if _model_entry(e):
                continue  # its other keys: rllava.reward.models.build_model_reward, before the model loads
            unknown = sorted(set(e) - set(REWARD_ENTRY_KEYS))
            if unknown:
                p.append(f"{key}.{unknown[0]}: unknown key; an entry takes {', '.join(REWARD_ENTRY_KEYS)}")
            if not isinstance(e.get("function"), str) or not e["function"]:
                p.append(f"{key}.function is not set (expected path/to/file.py:function_name, or a model entry "
                         "{type: classifier|judge|embedding, model: DIR, ...})")
            if not isinstance(e.get("kwargs") or {}, dict):
                p.append(f"{key}.kwargs={_show(e['kwargs'])} must be a mapping of keyword arguments")
            _choice(p, f"{key}.reward_type", e.get("reward_type", self.reward_type), REWARD_TYPES)
        names: dict[str, int] = {}
        for i, source in enumerate(self.sources()):
            name, key = source["name"], f"{prefix}.reward_functions[{i}]"
            if not isinstance(name, str) or name in ("overall", "tool_reward", "overlong_penalty") or "/" in name:
                p.append(f"{key}.name={_show(name)}: choose another name (not overall, tool_reward, "
                         "overlong_penalty; no '/')")
            elif name in names:
                p.append(f"{key}: the name {name!r} is taken by reward_functions[{names[name]}]: give one of them "
                         "a name: {function: ..., name: ...}")
            names.setdefault(name, i)


@dataclass
class TrainerConfig:
    total_epochs: int = 15  # passes over the training data (unless max_steps is set)
    max_steps: Optional[int] = None  # training steps; overrides total_epochs (aliases: total_steps, ...)
    project_name: str = "rllava"  # logger project name
    experiment_name: str = "agent"  # logger run name
    logger: list[str] = field(default_factory=lambda: ["console", "jsonl"])  # console|jsonl|tensorboard|wandb|mlflow|swanlab|trackio (the last three: extras of their names, local / offline by default; docs/experiments.md, "Trackers"); rllava default (RLLaVA: console, tensorboard) needs no extra package
    nnodes: int = 1  # not read: the launcher sets the processes (torchrun --nnodes); a change warns
    n_gpus_per_node: int = 8  # not read: the launcher sets the processes (torchrun --nproc_per_node); a change warns
    accelerate_config: Optional[str] = None  # rllava, actor.strategy=accelerate: an `accelerate config` file read here (accelerate launch --config_file F sets it for you)
    max_try_make_batch: int = 20  # online filtering: max generation rounds per batch; -1 = no limit
    critic_warmup: int = 0  # steps training only the critic
    val_freq: int = -1  # validate every N steps; -1 = never (except val_before_train)
    val_before_train: bool = True  # validate once before the first step
    val_only: bool = False  # validate, then exit
    val_generations_to_log: int = 0  # validation generations per validation to <outputs_dir>/val_generations.jsonl
    save_freq: int = -1  # checkpoint every N steps and at the last step (<dir>/global_step_N); -1 or 0 = never
    save_limit: int = -1  # checkpoints kept, the newest; -1 = all
    save_model_only: bool = False  # save weights only (no optimizer, LR schedule, RNG): resume is then not exact
    outputs_dir: Optional[str] = None  # a run writes <outputs_dir>/<project_name>/<experiment_name>; None = outputs
    save_checkpoint_path: Optional[str] = None  # None = <outputs_dir>/checkpoints
    load_checkpoint_path: Optional[str] = None  # checkpoint to resume from (a global_step_N dir, or a dir of them)
    find_last_checkpoint: bool = True  # resume=auto: resume from the newest checkpoint in save_checkpoint_path
    resume: str = "auto"  # rllava: auto (load_checkpoint_path, else the newest saved: see README) | none | PATH
    overwrite: bool = False  # rllava: a new run into an outputs_dir holding another run's outputs deletes them first
    hf_merge_lora: bool = True  # rllava: LoRA in an HF export: merged into the weights (false: base + adapter/)
    samples_freq: int = 10  # rllava: write sample generations to <outputs_dir>/samples.jsonl every N steps, the first and last step too; -1 = never
    samples_to_log: int = 4  # rllava: generations per write (prompt, images, ground truth, response, reward, parts)
    async_training: bool = False  # overlap rollout and training (rllava.train.async_rl; needs rollout_ranks >= 1, torchrun): the last `rollout_ranks` processes of a torchrun launch generate and score while the others train; batch s is sampled by the weights of update max(0, s-1-max_staleness, the last checkpointed step before s), so max_staleness=0 is the synchronous run
    max_staleness: int = 1  # rllava: updates the sampling policy may lag behind the trained one (async_training; partial_rollout drops older groups)
    rollout_ranks: int = 0  # rllava: processes of the launch that generate (async_training); the others train
    seed: int = 1  # rllava: model-init and sampling RNG seed
    val_greedy: bool = False  # rllava: also validate greedily, logged under val_greedy/
    device: str = "auto"  # rllava: auto | cpu | cuda (auto = cuda when available)
    memory_budget_gb: Optional[float] = None  # rllava: GiB of device memory that the auto micro-batches (actor.ppo_micro_batch_size=auto, ...) are sized for, less a 10 % margin; None = the device's (its per-process memory fraction applied; no GPU: each auto takes its default); a run's config.yaml holds the sizes chosen instead

    def check(self, prefix: str = "trainer") -> list[str]:
        p: list[str] = []
        _positive(p, f"{prefix}.total_epochs", self.total_epochs)
        _positive(p, f"{prefix}.max_steps", self.max_steps, None)
        _positive(p, f"{prefix}.memory_budget_gb", self.memory_budget_gb, None)
        for key in ("project_name", "experiment_name"):  # folders of the outputs: <outputs_dir>/<project>/<exp>
            name = str(getattr(self, key))
            if not name or os.path.isabs(name) or ".." in name.split("/") or name in (".", "./"):
                p.append(f"{prefix}.{key}={name!r} names the run's folder under trainer.outputs_dir: give a "
                         "relative name without '..'")
        _choice(p, f"{prefix}.logger", self.logger,
                ["console", "jsonl", "tensorboard", "wandb", "mlflow", "swanlab", "trackio"], each=True)
        if len(set(self.logger)) != len(self.logger):
            p.append(f"{prefix}.logger={self.logger} lists a logger twice")
        _choice(p, f"{prefix}.device", self.device, ["auto", "cpu", "cuda"], hint=f"for a GPU set {prefix}.device=cuda")
        _nonnegative(p, f"{prefix}.val_generations_to_log", self.val_generations_to_log)
        for name, *allowed in (("save_freq", -1, 0), ("save_limit", -1), ("samples_freq", -1, 0), ("samples_to_log",),
                               ("max_staleness", 0), ("rollout_ranks", 0)):
            _positive(p, f"{prefix}.{name}", getattr(self, name), *allowed)
        if self.async_training and self.rollout_ranks < 1:
            p.append(f"{prefix}.async_training=true generates in processes of their own: set {prefix}.rollout_ranks "
                     "(e.g. 1) and launch with torchrun --nproc_per_node=<trainers + rollout_ranks>")
        if self.rollout_ranks and not self.async_training:
            p.append(f"{prefix}.rollout_ranks={self.rollout_ranks} is for {prefix}.async_training=true; set it, or "
                     f"{prefix}.rollout_ranks=0")
        if self.resume == "none" and self.load_checkpoint_path:
            p.append(f"{prefix}.resume=none contradicts {prefix}.load_checkpoint_path={self.load_checkpoint_path}")
        if self.resume not in ("auto", "none") and self.load_checkpoint_path not in (None, self.resume):
            p.append(f"{prefix}.resume={self.resume} and {prefix}.load_checkpoint_path={self.load_checkpoint_path} "
                     "name different checkpoints: set one")
        return p


# RLLaVA's FSDP offload switches, read by every train engine (single device included).
ENGINE_OFFLOAD_KEYS = ("fsdp.enable_cpu_offload", "fsdp.offload_params", "fsdp.offload_optimizer")

# Accepted for RLLaVA compatibility, not built yet (delete a line when it lands): (key, is_turned_on, value to set)
NOT_BUILT_YET: list[tuple[str, Callable[[Any], bool], str]] = []

# RLLaVA's expert-response dataset classes (its examples/algorithms/sft-rl/custom_datasets.py), read by name (their
# file is not run): RLHFDatasetWithTarget's expert text is the record's `target_key` field (a list: its first item;
# a {"content": ...}: the content), RLHFDatasetWithTargetClevr's is that field + "\n" + the answer. Kwargs, defaults:
RLLAVA_TARGET_DATASETS = ("RLHFDatasetWithTarget", "RLHFDatasetWithTargetClevr")
RLLAVA_TARGET_KWARGS = {"target_key": None, "max_target_length": 8192, "sample_target_ratio": 1.0,
                        "target_list_key": None, "target_probs_key": None, "max_num_targets": 5,
                        "strip_target_think_tag": True}
# RLLaVA's agent-search dataset (its examples/tasks/agent_search/agent_search_dataset.py), read by name too: only
# records whose `solution` field (else data.answer_key) holds a final <answer>...</answer> are kept, and the ground
# truth is the text inside those tags (rllava.data.dataset.final_answer_rows). It takes no dataset_kwargs.
RLLAVA_AGENT_DATASET = "AgentSearchDataset"


def rllava_dataset(spec: str | None) -> str | None:
    """The RLLaVA class `data.dataset_class` names ("path/file.py:Class" or "Class") if rllava reads it, or None."""
    name = (spec or "").rpartition(":")[2]
    return name if name in (*RLLAVA_TARGET_DATASETS, RLLAVA_AGENT_DATASET) else None


def rllava_target_dataset(spec: str | None) -> str | None:
    """The RLLaVA expert-response class `data.dataset_class` names, or None."""
    return name if (name := rllava_dataset(spec)) in RLLAVA_TARGET_DATASETS else None


def agent_on(c) -> bool:
    """Multi-turn agent rollouts (rllava.agent.rollout.AgentRollout): registered tools, or RLLaVA's tool/env files."""
    return bool(c.rollout.agent.tools or c.rollout.tool_config_path or c.rollout.env_config_path
                or c.rollout.agent.program or c.rollout.agent.environment)


# GiGPO's keys at the values that describe what happens without it (RLLaVA's agent scripts set discount=1.0):
# accepted with any estimator; any other value asks for per-turn credit only GiGPO gives.
NO_CREDIT = {"rollout.discount": 1.0, "algorithm.step_advantage_w": 0.0, "algorithm.gigpo_mean_std_cross_steps": False}

# Agent keys: read only when the agent driver runs; a key changed from its default otherwise is an error.
AGENT_KEYS = ["rollout.max_turns", "rollout.discount", "algorithm.step_advantage_w",
              "algorithm.gigpo_mean_std_cross_steps", "rollout.agent.tool_kwargs", "rollout.agent.tool_format",
              "rollout.agent.answer_tag", "rollout.agent.invalid_call_penalty", "rollout.agent.observation_role",
              "rollout.agent.plugins", "rollout.agent.tool_workers", "rollout.agent.round_image_mb",
              "rollout.agent.episode_timeout"]

def _loss_in(*modes: str) -> Callable[[Any], bool]:
    return lambda c: c.actor.policy_loss.loss_mode in modes


HYBRIDS = ("luffy", "srft", "uft", "hpt", "chord")  # the SFT+RL hybrid losses (rllava.algorithms.hybrid registers each)
RESHAPES = ("no_reshape", "logp", "p_logp", "square_root", "pow", "p_div_p_<gamma>")  # rllava.algorithms.hybrid.reshape


# The on-policy shapings whose meaning LUFFY and RLLaVA differ on (rllava.algorithms.hybrid.on_policy_ratio)
ON_POLICY_LUFFY = {"logp": "log r", "p_logp": "r + weight log r", "p_div_p": "f(p) / f(p_old), f(p) = p / (p + gamma)"}


def _is_reshape(kind: str) -> bool:
    """A shaping `rllava.algorithms.hybrid.reshape` knows (p_div_p_<gamma> with gamma a positive number)."""
    if kind.startswith("p_div_p_"):
        try:
            return float(kind[len("p_div_p_"):]) > 0
        except ValueError:
            return False
    return kind in RESHAPES[:-1]
# SFT+RL hybrid keys: (keys, is read in this config, who reads them); changed in a run that does not read it: an error
HYBRID_READERS: list[tuple[list[str], Callable[[Any], bool], str]] = [
    (["actor.loss_remove_clip", "data.expert_template"], _loss_in(*HYBRIDS),
     "SFT+RL hybrids (actor.policy_loss.loss_mode=luffy|srft|uft|hpt|chord)"),
    (["actor.off_policy_reshape", "actor.off_policy_reshape_weight", "actor.off_policy_reshape_pow_exp",
      "actor.off_policy_max_clip", "actor.off_policy_min_clip", "actor.all_max_clip"], _loss_in("luffy", "srft"),
     "LUFFY and SRFT (actor.policy_loss.loss_mode=luffy|srft)"),
    (["actor.on_policy_reshape", "actor.on_policy_reshape_weight", "actor.on_policy_reshape_pow_exp"],
     _loss_in("luffy"), "LUFFY (actor.policy_loss.loss_mode=luffy)"),
    (["actor.srft_type"], _loss_in("srft"), "SRFT (actor.policy_loss.loss_mode=srft)"),
    (["actor.clip_upper_bound"], lambda c: _loss_in("srft")(c) and c.actor.srft_type == "classic_rl",
     "SRFT's ratio term (actor.policy_loss.loss_mode=srft, actor.srft_type=classic_rl)"),
    (["actor.sft_loss_coef"], _loss_in("hpt", "uft", "srft"),
     "the SFT term of HPT, UFT and SRFT (actor.policy_loss.loss_mode=hpt|uft|srft; CHORD's is algorithm.mu_*)"),
    (["algorithm.use_token_level_loss_in_sft"], _loss_in("hpt", "uft", "srft", "chord"),
     "the SFT term of HPT, UFT, SRFT and CHORD"),
    (["algorithm.expert_data_ratio", "algorithm.mu_warmup_steps", "algorithm.mu_decay_steps", "algorithm.mu_peak",
      "algorithm.mu_valley", "algorithm.enable_phi_function", "data.expert_files", "data.expert_batch_size"],
     _loss_in("chord"), "CHORD (actor.policy_loss.loss_mode=chord or algorithm.strategy=mix_chord)"),
    (["algorithm.unify_strategy"], _loss_in("hpt"), "HPT (actor.policy_loss.loss_mode=hpt)"),
    (["algorithm.switch_gate"], lambda c: c.algorithm.unify_strategy != "none", "HPT's algorithm.unify_strategy=switch|soft"),
    (["algorithm.success_reward_threshold"], lambda c: c.algorithm.unify_strategy != "none" or _loss_in("srft")(c),
     "HPT's algorithm.unify_strategy=switch|soft and SRFT (actor.policy_loss.loss_mode=srft)"),
    (["algorithm.prefix_strategy"], _loss_in("luffy", "srft", "uft"),
     "LUFFY, SRFT and UFT (actor.policy_loss.loss_mode=luffy|srft|uft)"),
    (["algorithm.min_prefix_ratio", "algorithm.max_prefix_ratio", "algorithm.n_prefix",
      "algorithm.prefix_share_across_samples"], lambda c: c.algorithm.prefix_strategy != "none",
     "algorithm.prefix_strategy=random|hint"),
    (["algorithm.hint_steps", "algorithm.hint_chunks"], lambda c: c.algorithm.prefix_strategy == "hint",
     "UFT's algorithm.prefix_strategy=hint"),
]
# Declared in RLLaVA's schema, read by none of its code: a change would do nothing there; here it is an error.
UNREAD_RLLAVA_KEYS = ["actor.off_policy_cliprange", "actor.off_policy_normalize", "actor.hpt_hint_loss_coef"]

# RLLaVA keys whose value rllava reads from another key: a change is an error naming that key.
REDIRECTED_KEYS = {
    "rollout.vllm.model": "actor.model.model_path", "rollout.vllm.seed": "rollout.seed",
    "rollout.vllm.load_format": "rollout.load_format", "rollout.vllm.chat_template": "data.override_chat_template",
    "algorithm.hint_min_ratio": "algorithm.min_prefix_ratio", "algorithm.hint_max_ratio": "algorithm.max_prefix_ratio",
    "algorithm.clip_range": "actor.clip_ratio",
}

# Tuning keys with nothing to tune in rllava: accepted; a change warns, saying why. (key, is_changed, why)
NO_EFFECT_KEYS: list[tuple[str, Callable[[Any], bool], str]] = [
    ("actor.use_torch_compile", lambda v: v, "rllava runs eager PyTorch (no torch.compile)"),
    *[(f"{role}.fsdp.use_orig_params", lambda v: v, "an FSDP1 switch: FSDP2 always trains the original parameters")
      for role in ("actor", "critic")],
    ("actor.model.tie_word_embeddings", lambda v: v,
     "the checkpoint's config decides tying (RLLaVA read it only to pick meta-device init)"),
    ("data.num_workers", lambda v: v > 0, "batches are encoded in the training process"),
    ("data.filter_overlong_prompts_workers", lambda v: v > 1, "overlong prompts are filtered in the training process"),
    ("rollout.disable_tqdm", lambda v: v, "rllava shows no generation progress bar"),
    ("trainer.nnodes", lambda v: v != 1, "the launcher sets the processes (torchrun --nnodes)"),
    ("trainer.n_gpus_per_node", lambda v: v != 8, "the launcher sets the processes (torchrun --nproc_per_node)"),
]

# Rollout keys only some engines read: changed while another engine runs, they are ignored with a warning.
ENGINE_ONLY_KEYS = {"vllm": ["rollout.vllm.", "rollout.load_format", "rollout.bucket_size"],
                    "sglang": ["rollout.sglang.", "rollout.load_format", "rollout.bucket_size"],
                    "hf": ["rollout.micro_batch_size", "rollout.hf_decode"]}

# RLLaVA copies these values into rollout.* in post_init; rllava keeps one owner per value.
DERIVED_KEYS = {
    "rollout.prompt_length": "data.max_prompt_length", "rollout.response_length": "data.max_response_length",
    "rollout.trust_remote_code": "actor.model.trust_remote_code", "rollout.adv_estimator": "algorithm.adv_estimator",
    **{f"rollout.{key}": f"data.{key}" for key in ("min_pixels", "max_pixels", "video_fps")}}


def get_key(cfg: Any, dotted: str) -> Any:
    return functools.reduce(getattr, dotted.split("."), cfg)


def _default_of(dotted: str) -> Any:
    """The schema default of a key whose sections all have defaults (not under critic)."""
    section, _, leaf = dotted.rpartition(".")
    obj = get_key(_DEFAULTS, section) if section else _DEFAULTS
    return getattr(type(obj)(), leaf)


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
        if self.algorithm.strategy == "mix_chord" and self.actor.policy_loss.loss_mode == "vanilla":
            self.actor.policy_loss.loss_mode = "chord"  # RLLaVA's CHORD task selects CHORD this way
        d, kw = self.data, self.data.dataset_kwargs or {}
        target_class = rllava_target_dataset(d.dataset_class)
        if target_class and isinstance(kw.get("target_key"), str):
            # RLLaVA's expert-response datasets as rllava's keys: the field (the Clevr class: field + "\n" + answer)
            if target_class == "RLHFDatasetWithTargetClevr":
                d.expert_template = d.expert_template or "{{ %s }}\n{{ answer }}" % kw["target_key"]
            else:
                d.target_key = d.target_key or kw["target_key"]
        if _DEFAULTS is not None:  # the defaults themselves are built once, unvalidated, to read defaults from
            self.validate()

    def validate(self) -> None:
        """Raise one ConfigError listing every problem; warn about keys the chosen strategy ignores."""
        p = [line for name in ("data", "algorithm", "actor", "ref", "rollout", "reward", "trainer", "critic")
             if getattr(self, name) is not None for line in getattr(self, name).check(name)]
        if self.critic is not None and self.critic.model.ulysses_size != self.actor.model.ulysses_size:
            p.append(f"critic.model.ulysses_size={self.critic.model.ulysses_size}: the critic runs in the actor's "
                     f"sequence-parallel groups; set it to actor.model.ulysses_size={self.actor.model.ulysses_size}")
        if self.actor.ppo_mini_batch_size > 0 and self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            p.append(f"data.train_batch_size={self.data.train_batch_size} must be a multiple of "
                     f"actor.ppo_mini_batch_size={self.actor.ppo_mini_batch_size} (both count prompts)")
        p += [f"{key}={_show(get_key(self, key))} is read from {owner}={_show(get_key(self, owner))} in rllava; "
              f"set {owner} instead" for key, owner in DERIVED_KEYS.items()
              if get_key(self, key) not in (_default_of(key), get_key(self, owner))]
        p += self._dataset_class_problems() + [
            f"{key}={_show(get_key(self, key))} is not available yet in rllava; set {key}={off}"
            for key, is_on, off in NOT_BUILT_YET if is_on(get_key(self, key))]
        p += [f"{key}={_show(get_key(self, key))} is not read in rllava; set {instead} instead"
              for key, instead in REDIRECTED_KEYS.items() if get_key(self, key) != _default_of(key)]
        strategy = resolve_strategy(self.actor.strategy, fsdp=self.actor.fsdp, device=self.trainer.device)
        p += (self._hybrid_problems() + self._agent_problems() + self._reference_problems(strategy)
              + self._async_problems() + self._distill_problems(strategy) + self._decode_problems(strategy))
        if self.actor.policy_loss.loss_mode == "decoupled_ppo" and (
                self.algorithm.rollout_is != "none" or self.actor.tis_imp_ratio_cap > 0):
            p.append("actor.policy_loss.loss_mode=decoupled_ppo already weights each token by pi_old / pi_rollout: "
                     "leave algorithm.rollout_is=none and actor.tis_imp_ratio_cap=-1 (algorithm.rollout_rs composes)")
        accelerate = "accelerate" in {self.actor.strategy, self.critic and self.critic.strategy}
        autos = [getattr(self.actor, k) for k in AUTO_SIZES] + [self.actor.fsdp.keep_gathered_units]
        if self.trainer.memory_budget_gb is not None and "auto" not in autos:
            p.append(f"trainer.memory_budget_gb={self.trainer.memory_budget_gb} sizes the auto micro-batches: set "
                     "actor.ppo_micro_batch_size=auto (or log_prob_micro_batch_size, the *_max_token_len_per_gpu "
                     "budgets, actor.fsdp.keep_gathered_units), or drop the key")
        if self.trainer.accelerate_config and not accelerate:
            p.append("trainer.accelerate_config is read by actor.strategy=accelerate only: set it, or drop the key")
        if p:
            raise ConfigError(p)
        ignored = {f"{role}.strategy={section.strategy}": section.ignored_keys(role)
                   for role, section in (("actor", self.actor), ("critic", self.critic)) if section is not None}
        # rollout keys changed from their defaults although the chosen engine does not read them
        others = set(sum(ENGINE_ONLY_KEYS.values(), [])) - set(ENGINE_ONLY_KEYS.get(self.rollout.name, ()))
        ignored[f"rollout.name={self.rollout.name}"] = [
            key for key in LEAVES if any(key == o or (o.endswith(".") and key.startswith(o)) for o in others)
            and get_key(self, key) != _default_of(key) and key not in REDIRECTED_KEYS] + (
            ["rollout.tensor_parallel_size"] if self.rollout.name == "hf" and self.rollout.tensor_parallel_size != 1
            else [])
        for chosen, keys in ignored.items():  # warnings: only about keys the user set (USER_KEYS)
            keys = [k for k in keys if _said(k) and k not in {key for key, _, _ in NO_EFFECT_KEYS}]  # warned below
            if keys:
                warnings.warn(f"{', '.join(keys)} ignored: {chosen}", stacklevel=2)
        for key, is_on, why in NO_EFFECT_KEYS:
            if (self.critic is not None or not key.startswith("critic.")) and is_on(get_key(self, key)) and _said(key):
                warnings.warn(f"{key}={_show(get_key(self, key))} has no effect: {why}", stacklevel=2)

    def _reference_problems(self, strategy: str) -> list[str]:
        """A reset needs a reference model of its own; the full-vocabulary KL needs both LM heads whole (single)."""
        a, p = self.algorithm, []
        kl_loss = a.use_kl_loss and self.actor.kl_loss_coef > 0
        if a.ref_reset_freq > 0 and not (kl_loss or a.use_kl_in_reward):
            p.append(f"algorithm.ref_reset_freq={a.ref_reset_freq} resets the reference policy, but this run has none "
                     "(algorithm.use_kl_loss=false or actor.kl_loss_coef=0, and algorithm.use_kl_in_reward=false): "
                     "turn a KL on or leave algorithm.ref_reset_freq=0")
        if a.ref_reset_freq > 0 and self.actor.model.use_peft:
            p.append(f"algorithm.ref_reset_freq={a.ref_reset_freq} with actor.model.use_peft=true: under LoRA the "
                     "reference is the base model with the adapters off, which a reset cannot move; leave "
                     "algorithm.ref_reset_freq=0 or train every weight (actor.model.use_peft=false)")
        for key, on in (("algorithm.kl_penalty", a.use_kl_in_reward and a.kl_penalty == "full"),
                        ("actor.kl_loss_type", kl_loss and self.actor.kl_loss_type == "full")):
            if on and strategy != "single":
                p.append(f"{key}=full with actor.strategy={self.actor.strategy} (the {strategy} engine): the "
                         "full-vocabulary KL runs on the single-device engine only (it needs both LM heads whole; "
                         f"FSDP2 and DeepSpeed shard them); use {key}=low_var_kl")
        return p

    def _distill_problems(self, strategy: str) -> list[str]:
        """algorithm.distill with the run's engine (exact KL: whole LM heads), temperature, agents and hybrids."""
        d, p = self.algorithm.distill, []
        if not d.on:
            return p
        mode = self.actor.policy_loss.loss_mode
        if d.loss == "full" and strategy != "single":
            p.append(f"algorithm.distill.loss=full with actor.strategy={self.actor.strategy} (the {strategy} engine): "
                     "the full-vocabulary KL runs on the single-device engine only (it needs both LM heads whole); "
                     "use algorithm.distill.loss=k1 (or k3)")
        if d.engine != "hf" and self.rollout.temperature != 1.0:
            p.append(f"algorithm.distill.engine={d.engine} returns the teacher's log-probs at temperature 1, and the "
                     f"student's are at rollout.temperature={self.rollout.temperature}: use algorithm.distill.engine=hf "
                     "(it scores at the rollout temperature) or rollout.temperature=1.0")
        if d.engine != "hf" and agent_on(self):
            p.append(f"algorithm.distill.engine={d.engine} scores single-turn responses; agent episodes (observations "
                     "between turns) are scored by the teacher in the trainer: algorithm.distill.engine=hf")
        if mode in HYBRIDS:
            p.append(f"algorithm.distill with actor.policy_loss.loss_mode={mode}: an SFT+RL hybrid already trains on "
                     "expert tokens; distil with a plain RL loss (e.g. vanilla)")
        return p

    def _async_problems(self) -> list[str]:
        """Async and partial rollouts: no hybrid's expert side (the trainers and rollout ranks would both hold it)."""
        mode, r, p = self.actor.policy_loss.loss_mode, self.rollout, []
        if self.trainer.async_training and mode in HYBRIDS:
            p.append(f"trainer.async_training=true with actor.policy_loss.loss_mode={mode}: the SFT+RL hybrids run "
                     "synchronously for now; set trainer.async_training=false")
        if r.partial_rollout and mode in HYBRIDS:
            p.append(f"rollout.partial_rollout=true with actor.policy_loss.loss_mode={mode}: a hybrid's responses "
                     "start with expert tokens drawn each step; set rollout.partial_rollout=false")
        if r.partial_rollout and (r.tool_config_path or r.env_config_path):
            p.append("rollout.partial_rollout=true pauses agent episodes between turns and checkpoints them as data; "
                     "the tool / environment classes of rollout.tool_config_path / env_config_path are objects: use "
                     "rollout.agent.tools, or set rollout.partial_rollout=false")
        if r.partial_rollout_tokens and agent_on(self):
            p.append(f"rollout.partial_rollout_tokens={r.partial_rollout_tokens}: agent episodes pause between turns "
                     "(a round is one turn); leave rollout.partial_rollout_tokens=0")
        if r.partial_rollout and r.async_mode and agent_on(self):
            p.append("rollout.partial_rollout=true writes agent episodes in rounds of one turn; rollout.async_mode=true "
                     "runs them without rounds: set one of the two")
        if r.async_mode and r.name == "hf" and not agent_on(self):
            p.append("rollout.async_mode=true keeps a vLLM / SGLang engine awake between rollouts and lets agent "
                     "episodes go on without rounds; a single-turn rollout.name=hf run has neither (to overlap "
                     "rollout and training: trainer.async_training=true); set rollout.async_mode=false")
        _nonnegative(p, "rollout.partial_rollout_tokens", r.partial_rollout_tokens,
                     "0 = a quarter of data.max_response_length")
        if r.partial_rollout_tokens and not r.partial_rollout:
            p.append(f"rollout.partial_rollout_tokens={r.partial_rollout_tokens} is for "
                     "rollout.partial_rollout=true; set it, or leave rollout.partial_rollout_tokens=0")
        return p

    def _decode_problems(self, strategy: str) -> list[str]:
        """rollout.hf_decode=compiled: CUDA graphs of the decode step, on the single-device engine's whole weights
        (a CUDA device that `auto` did not find is the builder's error)."""
        if self.rollout.name != "hf" or self.rollout.hf_decode != "compiled":
            return []
        if self.trainer.device == "cpu":
            return ["rollout.hf_decode=compiled compiles the decode step for CUDA graphs, and trainer.device=cpu: "
                    "use rollout.hf_decode=static (the same cache, no compile) or eager"]
        return [] if strategy == "single" else [
            f"rollout.hf_decode=compiled with the {strategy} engine (actor.strategy={self.actor.strategy}): the "
            "compiled decode is built for the single-device engine's whole weights, not yet for sharded ones; use "
            "rollout.hf_decode=static or eager"]

    def _hybrid_problems(self) -> list[str]:
        """SFT+RL hybrid keys, read only by their loss / strategy (HYBRID_READERS); each hybrid needs expert tokens."""
        a, mode, p = self.algorithm, self.actor.policy_loss.loss_mode, []
        if a.strategy == "mix_chord" and mode != "chord":
            p.append(f"algorithm.strategy=mix_chord is CHORD: it contradicts actor.policy_loss.loss_mode={mode} "
                     "(set loss_mode=chord or leave it at vanilla)")
        p += self._leave(self._changed(UNREAD_RLLAVA_KEYS),
                         "is declared by RLLaVA but read by none of its losses (nor by rllava's)")
        for keys, reads, who in HYBRID_READERS:
            if not reads(self):
                p += self._leave(self._changed(keys), f"is read only by {who} (this run: actor.policy_loss.loss_mode="
                                 f"{mode}, algorithm.prefix_strategy={a.prefix_strategy}, algorithm.unify_strategy="
                                 f"{a.unify_strategy})")
        for key in ("actor.off_policy_reshape", "actor.on_policy_reshape"):
            value = get_key(self, key)
            own = key == "actor.on_policy_reshape" and isinstance(value, str) and value.startswith("rllava_")
            if value is not None and not _is_reshape(value[len("rllava_"):] if own else value):
                more = " (or RLLaVA's rllava_logp, rllava_p_logp, rllava_p_div_p_<gamma>)" if "on_" in key else ""
                p.append(f"{key}={value} is not a shaping: one of {', '.join(RESHAPES)}{more} (e.g. p_div_p_0.1)")
        shaped = self.actor.on_policy_reshape
        kind = "p_div_p" if shaped.startswith("p_div_p_") else shaped
        if kind in ON_POLICY_LUFFY and _said("actor.on_policy_reshape"):
            warnings.warn(f"actor.on_policy_reshape={shaped} shapes the own ratio r = p / p_old as LUFFY does "
                          f"({ON_POLICY_LUFFY[kind]}); RLLaVA's meaning is actor.on_policy_reshape=rllava_{shaped}",
                          stacklevel=3)
        _choice(p, "actor.srft_type", self.actor.srft_type, ["paper", "exp", "classic_rl", "minus_old"])
        if mode not in HYBRIDS:
            return p
        if self.critic is not None:
            p.append(f"actor.policy_loss.loss_mode={mode} (an SFT+RL hybrid) runs without a critic: set critic=null "
                     "and a group estimator (algorithm.adv_estimator=grpo)")
        if mode in ("luffy", "srft", "uft") and a.prefix_strategy == "none":
            p.append(f"actor.policy_loss.loss_mode={mode} trains on expert prefixes: set algorithm.prefix_strategy="
                     f"{'hint (UFT' if mode == 'uft' else 'random (LUFFY, SRFT'}: docs/algorithms.md)")
        if mode == "hpt" and a.unify_strategy == "none":
            p.append("actor.policy_loss.loss_mode=hpt trains on demonstrations where a prompt is unsolved: set "
                     "algorithm.unify_strategy=switch (or soft: always)")
        if a.prefix_strategy == "hint" and a.hint_steps <= 0:
            p.append("algorithm.prefix_strategy=hint needs algorithm.hint_steps > 0: the steps over which the hint "
                     "fades (UFT: 300 of 500)")
        if not self.data.target_key and not self.data.expert_template:
            p.append(f"actor.policy_loss.loss_mode={mode} (an SFT+RL hybrid) needs expert responses: set "
                     "data.target_key (the record field holding one) or data.expert_template (Jinja over `answer`)")
        return p

    def _dataset_class_problems(self) -> list[str]:
        """data.dataset_class / dataset_kwargs: RLLaVA's expert-response and agent-search dataset classes, by name."""
        d, kw = self.data, self.data.dataset_kwargs or {}
        name = rllava_dataset(d.dataset_class)
        if d.dataset_class is None:
            return ["data.dataset_kwargs is read only by data.dataset_class; leave it at null"] if kw else []
        if name is None:
            return [f"data.dataset_class={d.dataset_class}: rllava runs no dataset class of a file; it reads RLLaVA's "
                    f"classes by name ({', '.join((*RLLAVA_TARGET_DATASETS, RLLAVA_AGENT_DATASET))}). Put the fields "
                    "in the records and name them with data.prompt_key / answer_key / image_key / target_key, or "
                    "build the expert text with data.expert_template (a Jinja template over the record's fields)"]
        if name == RLLAVA_AGENT_DATASET:
            return [f"data.dataset_kwargs: RLLaVA's {name} takes none; leave it at null"] if kw else []
        p = [f"data.dataset_kwargs.{k}: not a key of RLLaVA's {name} (keys: {', '.join(RLLAVA_TARGET_KWARGS)})"
             for k in kw if k not in RLLAVA_TARGET_KWARGS]
        if not isinstance(kw.get("target_key"), str):
            p.append(f"data.dataset_class=...:{name} needs data.dataset_kwargs.target_key: the record field holding "
                     "the expert response")
        for k, default in RLLAVA_TARGET_KWARGS.items():
            if k not in ("target_key", "max_target_length", "strip_target_think_tag") and kw.get(k, default) != default:
                p.append(f"data.dataset_kwargs.{k}={kw[k]!r} is not available yet in rllava (RLLaVA's {name}: "
                         f"several or sampled targets); leave it at {_show(default)}")
        target = kw.get("target_key")
        if name != "RLHFDatasetWithTargetClevr" and d.target_key not in (None, target):
            p.append(f"data.target_key={d.target_key} and data.dataset_kwargs.target_key={target} name different "
                     "fields: set one")
        if not isinstance(kw.get("max_target_length", 1), int) or kw.get("max_target_length", 1) <= 0:
            p.append(f"data.dataset_kwargs.max_target_length={kw['max_target_length']!r} must be a positive integer")
        return p

    def _agent_problems(self) -> list[str]:
        if not agent_on(self):
            if self.algorithm.adv_estimator == "gigpo":
                return ["algorithm.adv_estimator=gigpo credits the turns of agent rollouts: set rollout.agent.tools"]
            return self._leave([k for k in AGENT_KEYS if get_key(self, k) not in (_default_of(k), NO_CREDIT.get(k))],
                               "is read only by agent rollouts (set rollout.agent.tools, e.g. [search, zoom])")
        credit = [] if self.algorithm.adv_estimator == "gigpo" else [
            k for k in NO_CREDIT if get_key(self, k) not in (_default_of(k), NO_CREDIT[k])]
        p = self._leave(credit, "is read only by GiGPO's per-turn credit (algorithm.adv_estimator=gigpo)")
        given = [k for k in ("rollout.agent.tools", "rollout.tool_config_path", "rollout.env_config_path")
                 if get_key(self, k)]
        own = self.rollout.agent.own()  # a program or an environment: its own tools, calls and observations
        if len(given) > 1:
            p.append(f"{given[0]} and {given[1]} both pick the agent's tools: set one")
        elif own:
            p += self._leave(self._changed([k for k in AGENT_KEYS if k.startswith("rollout.agent.") and
                                            k != "rollout.agent.episode_timeout"]),
                             f"is read only by rllava's tools, not by rollout.agent.{own}")
            if self.rollout.agent.environment and (self.data.train_files or self.data.val_files):
                p.append("rollout.agent.environment brings its records (its dataset, and eval_dataset for "
                         "validation): unset data.train_files and data.val_files")
        elif not self.rollout.agent.tools:  # class files: the tools parse their own calls and take their own config
            p += self._leave(self._changed(["rollout.agent.tool_kwargs", "rollout.agent.tool_format"]),
                             f"is read only by registered tools (rollout.agent.tools), not by {given[0]}'s classes")
        if self.algorithm.prefix_strategy != "none":
            p.append(f"algorithm.prefix_strategy={self.algorithm.prefix_strategy} (expert prefixes of LUFFY, SRFT, "
                     "UFT) is for single-turn responses, not agent rollouts (rollout.agent.tools)")
        return p

    def _changed(self, keys) -> list[str]:
        return [key for key in keys if get_key(self, key) != _default_of(key)]

    def _leave(self, keys, why: str) -> list[str]:
        return [f"{key}={_show(get_key(self, key))} {why}; leave it at {_show(_default_of(key))}" for key in keys]


# The keys the user set (the command line, a config file not shipped in examples/), while `load_config` validates:
# a key the run ignores is warned about only if the user set it (RLLaVA's base config sets vLLM keys a CPU run
# never reads). None (outside load_config, e.g. a PPOConfig built in Python): every key.
USER_KEYS: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar("rllava_user_keys", default=None)


def _said(key: str) -> bool:
    keys = USER_KEYS.get()
    return keys is None or key in keys or any(key.startswith(k + ".") or k.startswith(key + ".") for k in keys)


_DEFAULTS: Any = None
_DEFAULTS = PPOConfig()


def _is_optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _walk(cls: type, prefix: str, leaves: dict[str, Any], sections: dict[str, bool]) -> None:
    """Fill `leaves` (leaf key -> type hint) and `sections` (section key -> optional) for every field, recursively."""
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        key, tp = prefix + f.name, hints[f.name]
        if is_dataclass(_strip_optional(tp)):
            sections[key] = _is_optional(tp)
            _walk(_strip_optional(tp), key + ".", leaves, sections)
        else:
            leaves[key] = tp


LEAVES: dict[str, Any] = {}
SECTIONS: dict[str, bool] = {}
_walk(PPOConfig, "", LEAVES, SECTIONS)
