"""Name -> function registries for advantage estimators, policy losses and the rest: the config picks a registered
function by name (`algorithm.adv_estimator=grpo`); a user file registers its own with the same decorators and is
loaded through `algorithm.plugins` (no package edits).
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable

from rllava.errors import ConfigError

ADV_ESTIMATORS: dict[str, Callable] = {}
POLICY_LOSSES: dict[str, Callable] = {}
ALGORITHMS: dict[str, type] = {}  # whole algorithms: PPO subclasses, selected by algorithm.adv_estimator
DISTILL_LOSSES: dict[str, Callable] = {}  # on-policy distillation's per-token terms (algorithm.distill.loss)
LOSS_TERMS: dict[str, Callable] = {}  # further terms of the update's loss (actor.loss_terms)
SCORERS: dict[str, Callable] = {}  # passes that fill a batch field before the advantage (rllava.train.scorers)
SAMPLERS: dict[str, type] = {}  # prompt samplers, selected by data.sampler (rllava.algorithms.curriculum)


def _register(table: dict, kind: str, name: str, reads: tuple[str, ...] | None = None):
    def decorator(fn):
        if reads is not None:
            fn.reads = reads  # the LossInputs fields it reads
        old = table.get(name)  # the same definition run again (a notebook cell, a re-imported file) replaces it
        if old is not None and (old.__module__, old.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"{kind} {name!r} is already registered by {old.__module__}")
        table[name] = fn
        return fn

    return decorator


def register_adv_estimator(name: str):
    """Register `fn(scores, group_ids, mask, ..., *, params) -> advantages [B, T]` as `name`."""
    return _register(ADV_ESTIMATORS, "advantage estimator", name)


def register_policy_loss(name: str, *, reads: tuple[str, ...] = ()):
    """Register `fn(inputs: LossInputs, *, params) -> (per_token_loss [B, T], metrics)` as `name`; `reads`: the
    LossInputs fields the Actor fills only on request (`rollout_logprobs`, with the mismatch metrics)."""
    return _register(POLICY_LOSSES, "policy loss", name, reads)


def register_distill_loss(name: str, *, reads: tuple[str, ...]):
    """Register `fn(inputs: LossInputs) -> per_token_loss [B, T]` as `name` (`algorithm.distill.loss=name`);
    `reads`: the LossInputs fields it reads, among logprobs (with grad), old_logprobs, teacher_logprobs (a teacher
    pass before the update) and full_kl (the teacher runs inside the update) (`rllava.algorithms.distill`)."""
    return _register(DISTILL_LOSSES, "distillation loss", name, reads)


def register_loss_term(name: str):
    """Register `fn(inputs: LossInputs) -> (per_token_loss [B, T], metrics)` as a term of the update's loss, added
    with its coefficient by `actor.loss_terms={name: coef}`: aggregated over the RL term's tokens as the KL term,
    logged as `actor/<name>`, its metrics as `actor/<name>/<metric>`."""
    return _register(LOSS_TERMS, "loss term", name)


def register_scorer(name: str):
    """Register `fn(cfg, parts: rllava.train.scorers.Parts) -> Scorer | None` as `name`: at start-up each builder,
    in registration order (built-ins first), returns the pass it adds to this run, or None."""
    return _register(SCORERS, "scorer", name)


def register_sampler(name: str):
    """Register a prompt sampler class as `name` (`data.sampler=name`): `cls(n, batch_size, *, shuffle, seed,
    **data.sampler_kwargs)` with `next_batch()`, `len()`, `state_dict()` / `load_state_dict()` and, to learn from
    the rewards, `observe([(prompt index, its group's headline values)])` and `metrics()`."""
    return _register(SAMPLERS, "sampler", name)


def register_ppo(name: str):
    """Register a PPO subclass as `name` (class decorator); `algorithm.adv_estimator=name` selects it:

        @register_ppo("my_algo")
        class MyAlgo(PPO):
            def compute_advantage(self, batch): ...
    """
    return _register(ALGORITHMS, "algorithm", name)


def lookup(table: dict, name: str, key: str) -> Callable:
    """The function registered as `name`, or an error naming the config `key`, the choices and the closest."""
    if name in table:
        return table[name]
    close = difflib.get_close_matches(name, table, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"{key}={name!r} is not registered (registered: {', '.join(sorted(table))}){hint}")


def call_with_params(fn: Callable, args: tuple, params: dict[str, Any], key: str):
    """Call `fn(*args, **p)`, p the keyword-only parameters `fn` declares (its hyperparameters and the batch tensors
    it needs beyond the positional ones) from `params`, the pool the config and the batch offer (None: not in this
    run). A declared parameter without a default that the pool lacks is a configuration error."""
    kwargs = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if params.get(p.name) is not None:
            kwargs[p.name] = params[p.name]
        elif p.default is inspect.Parameter.empty:
            raise ConfigError(f"{key}: {fn.__name__} needs parameter {p.name!r}, which this run does not provide"
                              f"{_NEEDS.get(p.name, '')}")
    return fn(*args, **kwargs)


# Where a batch tensor an algorithm may declare comes from, for the error when it is missing.
_NEEDS = {"values": " (values come from a critic: set critic.model.model_path)",
          "baseline_scores": " (the greedy baseline is rolled out only for adv_estimator=remax)",
          "turn_index": " (turns come from agent rollouts: set rollout.agent.tools)"}
