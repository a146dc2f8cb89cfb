"""`auto` sizes: before the first step, each of the actor's micro-batch sizes set to `auto` (KEYS: schema.AUTO_SIZES
and actor.fsdp.keep_gathered_units) becomes the largest whose planned peak fits the budget less MARGIN.

    budget   trainer.memory_budget_gb, else the GPU's memory x its per-process memory fraction
             (torch.cuda.set_per_process_memory_fraction); no GPU and no budget: each key its schema default
    fits(r)  planner peak of the phase the key sizes, with r sequences per micro-batch  <=  (1 - MARGIN) x budget
             ppo_micro_batch_size / ppo_max_token_len_per_gpu         -> the update (forward + backward)
             log_prob_micro_batch_size / log_prob_max_token_len_per_gpu -> the old log-prob pass
             a token budget is r full-length sequences, r x (data.max_prompt_length + data.max_response_length)
             fsdp.keep_gathered_units (FSDP2)  -> the update, r units gathered from forward to backward, beside
                                                  the update's micro-batch (sized first: it saves more trips)

The planner builds the policy once on fake tensors (no weights, nothing on the device) and plans only that phase
for each r tried: the largest r first (it often fits: one plan), else a line through r = 1 and 2 guesses the
boundary, its neighbour and a bisection confirm it (peaks grow with r), so the choice is the largest r that the
planner says fits and r + 1 does not. The margin covers what the planner does not count (the CUDA context, the
allocator's cache: ~1-2 GiB, docs/performance.md).
"""

from __future__ import annotations

import copy
import dataclasses
import os

from rllava import distributed as D
from rllava.config.schema import AUTO_SIZES, ActorConfig, get_key
from rllava.train.memory import planner
from rllava.train.memory.planner import show

MARGIN = 0.10  # of the budget, left free
KEEP = "fsdp.keep_gathered_units"
KEYS = (*AUTO_SIZES, KEEP)  # the actor's keys that take auto
PHASES = {"ppo_micro_batch_size": "update", "ppo_max_token_len_per_gpu": "update",
          "log_prob_micro_batch_size": "old log-prob", "log_prob_max_token_len_per_gpu": "old log-prob", KEEP: "update"}


def device_budget(device) -> int | None:
    """Bytes of `device` this process may allocate: a GPU's memory times its per-process memory fraction; None
    on a CPU."""
    import torch

    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    fraction = torch.cuda.get_per_process_memory_fraction(index)
    return int(torch.cuda.get_device_properties(index).total_memory * fraction)


def largest_fitting(peak_of, limit: int, top: int) -> tuple[int, dict[int, int]]:
    """The largest r in 1..top with peak_of(r) <= limit, peak_of growing with r (1 when none fits): top if it fits,
    else a line through r = 1 and 2 guesses it, then the guess's neighbour is tried (the line is close), then the
    middle of what is left. Returns (r, {r: peak} of every r planned)."""
    peaks: dict[int, int] = {}

    def fits(r: int) -> bool:
        if r not in peaks:
            peaks[r] = peak_of(r)
        return peaks[r] <= limit

    if fits(top):  # all of them: one plan (RLLaVA's 4B script on 24 GiB, each of its three autos)
        return top, peaks
    if not fits(1) or not fits(2):
        return 1, peaks
    slope = max(peaks[2] - peaks[1], 1)
    probe = min(max(1 + (limit - peaks[1]) // slope, 2), top)
    lo, hi, guessed = 2, top + 1, True  # lo fits; hi is the first size known not to (top + 1: none known yet)
    while hi - lo > 1:
        if fits(probe):
            lo = probe
        else:
            hi = probe
        neighbour = probe + 1 if probe == lo else probe - 1
        probe = neighbour if guessed and lo < neighbour < hi else (lo + hi) // 2
        guessed = False
    return lo, peaks


def _sized(key: str, rows: int, length: int) -> int:
    """The key's value for `rows` sequences per micro-batch: the count, or a token budget of full-length rows."""
    return rows * length if key.endswith("_max_token_len_per_gpu") else rows


def _set(actor, key: str, value) -> None:
    owner, _, leaf = key.rpartition(".")
    setattr(get_key(actor, owner) if owner else actor, leaf, value)


def _line(key: str, value: int, r: int, top: int, peaks: dict[int, int], limit: int, budget: int) -> str:
    said, of = f"actor.{key}=auto -> {value}", f"{show(budget)} with a {MARGIN:.0%} margin"
    what = "units" if key == KEEP else "sequences"
    if peaks[r] > limit:
        return (f"{said} (one {what[:-1]} plans {show(peaks[r])}, over {show(limit)} of {of}: python -m "
                "rllava.commands.memory lists changes)")
    more = f"{r + 1} plans {show(peaks[r + 1])}" if r + 1 in peaks else f"all {top} {what} there are"
    return f"{said} (planned peak {show(peaks[r])} of {of}; {more})"


def resolve(cfg, budget: int | None, device: str = "cuda", world: int = 1) -> list[str]:
    """Each `auto` of cfg.actor's KEYS set to a number, in place, on one of `world` ranks of `device` ("cuda" |
    "cpu"); `budget`: bytes (None: each its schema default). The micro-batches first, then keep_gathered_units
    beside the update's. Returns one line per key saying the choice."""
    from rllava.config.schema import resolve_strategy

    a, default = cfg.actor, ActorConfig()
    keys = [k for k in KEYS if get_key(a, k) == "auto"]
    sharded = resolve_strategy(a.strategy, world, a.fsdp, device) != "single"
    read = [k for k in keys if (k == KEEP and sharded) or (k != KEEP and (
        k.endswith("_max_token_len_per_gpu") == a.model.dynamic_batching))]
    lines = []
    for key in [k for k in keys if budget is None or k not in read]:
        if budget is None:
            why = "no GPU and no trainer.memory_budget_gb"
        elif key == KEEP:
            why = "not read: one device, unsharded"
        else:
            why = f"not read with actor.model.dynamic_batching={str(a.model.dynamic_batching).lower()}"
        _set(a, key, get_key(default, key))
        lines.append(f"actor.{key}=auto -> {get_key(a, key)} ({why}: the default)")
    if budget is None or not read:
        return lines
    trial = copy.deepcopy(cfg)
    for key in read:
        _set(trial.actor, key, get_key(default, key))  # placeholders: the phases tried set their own sizes
    rows, mini = planner.rank_rows(cfg, world)
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    limit = int(budget * (1 - MARGIN))
    with planner.planned(trial, budget, device, world) as (run, step, units):
        for key in read:  # KEEP last: beside the update's micro-batch as chosen
            phase = PHASES[key]
            if key == KEEP:
                top = units
            elif phase == "update":
                top = mini
            else:
                top = rows

            def peak_of(r: int) -> int:
                if key == KEEP:
                    sized = dataclasses.replace(step, keep_gathered=r)
                elif phase == "update":
                    sized = dataclasses.replace(step, update_rows=r, accumulates=r < mini)
                else:
                    sized = dataclasses.replace(step, logprob_rows=r)
                return run(sized, only=(phase,))[0]["peak"]

            r, peaks = largest_fitting(peak_of, limit, top)
            if key != KEEP:
                value = _sized(key, r, length)
            elif peaks[r] > limit:  # not even one unit fits beside the update's micro-batch: keep none
                value = 0
            else:
                value = r
            _set(a, key, value)
            lines.append(_line(key, value, r, top, peaks, limit, budget))
            if phase == "update" and key != KEEP:
                step = dataclasses.replace(step, update_rows=r, accumulates=r < mini)
    return lines


def size_run(cfg) -> None:
    """A run's sizes (rllava.train.loop.build_run): each auto resolved before the process group and the model
    exist (the planner shards fake tensors over a fake group of its own; nothing is loaded), for
    trainer.memory_budget_gb (at most the device's memory) or the device's; rank 0 says each choice in one line."""
    if "auto" not in [get_key(cfg.actor, k) for k in KEYS]:
        return
    D.split_roles(cfg.trainer.rollout_ranks if cfg.trainer.async_training else 0)  # the trainers' own world
    device = D.pick_device(cfg.trainer.device)
    budget = device_budget(device)
    if cfg.trainer.memory_budget_gb is not None:
        given = int(cfg.trainer.memory_budget_gb * 1024 ** 3)
        budget = given if budget is None else min(given, budget)
    for line in resolve(cfg, budget, device.type, int(os.environ.get("WORLD_SIZE", "1"))):
        if D.is_main():
            print(line, flush=True)
    cfg.trainer.memory_budget_gb = None  # spent: the run's config.yaml holds the sizes it trains with
