"""SFT+RL hybrids inside the RLVR step: where the expert tokens come from, and the step's loss coefficients.

One object, built from the config when `actor.policy_loss.loss_mode` is a hybrid loss
(`rllava.algorithms.hybrid`), gives the RLVR step (`rllava.train.pipeline.rlvr`) three things:

    prefixes(samples, step)   before the rollout: the expert tokens some responses start with
      - algorithm.prefix_strategy=random (LUFFY, SRFT): `n_prefix` of a prompt's K responses start with the first
        U(min_prefix_ratio, max_prefix_ratio) of the expert response (1.0: all of it, nothing is sampled)
      - algorithm.prefix_strategy=hint (UFT): the first k ~ Binomial(hint_chunks, p(t)) of `hint_chunks` chunks of the
        expert solution, p(t) cosine from max_prefix_ratio to min_prefix_ratio over `hint_steps` steps, no hint after
    demonstrations(...)       after the reward: demonstration rows added beside the groups (`Trajectory.sft_only`)
      - algorithm.unify_strategy=switch (HPT): a prompt solved <= `switch_gate` times trains on its demonstration
        instead (its K rollouts stay in the batch, out of the loss); =soft: every prompt trains on its demonstration too
      - loss_mode=chord (CHORD): `expert_data_ratio` of the step's rows are demonstrations drawn from
        data.expert_files (else the training records)
    coefficients(step)        (rl_coef, sft_coef) of Actor.update: CHORD (1 - mu(t), mu(t)); else (1, sft_loss_coef)

The expert response of a record is its `data.target_key` field, else `data.expert_template` rendered over its
answer (`answer`) and fields. Random draws are seeded by (trainer.seed, step, rank), so a resumed run draws
what the uninterrupted run drew; the expert-row sampler is checkpointed (`state_dict`).
"""

from __future__ import annotations

from dataclasses import replace

import jinja2
import numpy as np
import torch

from rllava import distributed as D
from rllava.algorithms.hybrid import HYBRID_LOSSES, chunk_bounds, hint_probability, mu_schedule
from rllava.config.schema import rllava_target_dataset
from rllava.data.dataset import PromptDataset
from rllava.data.protocol import Sample, Trajectory
from rllava.data.sampler import EpochSampler
from rllava.data.records import DataError
from rllava.errors import ConfigError
from rllava.model.processor import get_tokenizer
from rllava.train.pipeline.sft import reference_trajectory


def expert_rows_per_step(cfg) -> int:
    """CHORD's demonstration rows per step (all ranks): data.expert_batch_size, else the share
    algorithm.expert_data_ratio of all rows, round(ratio / (1 - ratio) x train_batch_size x rollout.n)."""
    if cfg.data.expert_batch_size > 0:
        return cfg.data.expert_batch_size
    ratio = cfg.algorithm.expert_data_ratio
    return max(1, round(ratio / (1 - ratio) * cfg.data.train_batch_size * cfg.rollout.n))


def _prompt_opens_think(tok) -> bool:
    """Whether the chat template's generation prompt ends in "<think>\n" (the assistant's thought opened)."""
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False)
    except (ValueError, TypeError, AttributeError, jinja2.TemplateError):
        return False
    return isinstance(text, str) and text.endswith("<think>\n")


class Hybrid:
    """The expert side of one SFT+RL run (see the module docstring)."""

    def __init__(self, cfg, processor, expert_set=None):
        self.cfg, self.a, self.mode = cfg, cfg.algorithm, cfg.actor.policy_loss.loss_mode
        self.processor, self.tok = processor, get_tokenizer(processor)
        kw = cfg.data.dataset_kwargs if rllava_target_dataset(cfg.data.dataset_class) else {}
        self.max_len = min(cfg.data.max_response_length, kw.get("max_target_length", cfg.data.max_response_length))
        self.template = jinja2.Template(cfg.data.expert_template) if cfg.data.expert_template else None
        # RLLaVA's strip_target_think_tag: a prompt that ends in "<think>\n" (a thinking chat template) already
        # opens the thought, so an expert text starting with one drops it
        self.strip_think = kw.get("strip_target_think_tag", True) and _prompt_opens_think(self.tok)
        self.expert_set, self.expert_sampler = expert_set, None
        if self.mode == "chord":
            rows = expert_rows_per_step(cfg)
            self.expert_sampler = EpochSampler(len(expert_set), rows, shuffle=cfg.data.shuffle, seed=cfg.data.seed + 1)
        self.step_metrics: dict[str, float] = {}

    def expert_text(self, sample: Sample) -> str:
        target = sample.target[0] if isinstance(sample.target, list) and sample.target else sample.target
        target = target.get("content") if isinstance(target, dict) else target  # a chat message
        if target is not None:
            text = str(target)
        elif self.template is None:
            raise DataError(f"{sample.where}: an SFT+RL hybrid needs an expert response: set data.target_key (the "
                            "record field holding it) or data.expert_template (a Jinja template over `answer`)")
        else:
            text = self.template.render({**sample.extra, "answer": sample.ground_truth})  # data.answer_key's, as RLLaVA
        return text[len("<think>\n"):] if self.strip_think and text.startswith("<think>\n") else text

    def demonstration(self, sample: Sample, group_id: int) -> Trajectory:
        """[prompt, expert response + EOS (off-policy, trained)], a row for the SFT term only."""
        t = reference_trajectory(self.processor, replace(sample, target=self.expert_text(sample)), self.max_len)
        return replace(t, group_id=group_id, sft_only=True)

    def expert_ids(self, sample: Sample) -> list[int]:
        return self.demonstration(sample, sample.index).segments[-1].token_ids

    def prefixes(self, samples: list[Sample], step: int) -> list[list[list[int] | None]] | None:
        """Per prompt, per response: the expert tokens it starts with (an off-policy segment) or None."""
        a, n = self.a, self.cfg.rollout.n
        if a.prefix_strategy == "none":
            return None
        rng = np.random.default_rng([self.cfg.trainer.seed, step, D.rank()])
        k = n if a.n_prefix < 0 else min(a.n_prefix, n)
        p_hint = hint_probability(step - 1, steps=a.hint_steps, start=a.max_prefix_ratio, end=a.min_prefix_ratio)
        out, lengths, chunks = [], [], []
        for sample in samples:
            expert = self.expert_ids(sample)

            def draw() -> int:  # the prefix length in tokens
                if a.prefix_strategy == "hint":
                    shown = int(rng.binomial(a.hint_chunks, p_hint)) if p_hint > 0 else 0
                    chunks.append(shown)
                    # the EOS is not part of the solution's chunks: a hint never ends the response
                    return chunk_bounds(len(expert) - 1, a.hint_chunks)[shown - 1] if shown and len(expert) > 1 else 0
                return int(round(rng.uniform(a.min_prefix_ratio, a.max_prefix_ratio) * len(expert)))

            shared = draw() if a.prefix_share_across_samples else None
            sizes = [shared if shared is not None else draw() for _ in range(k)] + [0] * (n - k)
            lengths += sizes[:k]
            out.append([expert[:m] if m > 0 else None for m in sizes])
        self.step_metrics = {"hybrid/prefix_tokens_mean": float(np.mean(lengths)) if lengths else 0.0}
        if a.prefix_strategy == "hint":
            self.step_metrics.update({"hybrid/hint_probability": p_hint,
                                      "hybrid/hint_chunks_mean": float(np.mean(chunks)) if chunks else 0.0})
        return out

    def demonstrations(self, trajectories: list[Trajectory], scores: torch.Tensor,
                       details: list[dict]) -> tuple[list[Trajectory], torch.Tensor, list[dict], list[int]]:
        """Adds the demonstration rows (HPT, CHORD: score 0, a group of their own, in no reward metric, no advantage);
        returns (trajectories, scores, details, rows whose loss is dropped: an HPT group's rollouts switched to SFT)."""
        a, demos, dropped = self.a, [], []
        next_group = max(t.group_id for t in trajectories) + 1
        if a.unify_strategy != "none":
            groups: dict[int, list[int]] = {}
            for i, t in enumerate(trajectories):
                groups.setdefault(t.group_id, []).append(i)
            switched = 0
            for rows in groups.values():
                solved = int((scores[rows] >= a.success_reward_threshold).sum())
                if a.unify_strategy == "soft" or solved <= a.switch_gate:
                    demos.append(self.demonstration(trajectories[rows[0]].sample, next_group + len(demos)))
                if a.unify_strategy == "switch" and solved <= a.switch_gate:
                    dropped += rows
                    switched += 1
            self.step_metrics = {"hybrid/sft_groups": switched / len(groups) if a.unify_strategy == "switch"
                                 else 1.0, "hybrid/rl_groups": 1.0 - switched / len(groups)}
        elif self.mode == "chord":  # this rank's share of the next demonstration rows
            samples = [self.expert_set[j] for j in D.shard(self.expert_sampler.next_batch(), "expert rows")]
            demos = [self.demonstration(s, next_group + j) for j, s in enumerate(samples)]
            self.step_metrics = {"hybrid/expert_rows": float(len(demos))}
        if not demos:
            return trajectories, scores, details, dropped
        return (trajectories + demos, torch.cat([scores, torch.zeros(len(demos), dtype=scores.dtype)]),
                details + [{} for _ in demos], dropped)

    def coefficients(self, step: int) -> tuple[float, float]:
        """(rl_coef, sft_coef): CHORD's (1 - mu(t), mu(t)); the others (1, actor.sft_loss_coef)."""
        if self.mode == "chord":
            mu = mu_schedule(step - 1, warmup=self.a.mu_warmup_steps, decay=self.a.mu_decay_steps,
                             peak=self.a.mu_peak, valley=self.a.mu_valley)
            return 1.0 - mu, mu
        return 1.0, self.cfg.actor.sft_loss_coef

    def metrics(self, batch, step: int) -> dict[str, float]:
        rl, sft = self.coefficients(step)
        trained = batch.loss_mask.sum().item()
        off = (batch.loss_mask * batch.off_policy_mask).sum().item() if batch.off_policy_mask is not None else 0.0
        out = {"hybrid/rl_coef": rl, "hybrid/sft_coef": sft, "hybrid/off_policy_token_share": off / max(trained, 1.0)}
        if self.mode == "chord":
            out["hybrid/mu"] = sft
        return {**out, **self.step_metrics}

    def state_dict(self) -> dict:
        return {"expert_sampler": self.expert_sampler.state_dict() if self.expert_sampler else None}

    def load_state_dict(self, state: dict) -> None:
        if self.expert_sampler is not None and state.get("expert_sampler"):
            self.expert_sampler.load_state_dict(state["expert_sampler"])


def build_hybrid(cfg, run) -> Hybrid | None:
    """The run's Hybrid (None unless loss_mode is a hybrid loss), held by the run (`Run.held`: checkpointed)."""
    if cfg.actor.policy_loss.loss_mode not in HYBRID_LOSSES:
        return None
    expert_set = None
    if cfg.actor.policy_loss.loss_mode == "chord":
        expert_set = PromptDataset(cfg.data.expert_files, cfg.data, run.processor, image_dir=cfg.data.train_image_dir,
                                   target_key=cfg.data.target_key, limit_images=cfg.rollout.limit_images,
                                   key="data.expert_files") if cfg.data.expert_files else run.train_set
        rows = expert_rows_per_step(cfg)
        if rows % D.world_size():
            raise ConfigError(f"CHORD's {rows} demonstration rows per step (data.expert_batch_size or "
                              f"algorithm.expert_data_ratio) cannot be split evenly over {D.world_size()} processes")
        if len(expert_set) < rows:
            raise ConfigError(f"CHORD draws {rows} demonstration rows per step but the expert data has "
                              f"{len(expert_set)} records: lower data.expert_batch_size / algorithm.expert_data_ratio")
    run.hybrid = Hybrid(cfg, run.processor, expert_set)
    return run.hybrid
