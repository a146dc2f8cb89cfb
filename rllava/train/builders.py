"""Plain functions from config sections to the objects every pipeline (RLVR, SFT, hybrids, agents) runs: device,
model, engines, roles, data. None of them holds a loop."""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import random

import numpy as np
import torch
import transformers
from omegaconf import OmegaConf

from rllava import distributed as D
from rllava.agent import code as _code  # noqa: F401  (registers the code tool)
from rllava.agent import search as _search  # noqa: F401  (registers the search tool)
from rllava.agent.classes import ClassEnv, ClassToolsEnv
from rllava.agent.program import ProgramRollout, ProgramScore
from rllava.agent.verifiers_env import environment_program, environment_records, load_verifiers_env
from rllava.agent.rollout import AgentRollout
from rllava.agent.tools import ToolEnv, build_tools
from rllava.algorithms.curriculum import sampler_class
from rllava.algorithms.hybrid import HYBRID_LOSSES
from rllava.algorithms.kl import KLController
from rllava.algorithms.ppo import build_algorithm, load_plugins
from rllava.algorithms.registry import DISTILL_LOSSES, LOSS_TERMS, lookup, register_scorer
from rllava.config import ConfigError, ModelConfig, PPOConfig
from rllava.config.schema import agent_on, resolve_strategy, run_dir
from rllava.data.dataset import PromptDataset, load_template
from rllava.data.protocol import Batch
from rllava.data.reasoning_gym import is_reasoning_gym, task_dataset
from rllava.data.records import check_local
from rllava.data.sampler import EpochSampler
from rllava.engine.inference.base import SamplingParams, build_rollout_engine, engine_for
from rllava.engine.train.base import TrainEngine
from rllava.engine.train.single import SingleDeviceEngine
from rllava.model import ulysses
from rllava.model.loader import build_policy, load_frozen, load_model, make_trainable, resolve_dtype
from rllava.model.value import ValueModel
from rllava.model.processor import get_tokenizer, load_processor
from rllava.reward.function import RewardFunction, load_reward_function
from rllava.reward.reasoning_gym import ReasoningGymScore, uses_reasoning_gym
from rllava.reward.models import build_model_reward, model_sources
from rllava.reward.scoring import Scoring
from rllava.roles.actor import Actor, Distillation, ExpertLoss, MicroBatching
from rllava.roles.critic import Critic
from rllava.roles.reference import Reference, weight_shapes
from rllava.roles.rollout import Rollout
from rllava.roles.teacher import DEFAULT, EngineTeacher, Teachers, layout_mismatch, tokenizer_mismatch
from rllava.train.scorers import Parts, Scorer, build_scorers
from rllava.train.tracker import Tracker

log = logging.getLogger(__name__)

def setup_run(cfg: PPOConfig) -> tuple[torch.device, str]:
    """Seed every RNG and pick the device; nothing is written (outputs_dir gets its files from the first step on)."""
    rollout_side = D.split_roles(cfg.trainer.rollout_ranks if cfg.trainer.async_training else 0) == "rollout"
    world = int(os.environ.get("WORLD_SIZE", "1"))  # of this role's own world (trainers, or rollout ranks)
    if world > 1 and not rollout_side:
        check_world_size(cfg, world)
    if rollout_side and cfg.data.train_batch_size % world:  # the rollout ranks share each batch's prompts
        raise ConfigError(f"data.train_batch_size={cfg.data.train_batch_size} must be a multiple of "
                          f"trainer.rollout_ranks={world} (each rollout process samples a share)")
    random.seed(cfg.trainer.seed)  # the same on every rank: models (LoRA, value heads) start identical
    np.random.seed(cfg.trainer.seed)
    torch.manual_seed(cfg.trainer.seed)
    device = D.init(cfg.trainer.device)  # joins the process group under torchrun
    if (sp := cfg.actor.model.ulysses_size) > 1 and not rollout_side:  # the sequence-parallel groups
        if world % sp or world == 1:
            raise ConfigError(f"actor.model.ulysses_size={sp} splits each sequence over {sp} processes: launch "
                              f"torchrun with a multiple of {sp} training processes (now {world})")
        ulysses.init(sp)
    strategies = {resolve_strategy(r.strategy, fsdp=r.fsdp, device=device) for r in (cfg.actor, cfg.critic) if r}
    if world == 1 and strategies & set(DISTRIBUTED_STRATEGIES) and not rollout_side:
        D.group_of_one(device)  # `actor.strategy=fsdp2`, or auto with host offload on a GPU: a world of one
    return device, run_outputs_dir(cfg)


DISTRIBUTED_STRATEGIES = ("fsdp", "fsdp2", "deepspeed", "accelerate")


def run_outputs_dir(cfg: PPOConfig) -> str:
    return run_dir(cfg.trainer.outputs_dir, cfg.trainer.project_name, cfg.trainer.experiment_name)


def check_world_size(cfg: PPOConfig, world: int) -> None:
    """Under torchrun every rank takes an equal share of each batch of prompts and of each mini-batch."""
    if resolve_strategy(cfg.actor.strategy, world) not in DISTRIBUTED_STRATEGIES:
        raise ConfigError(f"launched with {world} processes but actor.strategy={cfg.actor.strategy} runs on one "
                          "device; set actor.strategy=fsdp2 (or deepspeed, or auto) or use --nproc_per_node=1")
    if cfg.critic is not None and resolve_strategy(cfg.critic.strategy, world) not in DISTRIBUTED_STRATEGIES:
        raise ConfigError(f"launched with {world} processes: set critic.strategy={cfg.actor.strategy} as well")
    for key, value in (("data.train_batch_size", cfg.data.train_batch_size),
                       ("actor.ppo_mini_batch_size", cfg.actor.ppo_mini_batch_size)):
        if value % world:
            raise ConfigError(f"{key}={value} must be a multiple of the {world} processes (each takes a share)")


def seed_sampling(cfg: PPOConfig) -> None:
    """After the models are built: each rank draws its own samples (offset seed per rank)."""
    torch.manual_seed(cfg.trainer.seed + D.rank())


def build_tracker(cfg: PPOConfig, outputs_dir: str) -> Tracker:
    return Tracker(cfg.trainer.logger if D.is_main() else None, outputs_dir, cfg.trainer.project_name,
                   cfg.trainer.experiment_name, OmegaConf.to_container(OmegaConf.structured(cfg)))


def validates(cfg: PPOConfig) -> bool:
    return cfg.trainer.val_freq > 0 or cfg.trainer.val_before_train or cfg.trainer.val_only


def check_data_paths(cfg: PPOConfig, given=(None, None)) -> None:
    """The data files `build_datasets` will read that look local but are missing (and a named validation set's
    format_prompt): one line, before the model loads."""
    if given[0] is None:
        check_source(cfg.data.train_files, "data.train_files")
    if given[1] is not None or not validates(cfg):
        return
    sets = cfg.data.val_sets()
    if sets is None and cfg.data.val_files:
        check_source(cfg.data.val_files, "data.val_files")
    for name, entry in (sets or {}).items():  # each named set's records, and its own template
        check_source(entry["path"], f"data.val_files.{name}.path")
        load_template(entry.get("format_prompt"), f"data.val_files.{name}.format_prompt")


def check_source(spec: str, key: str) -> None:
    """A reasoning_gym: spec names a task and parameters it takes; a local-looking path exists."""
    if is_reasoning_gym(spec):
        task_dataset(spec, key)
    else:
        check_local(spec, f"{key}={spec}")


def build_datasets(cfg: PPOConfig, processor, target_key: str | None = None, given=(None, None)):
    """(train, val or None); val only when the run validates (no network for an unused hub val set), a dict
    {name: PromptDataset} for data.val_files' named sets. `given`: (train, val) from the Python API, each None
    (data.*_files), a PromptDataset (as built) or records (checked as a file's)."""
    if cfg.data.override_chat_template:
        processor.chat_template = cfg.data.override_chat_template
    if cfg.rollout.agent.environment:  # a verifiers env's dataset / eval_dataset (rllava.agent.verifiers_env)
        given = environment_datasets(cfg)
    limit = cfg.rollout.limit_images  # the reference responses are read from the training records only

    def dataset(files, records, name, image_dir, key, **kw):
        if isinstance(records, PromptDataset):
            return records
        return PromptDataset(name if records is not None else files, cfg.data, processor, image_dir=image_dir,
                             limit_images=limit, records=records, key=key, **kw)

    train = dataset(cfg.data.train_files, given[0], "train_dataloader", cfg.data.train_image_dir, "data.train_files",
                    target_key=target_key)
    sets, val = cfg.data.val_sets(), {}
    if not validates(cfg) or (given[1] is None and not cfg.data.val_files):
        return train, None
    if given[1] is not None or sets is None:
        return train, dataset(cfg.data.val_files, given[1], "val_dataloader", cfg.data.val_image_dir, "data.val_files")
    for name, entry in sets.items():  # each named set reads its own keys where it gives them
        own = {k: entry[k] for k in ("format_prompt", "prompt_key", "answer_key", "image_key")
               if entry.get(k) is not None}
        val[name] = PromptDataset(entry["path"], dataclasses.replace(cfg.data, **own), processor, limit_images=limit,
                                  image_dir=entry.get("image_dir") or cfg.data.val_image_dir,
                                  key=f"data.val_files.{name}.path")
    return train, val


def environment_datasets(cfg: PPOConfig) -> tuple[list[dict], list[dict] | None]:
    """rollout.agent.environment's records: its dataset (an error without one), its eval_dataset (or None)."""
    spec, d = cfg.rollout.agent.environment, cfg.data
    env = load_verifiers_env(spec, cfg.rollout.agent.environment_kwargs)
    train, val = (environment_records(env, split, d.prompt_key, d.answer_key) for split in ("train", "eval"))
    if train is None:
        raise ConfigError(f"rollout.agent.environment={spec}: the environment has no dataset to train on")
    if val is None and validates(cfg):
        raise ConfigError(f"rollout.agent.environment={spec}: the environment has no eval_dataset to validate on: "
                          "give it one, or set trainer.val_freq=-1 and trainer.val_before_train=false")
    return train, val


def total_steps(cfg: PPOConfig, sampler: EpochSampler) -> int:
    return cfg.trainer.max_steps if cfg.trainer.max_steps else cfg.trainer.total_epochs * len(sampler)


def sampling_params(cfg: PPOConfig, validation: bool = False) -> SamplingParams:
    """Rollout sampling; validation applies rollout.val_override_config on top (RLLaVA: greedy, n=1)."""
    p = dict(n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
             top_k=cfg.rollout.top_k, max_new_tokens=cfg.data.max_response_length)
    if validation:
        unknown = set(cfg.rollout.val_override_config) - set(p)
        if unknown:
            raise ConfigError(f"rollout.val_override_config: unknown keys {sorted(unknown)} "
                              f"(valid: {', '.join(sorted(p))})")
        p.update(cfg.rollout.val_override_config)
    return SamplingParams(**p)


def greedy_sampling(cfg: PPOConfig) -> SamplingParams:
    """One greedy response per prompt (greedy validation, ReMax's baseline)."""
    return SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.data.max_response_length)


def build_reward(cfg: PPOConfig, functions: list[dict] | None = None) -> Scoring:
    """The Reward role: each reward function (reward.reward_function, or each of reward.reward_functions with its
    weight; or `functions`, as reward.sources() gives them) a Scoring source, its call form checked at start-up, run
    under reward.timeout / strict / num_cpus."""
    r, ob, rp = cfg.reward, cfg.reward.overlong_buffer, cfg.reward.repetition_penalty
    strict, fallback = r.error_policy()
    sources, program = [], (cfg.rollout.agent.program or cfg.rollout.agent.environment) and functions is None
    try:
        for s in r.sources() if functions is None else functions:
            if "entry" not in s and not s.get("function") and uses_reasoning_gym(cfg.data):  # the tasks' own scorers
                sources.append(("reasoning_gym", 1.0, ReasoningGymScore(strict, fallback)))
                continue
            if "entry" in s or (program and not s.get("function")):  # a model: add_reward_models loads it
                continue
            sources.append((s["name"], float(s["weight"]), RewardFunction(
                s["function"], s["reward_type"], s["kwargs"], timeout=r.timeout, strict=strict, fallback_score=fallback,
                num_cpus=r.num_cpus, key=s["key"], kwargs_key=s["kwargs_key"])))
    except BaseException:
        for _, _, source in sources:  # the workers of the functions built before the one that failed
            source.close()
        raise
    named = bool(r.reward_functions) and functions is None
    if program:  # the program's own rewards; the reward files score the episodes it returned None for
        inner = Scoring(sources, named=named, strict=strict, fallback_score=fallback)
        sources, named = [("program", 1.0, ProgramScore(inner))], False
    return Scoring(sources, named=named, strict=strict, fallback_score=fallback,
                   overlong=(cfg.data.max_response_length, ob.len, ob.penalty_factor) if ob.enable else None,
                   repetition=(rp.ngram_size, rp.penalty_factor) if rp.enable else None)


def build_val_rewards(cfg: PPOConfig) -> dict[str, Scoring]:
    """{name: Scoring} of the named validation sets that give their own reward_function (scored by it alone, its
    call form read from it, with reward.timeout / strict / num_cpus and the shaping as the run's reward); the other
    sets are scored by the run's reward."""
    sets = cfg.data.val_sets() if validates(cfg) else None
    rewards = {}
    try:
        for name, entry in (sets or {}).items():
            function, key = entry.get("reward_function"), f"data.val_files.{name}"
            if not function:
                continue
            rewards[name] = build_reward(cfg, [{
                "function": function, "weight": 1.0, "kwargs": dict(entry.get("reward_function_kwargs") or {}),
                "reward_type": "auto", "name": function.rpartition(":")[2], "key": f"{key}.reward_function",
                "kwargs_key": f"{key}.reward_function_kwargs"}])
    except BaseException:
        for reward in rewards.values():
            reward.close()
        raise
    return rewards


def add_reward_models(reward: Scoring, cfg: PPOConfig, device: torch.device) -> Scoring:
    """The model sources (rllava.reward.models): reward.reward_functions' model entries, then reward.model.model_path
    (weight reward.model_weight). With several sources or a reward model, each logs under its name. With
    rollout.agent.program they join the reward files in scoring the episodes the program returned None for."""
    entries = [s for s in cfg.reward.sources() if "entry" in s]
    target = reward.sources[0][2].inner if cfg.rollout.agent.program else reward  # the program's ProgramScore
    try:  # loading them leaves the RNG as it was: a run draws the same LoRA init and samples with or without them
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for s in entries:
                model = build_model_reward(s["entry"], cfg, device, s["key"])
                target.sources.append((s["name"], float(s["weight"]), model))
            target.sources += model_sources(cfg, device)
    except BaseException:
        reward.close()
        raise
    target.named = target.named or len(target.sources) > 1 or bool(cfg.reward.model.model_path)
    return reward


def build_agent_env(cfg: PPOConfig):
    """A multi-turn agent's environment (its tools, or RLLaVA's tool / environment classes), or None. Built before
    the model loads: a tool that cannot work here (the code sandbox's jail, a search corpus) fails in a second."""
    if cfg.rollout.agent.program:  # a program brings its own tools; a wrong function name fails before the model loads
        load_reward_function(cfg.rollout.agent.program, key="rollout.agent.program")
        return None
    if cfg.rollout.agent.environment:  # a verifiers env: loaded (once) before the model, its records and rollouts
        load_verifiers_env(cfg.rollout.agent.environment, cfg.rollout.agent.environment_kwargs)
        return None
    if not agent_on(cfg):
        return None
    a = cfg.rollout.agent
    load_plugins(a.plugins, key="rollout.agent.plugins")
    kw = dict(answer_tag=a.answer_tag, invalid_call_penalty=a.invalid_call_penalty)
    if cfg.rollout.env_config_path:  # RLLaVA's files: classes of the user's
        return ClassEnv(cfg.rollout.env_config_path, **kw)
    if cfg.rollout.tool_config_path:
        return ClassToolsEnv(cfg.rollout.tool_config_path, **kw)
    return ToolEnv(build_tools(list(a.tools), dict(a.tool_kwargs)), tool_format=a.tool_format, **kw)


def build_rollout(cfg: PPOConfig, processor, device: torch.device, env=None) -> Rollout:
    """The Rollout role; multi-turn (`env`, or the one `build_agent_env` makes) when an agent is on."""
    engine = engine_for(cfg, processor, device, ignore_eos=cfg.rollout.ignore_eos)
    fsdp = cfg.actor.fsdp  # FSDP2 reads offload_params as its CPU offload: an effect in every phase
    if fsdp.offload_params and engine.shares_train_model and \
            resolve_strategy(cfg.actor.strategy, None, fsdp, device) not in ("fsdp", "fsdp2"):
        log.warning("actor.fsdp.offload_params=true has no effect with rollout.name=%s: that engine samples with "
                    "the training model, whose weights must stay on the device", cfg.rollout.name)
    a = cfg.rollout.agent  # multi-turn: the same engine, a driver that runs tools (or the user's program)
    if a.program or a.environment:  # an agent written for an OpenAI client (or a verifiers env run as one)
        program, key = a.program, "rollout.agent.program"
        if a.environment:
            program = environment_program(load_verifiers_env(a.environment, a.environment_kwargs))
            key = "rollout.agent.environment"
        return ProgramRollout(engine, processor, program, max_turns=cfg.rollout.max_turns,
                              max_context=cfg.data.max_prompt_length + cfg.data.max_response_length,
                              episode_timeout=a.episode_timeout, strict=cfg.reward.error_policy()[0],
                              min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels,
                              skip_special_tokens=cfg.reward.skip_special_tokens, key=key)
    env = env or build_agent_env(cfg)
    if env is None:
        return Rollout(engine, processor, skip_special_tokens=cfg.reward.skip_special_tokens)
    return AgentRollout(engine, processor, env, max_turns=cfg.rollout.max_turns,
                        max_response_length=cfg.data.max_response_length, observation_role=a.observation_role,
                        min_pixels=cfg.data.min_pixels, max_pixels=cfg.data.max_pixels,
                        skip_special_tokens=cfg.reward.skip_special_tokens, tool_workers=a.tool_workers,
                        asynchronous=cfg.rollout.async_mode, round_image_mb=a.round_image_mb)


def _schedule(cfg: PPOConfig, num_steps: int, role, n: int) -> tuple[int, int]:
    """(this rank's sequences per mini-batch, the LR schedule's length) of `role` (actor or critic config), `n`
    sequences per prompt (RLLaVA counts prompts per batch and mini-batch, all ranks): the optimizer steps each rank
    takes, steps x epochs x ceil(its rows / mini), whatever the world size (verl's schedule spans the steps its
    scheduler takes on each rank: verl/workers/fsdp_workers.py@b178a3c L579-586, L921)."""
    mini = role.ppo_mini_batch_size * n // D.world_size()
    return mini, num_steps * role.ppo_epochs * math.ceil(cfg.data.train_batch_size // D.world_size() * n / mini)


def _engine(model, o, device: torch.device, max_grad_norm: float, skip_grad_norm: float | None, *, updates: int,
            key: str, strategy: str, fsdp, deepspeed, accelerate_config: str | None = None) -> TrainEngine:
    """The train engine for `strategy` around `model`, with AdamW over the trainable parameters and the LR schedule
    of optim config `o`; `fsdp` carries the sharding and CPU-offload switches, `deepspeed` the ZeRO ones."""
    if o.strategy != "adamw":  # the config check allows only what is built here
        raise ConfigError(f"{key}.strategy={o.strategy!r} is not supported (supported: adamw)")
    strategy = resolve_strategy(strategy, fsdp=fsdp, device=device)
    offload = dict(offload_params=fsdp.offload_params, offload_optimizer=fsdp.offload_optimizer,
                   cpu_optimizer=fsdp.enable_cpu_offload)
    if strategy in ("fsdp", "fsdp2"):
        from rllava.engine.train.fsdp2 import FSDP2Engine

        engine = FSDP2Engine(device, max_grad_norm, skip_grad_norm, mixed_precision=fsdp.mixed_precision,
                             reshard_after_forward=fsdp.reshard_after_forward, forward_prefetch=fsdp.forward_prefetch,
                             keep_gathered_units=fsdp.keep_gathered_units, **offload)
    elif strategy == "accelerate":
        from rllava.engine.train.accelerate import AccelerateEngine

        engine = AccelerateEngine(device, max_grad_norm, skip_grad_norm, config_file=accelerate_config)
    elif strategy == "deepspeed":
        from rllava.engine.train.deepspeed import DeepSpeedEngine

        if skip_grad_norm is not None:
            log.warning("%s: DeepSpeed skips only steps whose gradient norm is not finite; skip_grad_norm=%s is "
                        "not applied (set it to null to silence this)", key.split(".")[0], skip_grad_norm)
        engine = DeepSpeedEngine(device, max_grad_norm, deepspeed_config=deepspeed,
                                 offload_params=fsdp.offload_params, offload_optimizer=fsdp.offload_optimizer)
    else:
        engine = SingleDeviceEngine(device, max_grad_norm, skip_grad_norm, **offload)
    engine.prepare(model, lambda params: torch.optim.AdamW(params, lr=o.lr, betas=tuple(o.betas),
                                                           weight_decay=o.weight_decay),
                   lambda opt: lr_scheduler(o, opt, updates))
    return engine


def lr_scheduler(o, optimizer, updates: int):
    """Optim config `o`'s LR schedule over `updates` steps: warmup (lr_warmup_steps, else lr_warmup_ratio of the run;
    with every schedule), then lr_scheduler_type; cosine reads num_cycles and min_lr_ratio (its floor)."""
    warmup = o.lr_warmup_steps if o.lr_warmup_steps is not None else int(o.lr_warmup_ratio * updates)
    name, extra = o.lr_scheduler_type, {}
    if name == "constant" and warmup > 0:  # transformers' "constant" ignores warmup; RLLaVA/verl warm up (constant)
        name = "constant_with_warmup"
    if name == "cosine":
        extra["num_cycles"] = o.num_cycles
        if o.min_lr_ratio is not None:
            name, extra["min_lr_rate"] = "cosine_with_min_lr", o.min_lr_ratio
    return transformers.get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=updates,
                                      scheduler_specific_kwargs=extra or None)


def build_engine(cfg: PPOConfig, model, device: torch.device, num_steps: int, *, sft: bool = False) -> TrainEngine:
    """The policy's train engine (actor.strategy) with its optimizer and LR schedule over the run's updates."""
    _, updates = _schedule(cfg, num_steps, cfg.actor, 1 if sft else cfg.rollout.n)
    return _engine(model, cfg.actor.optim, device, cfg.actor.max_grad_norm, cfg.actor.skip_grad_norm, updates=updates,
                   key="actor.optim", strategy=cfg.actor.strategy, fsdp=cfg.actor.fsdp, deepspeed=cfg.actor.deepspeed,
                   accelerate_config=cfg.trainer.accelerate_config)


def build_actor(cfg: PPOConfig, model, device: torch.device, num_steps: int, *, sft: bool = False,
                processor=None, engine: TrainEngine | None = None) -> Actor:
    """The Actor around `model` (its engine: `engine`, else `build_engine`'s) with, in RL, the run's scorers (their
    frozen copies shard like the engine); `sft=True`: one reference response per prompt, the `sft` loss (NLL), T=1."""
    a = cfg.actor
    engine = engine or build_engine(cfg, model, device, num_steps, sft=sft)
    mini, _ = _schedule(cfg, num_steps, a, 1 if sft else cfg.rollout.n)
    model = engine.model
    algorithm, loss_terms = named_algorithm(cfg, sft=sft)
    scorers = [] if sft else build_scorers(cfg, Parts(cfg=cfg, policy=model, engine=engine, processor=processor,
                                                      device=device, steps=num_steps, algorithm=algorithm))
    return Actor(model, engine, algorithm, ppo_epochs=a.ppo_epochs, scorers=scorers, mini_batch_size=mini,
                 group_size=1 if sft else cfg.rollout.n, micro_batch_size=a.ppo_micro_batch_size,
                 log_prob_micro_batch_size=a.log_prob_micro_batch_size,
                 loss_agg_mode=a.loss_agg_mode, max_response_length=cfg.data.max_response_length,
                 temperature=1.0 if sft else cfg.rollout.temperature, kl_loss_coef=a.kl_loss_coef,
                 use_kl_loss=not sft and cfg.algorithm.use_kl_loss and a.kl_loss_coef > 0, kl_loss_type=a.kl_loss_type,
                 entropy_coeff=a.entropy_coeff, **_rollout_is(cfg, sft), **_actor_batching(cfg),
                 expert=None if sft or algorithm.loss_name not in HYBRID_LOSSES else ExpertLoss(
                     algorithm.loss_name, cfg.algorithm.enable_phi_function, cfg.algorithm.use_token_level_loss_in_sft),
                 loss_terms=loss_terms)


def named_algorithm(cfg: PPOConfig, *, sft: bool = False) -> tuple:
    """(the algorithm, actor.loss_terms as {name: (fn, coef)}) the config names. algorithm.plugins are imported
    first, so their registrations count (estimators, losses, loss terms, scorers, samplers); then each registered
    name the run uses is looked up: data.sampler, the estimator and the policy loss (`build_algorithm`) and, in RL,
    the loss terms and algorithm.distill.loss (with a teacher). A name not registered is one line naming its key,
    the registered names and the closest. No model is needed: build_run checks a run's names with it before the
    model loads, build_actor builds the run's algorithm with it, and rllava.commands.sweep checks every point with
    it before the first run."""
    load_plugins(cfg.algorithm.plugins)
    sampler_class(cfg, sft=sft)  # data.sampler and its keys
    algorithm = build_algorithm(cfg.algorithm, cfg.actor, loss_mode="sft" if sft else None,
                                discount=cfg.rollout.discount)
    if sft:
        return algorithm, {}
    if cfg.algorithm.distill.on:
        distill_loss(cfg)
    return algorithm, {name: (lookup(LOSS_TERMS, name, "actor.loss_terms"), float(coef))
                       for name, coef in cfg.actor.loss_terms.items()}


def _actor_batching(cfg: PPOConfig) -> dict:
    """actor.model.padding_free / shared_prefix / dynamic_batching (the actor's token budgets), the LM-head chunk."""
    m, a = cfg.actor.model, cfg.actor
    return {"padding_free": m.padding_free, "shared_prefix": m.use_shared_prefix,
            "logprob_chunk_size": a.logprob_chunk_size,
            "max_token_len": a.ppo_max_token_len_per_gpu if m.dynamic_batching else None,
            "log_prob_max_token_len": a.log_prob_max_token_len_per_gpu if m.dynamic_batching else None}


def _rollout_is(cfg: PPOConfig, sft: bool) -> dict:
    """algorithm.rollout_is / rollout_is_cap (RLLaVA's actor.tis_imp_ratio_cap > 0 means token level, that cap) and
    algorithm.rollout_rs / rollout_rs_threshold (rejection sampling); none of them in SFT."""
    level, cap = cfg.algorithm.rollout_is, cfg.algorithm.rollout_is_cap
    if cfg.actor.tis_imp_ratio_cap > 0:
        level, cap = ("token" if level == "none" else level), cfg.actor.tis_imp_ratio_cap
    return {"rollout_is": "none" if sft else level, "rollout_is_cap": cap,
            "rollout_rs": None if sft else cfg.algorithm.rollout_rs,
            "rollout_rs_threshold": cfg.algorithm.rollout_rs_threshold,
            "off_policy": not sft and (cfg.trainer.async_training or cfg.rollout.partial_rollout)}


def needs_reference(cfg: PPOConfig) -> bool:
    """A KL uses the frozen reference: in the loss (use_kl_loss, non-zero kl_loss_coef) or in the reward."""
    return bool(cfg.algorithm.use_kl_loss and cfg.actor.kl_loss_coef > 0) or cfg.algorithm.use_kl_in_reward


def _ref_batching(cfg: PPOConfig) -> MicroBatching:
    """The frozen models' no-grad passes (the reference, distillation teachers): ref.* sizes, the actor's layout."""
    m = cfg.actor.model
    return MicroBatching(cfg.ref.log_prob_micro_batch_size, cfg.ref.log_prob_max_token_len_per_gpu
                         if m.dynamic_batching else None, m.padding_free, m.use_shared_prefix)


def _frozen_like(m: ModelConfig, device: torch.device) -> dict:
    """A frozen copy's dtype, attention and remote code: actor.model's."""
    return dict(dtype=resolve_dtype(m.torch_dtype, device), attn_implementation=m.attn_implementation,
                trust_remote_code=m.trust_remote_code)


def build_reference_role(cfg: PPOConfig, policy, device: torch.device, engine=None) -> Reference | None:
    if not needs_reference(cfg):
        return None
    m, batching = cfg.actor.model, _ref_batching(cfg)
    kw = dict(temperature=cfg.rollout.temperature, chunk_size=cfg.actor.logprob_chunk_size,
              reset_freq=cfg.algorithm.ref_reset_freq)
    if m.use_peft and not cfg.ref.model_path:
        return Reference(policy, batching, lora_base=True, **kw)
    sharded = hasattr(engine, "shard_frozen")  # FSDP2 / ZeRO-3: a fresh copy of the starting weights, sharded alike
    ref = load_frozen(cfg.ref.model_path or (m.model_path if sharded else None), device, key="ref", copy_of=policy,
                      engine=engine, **_frozen_like(m, device))
    if kw["reset_freq"] and weight_shapes(ref) != weight_shapes(policy):
        differ = sorted(set(weight_shapes(ref).items()) ^ set(weight_shapes(policy).items()))
        raise ConfigError(f"algorithm.ref_reset_freq={kw['reset_freq']} copies the policy into the reference, but "
                          f"ref.model_path={cfg.ref.model_path} has other weights (e.g. {differ[0][0]!r})")
    return Reference(ref, batching, **kw)


def distill_routes(cfg: PPOConfig) -> dict[str, tuple[str, str]]:
    """algorithm.distill's teachers: route (DEFAULT for teacher_path, else the route_field value) -> (key, path)."""
    d = cfg.algorithm.distill
    return {**({DEFAULT: ("algorithm.distill.teacher_path", d.teacher_path)} if d.teacher_path else {}),
            **{str(k): (f"algorithm.distill.teachers.{k}", v) for k, v in d.teachers.items()}}


def distill_loss(cfg: PPOConfig):
    load_plugins(cfg.algorithm.plugins)
    return lookup(DISTILL_LOSSES, cfg.algorithm.distill.loss, "algorithm.distill.loss")


def build_distillation(cfg: PPOConfig, processor, policy, device: torch.device, engine=None) -> Distillation | None:
    """algorithm.distill's registered loss and teachers (checked against the student's tokenizer and image layout),
    each a frozen model served like the reference or a vLLM / SGLang engine; None without a teacher."""
    d, m = cfg.algorithm.distill, cfg.actor.model
    if not d.on:
        return None
    fn, batching, teachers = distill_loss(cfg), _ref_batching(cfg), {}
    for route, (key, path) in distill_routes(cfg).items():
        if not os.path.isdir(path):
            raise ConfigError(f"{key}={path!r}: no such model directory")
        teacher_tokenizer = get_tokenizer(load_processor(path, trust_remote_code=m.trust_remote_code))
        problem = tokenizer_mismatch(get_tokenizer(processor), teacher_tokenizer, m.model_path, path, key)
        if d.engine != "hf":  # the teacher's log-probs from an engine of its own, asleep outside its passes
            engine_cfg = copy.deepcopy(cfg)  # the teacher's own weights (a policy engine loads dummies, then syncs)
            engine_cfg.rollout.name, engine_cfg.rollout.load_format = d.engine, "auto"
            keep = {"keep_weights": True} if d.engine == "sglang" else {}  # SGLang drops released weights otherwise
            if problem is None:
                teachers[route] = EngineTeacher(build_rollout_engine(
                    engine_cfg, teacher_tokenizer.pad_token_id, [], [], device, model=ModelConfig(
                        model_path=path, trust_remote_code=m.trust_remote_code), **keep, **d.engine_kwargs), processor)
        else:
            model = load_frozen(path, device, key=key, engine=engine, offload=d.offload, **_frozen_like(m, device))
            problem = problem or layout_mismatch(getattr(policy, "config", None), model.config, path, key)
            if problem is None:
                teachers[route] = Reference(model, batching, temperature=cfg.rollout.temperature,
                                            chunk_size=cfg.actor.logprob_chunk_size)
        if problem is not None:
            raise ConfigError(problem)
    return Distillation(fn, d.coef, Teachers(teachers, d.route_field, device, d.offload))


def build_critic(cfg: PPOConfig, device: torch.device, num_steps: int, algorithm) -> Critic | None:
    """The value model (critic.model.model_path, default the actor's) and its role, if `critic` is set.
    An estimator that declares `values` (gae) without a critic is a config error, raised here at start-up."""
    if cfg.critic is None:
        if algorithm.needs("values"):
            raise ConfigError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs a critic: set "
                              "critic.model.model_path=... (e.g. the actor's model path)")
        return None
    c = cfg.critic
    lm = load_model(c.model.model_path or cfg.actor.model.model_path, dtype=resolve_dtype(c.model.torch_dtype, device),
                    attn_implementation=c.model.attn_implementation, trust_remote_code=c.model.trust_remote_code,
                    override_config=c.model.override_config, key="critic.model")
    lm = make_trainable(lm, c.model, device, key="critic.model")  # the value head (built next) trains fully
    mini, updates = _schedule(cfg, num_steps, c, cfg.rollout.n)
    engine = _engine(ValueModel(lm), c.optim, device, c.max_grad_norm, None, updates=updates, key="critic.optim",
                     strategy=c.strategy, fsdp=c.fsdp, deepspeed=c.deepspeed,
                     accelerate_config=cfg.trainer.accelerate_config)
    return Critic(engine.model, engine, ppo_epochs=c.ppo_epochs, mini_batch_size=mini, group_size=cfg.rollout.n,
                  micro_batch_size=c.ppo_micro_batch_size, values_micro_batch_size=c.log_prob_micro_batch_size,
                  cliprange_value=c.cliprange_value, loss_avg_mode=c.loss_avg_mode, gamma=cfg.algorithm.gamma,
                  lam=cfg.algorithm.lam, padding_free=c.model.padding_free, shared_prefix=c.model.use_shared_prefix,
                  max_token_len=c.ppo_max_token_len_per_gpu if c.model.dynamic_batching else None,
                  values_max_token_len=c.forward_max_token_len_per_gpu if c.model.dynamic_batching else None)


def build_kl_controller(cfg: PPOConfig) -> KLController | None:
    if not cfg.algorithm.use_kl_in_reward:
        return None
    k = cfg.algorithm.kl_ctrl
    return KLController(k.type, k.kl_coef, estimator=cfg.algorithm.kl_penalty, target_kl=k.target_kl, horizon=k.horizon)


# ---- the built-in scorers (rllava.train.scorers), in the order learn runs them: each beside its role's builder ----
@register_scorer("reference")
def reference_scorer(cfg, parts: Parts) -> Scorer | None:
    ref = build_reference_role(cfg, parts.policy, parts.device, parts.engine)
    return None if ref is None else Scorer(  # resets move the reference: exact resume needs its weights
        "ref_logprobs", ref.compute_logprobs, "ref", role=ref, engines={"ref": ref} if ref.reset_freq else {},
        after_update=lambda batch, step: ref.after_update(parts.policy, step))


@register_scorer("teachers")
def teachers_scorer(cfg, parts: Parts) -> Scorer | None:
    """On-policy distillation (algorithm.distill): the teachers score the samples before the update (a sampled
    loss) or inside it (loss=full: the Actor runs them); the Actor adds the dense term either way."""
    distill = build_distillation(cfg, parts.processor, parts.policy, parts.device, parts.engine)
    if distill is None:
        return None
    before = distill.needs("teacher_logprobs")
    return Scorer("teacher_logprobs", distill.teachers.compute_logprobs, "teacher", role=distill,
                  when=lambda batch: before)


@register_scorer("critic")
def critic_scorer(cfg, parts: Parts) -> Scorer | None:
    c = build_critic(cfg, parts.device, parts.steps, parts.algorithm)
    return None if c is None else Scorer("values", c.compute_values, "values", role=c, engines={"critic": c.engine},
                                         after_update=lambda batch, step: c.update(batch))  # its own, same batch


@register_scorer("kl_in_reward")
def kl_in_reward_scorer(cfg, parts: Parts) -> Scorer | None:
    """r_t - beta * KL(pi_old || pi_ref)_t, beta from algorithm.kl_ctrl (fixed or adaptive); the exact KL over the
    vocabulary with algorithm.kl_penalty=full (the reference's hidden states, then the policy's forward)."""
    ctrl, ref = build_kl_controller(cfg), parts.built.get("ref_logprobs")
    if ctrl is None:
        return None

    def score(batch: Batch):
        exact = ref.role.full_kl(batch, parts.policy) if ctrl.estimator == "full" else None
        return ctrl.penalize(batch.scores, batch.loss_mask, batch.old_logprobs, batch.ref_logprobs, exact)

    return Scorer("token_rewards", score, "kl_in_reward", reads=("old_logprobs",), role=ctrl,
                  states={"kl_ctrl": ctrl})
