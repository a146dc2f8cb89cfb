"""Prompt samplers (`data.sampler`, keys in `data.sampler_kwargs`) and the difficulty curriculum.

`epoch` (the default) is `rllava.data.sampler.EpochSampler`: every epoch a fresh permutation, as before.
`difficulty_pools` is a curriculum after prime-rl's `DifficultyPoolSampler` (PrimeIntellect-ai/prime-rl @ 559b447,
src/prime_rl/orchestrator/curriculum/samplers/pool.py L47-78: a task's pool from its latest group mean, inclusive
thresholds, a relative weight per task of a pool, unseen tasks neutral; docs/algorithms.md L472; its defaults in
packages/prime-rl-configs/src/prime_rl/configs/orchestrator.py L172-177), drawn batch by batch without
replacement, plus DAPO's observation (arXiv:2503.14476, sec. 3.2) that a group whose responses all score the same
teaches nothing:

    running pass rate   rate_i <- rate_i + ema * (p - rate_i), p the mean headline value (accuracy) of the group
                        prompt i just had, the first p as is (ema=1: prime-rl's latest group mean); unseen
                        prompts have none and count as medium (prime-rl's neutral weight)
    pools               hard: rate <= hard_max; medium: rate <= medium_max; easy: above (prime-rl's default
                        thresholds 0.25 / 0.75)
    a batch             pool p's share: batch_size * w_p n_p / sum_q w_q n_q prompts (n_p its size, w_p its
                        weight: the ratio of its prompts' draws to another pool's, prime-rl's 0.2 / 1 / 0.2), in
                        whole numbers by largest remainders; the least recently drawn first (ties in a seeded
                        random order); what the shares leave (a pool short of prompts, a weight of 0) comes from
                        medium, then hard, then easy, then the set-aside prompts due back soonest
    set aside           a prompt whose last `set_aside_after` groups all carried no signal (every response
                        equal: always or never solved) leaves the pools for `readmit_after` batches; back, it is
                        drawn by its rate, and one more group without signal sends it away again

Every draw's randomness comes from (seed, batches drawn), so the state is plain numbers (JSON, in the checkpoint's
trainer_state.json) and a resumed run draws what the uninterrupted run would have. The RLVR step feeds `observe`
every group of training rollouts it scored (DAPO's extra rounds included), gathered over ranks, so every rank
holds the same state and draws the same batches (each then takes its share, `Run.next_samples`).
"""

from __future__ import annotations

import inspect
import random

from rllava.algorithms.ppo import load_plugins
from rllava.algorithms.registry import SAMPLERS, lookup, register_sampler
from rllava.data.records import DataError
from rllava.data.sampler import EpochSampler
from rllava.errors import ConfigError

register_sampler("epoch")(EpochSampler)
POOLS = ("easy", "medium", "hard")
FILL_ORDER = ("medium", "hard", "easy")  # who takes a short pool's share
STATE = ("draws", "rates", "streak", "aside_until", "last_drawn")


def apportion(total: int, ratios: dict[str, float]) -> dict[str, int]:
    """`total` split by `ratios` in whole numbers (largest remainders): the floors of total * r / sum(r), then one
    more each to the largest remainders, ties in the order of `ratios`; all ratios 0: none to any."""
    norm = sum(ratios.values())
    if norm == 0:
        return dict.fromkeys(ratios, 0)
    exact = {k: total * r / norm for k, r in ratios.items()}
    counts = {k: int(v) for k, v in exact.items()}
    by_remainder = sorted(ratios, key=lambda k: counts[k] - exact[k])  # stable: ties keep their order
    for k in by_remainder[:total - sum(counts.values())]:
        counts[k] += 1
    return counts


def check_keys(values: dict, whole: tuple[str, ...]) -> None:
    """One line for the first data.sampler_kwargs value that is not a number (a whole number for `whole`)."""
    for key, value in values.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or (key in whole and int(value) != value):
            raise ConfigError(f"data.sampler_kwargs.{key}={value!r} must be a {'whole ' if key in whole else ''}"
                              "number")


@register_sampler("difficulty_pools")
class DifficultyPools:
    """The curriculum of the module docstring over n prompts, `batch_size` per batch; `len()` is EpochSampler's (the
    batches of one pass, what trainer.total_epochs counts)."""

    def __init__(self, n: int, batch_size: int, *, shuffle: bool, seed: int, easy_weight: float = 0.2,
                 medium_weight: float = 1.0, hard_weight: float = 0.2, hard_max: float = 0.25, medium_max: float = 0.75,
                 ema: float = 0.5, set_aside_after: int = 2, readmit_after: int = 20):
        weights = {"easy": easy_weight, "medium": medium_weight, "hard": hard_weight}
        check_keys({**{f"{k}_weight": v for k, v in weights.items()}, "hard_max": hard_max, "medium_max": medium_max,
                    "ema": ema, "set_aside_after": set_aside_after, "readmit_after": readmit_after},
                   whole=("set_aside_after", "readmit_after"))
        problems = [f"data.sampler_kwargs.{k}_weight={v} is negative" for k, v in weights.items() if v < 0]
        if sum(weights.values()) <= 0:
            problems.append("data.sampler_kwargs: the weights sum to 0; give a pool a positive weight")
        if not 0 <= hard_max < medium_max:
            problems.append(f"data.sampler_kwargs: 0 <= hard_max < medium_max must hold (hard_max={hard_max}, "
                            f"medium_max={medium_max})")
        if not 0 < ema <= 1:
            problems.append(f"data.sampler_kwargs.ema={ema} must be in (0, 1] (1: the latest group's pass rate)")
        if set_aside_after < 0:
            problems.append(f"data.sampler_kwargs.set_aside_after={set_aside_after} must be >= 0 (0: never)")
        if readmit_after < 1:
            problems.append(f"data.sampler_kwargs.readmit_after={readmit_after} must be >= 1 (batches)")
        if problems:
            raise ConfigError(problems[0])
        self.epochs = EpochSampler(n, batch_size, shuffle=shuffle, seed=seed)  # its checks and len()
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, seed
        self.weights, self.hard_max, self.medium_max, self.ema = weights, hard_max, medium_max, ema
        self.set_aside_after, self.readmit_after = int(set_aside_after), int(readmit_after)
        self.draws = 0  # batches drawn so far
        self.rates: list[float | None] = [None] * n  # running pass rate per prompt; None: never observed
        self.streak = [0] * n  # its latest groups in a row without signal
        self.aside_until = [0] * n  # > 0: set aside until that many batches are drawn
        self.last_drawn = [0] * n  # the batch (1-based) that last drew it; 0: never

    def __len__(self) -> int:
        return len(self.epochs)

    def pool(self, i: int) -> str | None:
        """Prompt i's pool: hard / medium / easy by its running pass rate (unseen: medium), None while set aside."""
        rate = self.rates[i]
        if self.aside_until[i]:
            return None
        if rate is None:
            return "medium"
        if rate <= self.hard_max:
            return "hard"
        return "medium" if rate <= self.medium_max else "easy"

    def next_batch(self) -> list[int]:
        """The next batch of prompt indices, no prompt twice; the set-aside prompts due back are readmitted first."""
        self.draws += 1
        for i in range(self.n):
            if self.aside_until[i] and self.aside_until[i] <= self.draws:
                self.aside_until[i] = 0
        rng = random.Random(f"{self.seed}:{self.draws}")
        tiebreak = [rng.random() for _ in range(self.n)] if self.shuffle else list(range(self.n))
        members = {p: [] for p in (*POOLS, None)}  # None: set aside
        for i in range(self.n):
            members[self.pool(i)].append(i)
        for p in POOLS:  # the least recently drawn first
            members[p].sort(key=lambda i: (self.last_drawn[i], tiebreak[i]))
        members[None].sort(key=lambda i: (self.aside_until[i], tiebreak[i]))  # the soonest due back first
        want = apportion(self.batch_size, {p: self.weights[p] * len(members[p]) for p in POOLS})
        batch = []
        for p in POOLS:
            batch += members[p][:want[p]]
            members[p] = members[p][want[p]:]
        for p in (*FILL_ORDER, None):  # short pools' shares
            short = self.batch_size - len(batch)
            batch += members[p][:short]
            members[p] = members[p][short:]
        for i in batch:
            self.last_drawn[i] = self.draws
        return batch

    def observe(self, groups: list[tuple[int, list[float]]]) -> None:
        """Each (prompt index, its group's headline values) updates the prompt's running pass rate and its streak of
        groups without signal; the streak reaching set_aside_after (> 0) sets the prompt aside."""
        for i, values in groups:
            p = sum(values) / len(values)
            old = self.rates[i]
            self.rates[i] = p if old is None else old + self.ema * (p - old)
            self.streak[i] = self.streak[i] + 1 if max(values) == min(values) else 0
            if self.set_aside_after and self.streak[i] >= self.set_aside_after:
                self.aside_until[i] = self.draws + self.readmit_after

    def metrics(self) -> dict[str, float]:
        """How many prompts each pool holds now, how many are set aside and how many were never observed."""
        counts = {p: 0 for p in (*POOLS, None)}
        for i in range(self.n):
            counts[self.pool(i)] += 1
        return {**{f"sampler/{p}": float(counts[p]) for p in POOLS}, "sampler/set_aside": float(counts[None]),
                "sampler/unseen": float(sum(r is None for r in self.rates))}

    def state_dict(self) -> dict:
        return {k: getattr(self, k) if k == "draws" else list(getattr(self, k)) for k in STATE}

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in STATE if k not in state]
        if missing:
            raise DataError(f"data.sampler=difficulty_pools: the checkpoint's sampler state has no "
                            f"{', '.join(missing)} (got keys: {', '.join(state)})")
        if any(len(state[k]) != self.n for k in STATE[1:]):
            raise DataError(f"data.sampler=difficulty_pools: the checkpoint's sampler state covers "
                            f"{len(state['rates'])} prompts, the train set has {self.n}; did the dataset change?")
        self.draws = int(state["draws"])
        for k in STATE[1:]:
            setattr(self, k, list(state[k]))


def sampler_class(cfg, *, sft: bool = False) -> type:
    """The sampler data.sampler names, data.sampler_kwargs checked before the model loads (one line): each must be a
    keyword of the class, a trial instance checks their values; a sampler that learns from rewards (`observe`)
    needs an RL run that scores each batch before drawing the next."""
    load_plugins(cfg.algorithm.plugins)  # a plugin's sampler (an async run's rollout ranks load them nowhere else)
    name, kwargs = cfg.data.sampler, dict(cfg.data.sampler_kwargs or {})
    cls = lookup(SAMPLERS, name, "data.sampler")
    keys = [p.name for p in inspect.signature(cls).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("shuffle", "seed", "drop_last")]
    unknown = sorted(set(kwargs) - set(keys))
    if unknown:
        raise ConfigError(f"data.sampler_kwargs.{unknown[0]} is not a key of data.sampler={name} "
                          f"(its keys: {', '.join(keys) or 'none'})")
    if hasattr(cls, "observe") and (sft or cfg.trainer.async_training):
        raise ConfigError(f"data.sampler={name} learns from each step's rewards before the next draw: "
                          f"{'SFT has no rewards' if sft else 'trainer.async_training=true draws ahead of them'}; "
                          "use data.sampler=epoch")
    cls(cfg.data.train_batch_size, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.data.seed, **kwargs)
    return cls


def build_sampler(cfg, n: int, *, sft: bool = False):
    """The run's prompt sampler over `n` prompts (data.sampler, data.sampler_kwargs)."""
    cls = sampler_class(cfg, sft=sft)
    return cls(n, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.data.seed,
               **dict(cfg.data.sampler_kwargs or {}))
