"""Asynchronous RL: rollout ranks sample the next batches while the trainers train this one.

    torchrun --nproc_per_node=M+N -m rllava.train.pipeline.rlvr config=... \\
        trainer.async_training=true trainer.rollout_ranks=N trainer.max_staleness=k

The launch's last N processes are rollout ranks: each holds a copy of the policy (no LoRA, no optimizer), the
Rollout and Reward roles and the sampler, and runs stages 1-2 of the RLVR step (`rlvr.make_produce`); the first
M train as a world of their own (FSDP2, DCP, metrics: unchanged) and run stages 3-4 (`rlvr.learn`). The schedule
is fixed, so a run is reproducible and resumable: batch s is sampled by the weights after update

    v(s) = max(0, s - 1 - k, c(s))      c(s) = the last checkpointed step before s (trainer.save_freq)

k = 0 is the synchronous run step for step (tests/train/test_async.py); k = 1 overlaps the rollout of s + 1 with the
update of s (verl's one-step-off-policy trainer); a larger k hides a slow update behind several rollouts. The
trainer's log-probs of the sampled tokens (`old_logprobs`) are the proximal policy, the sampler's (`rollout_logprobs`)
the behaviour policy: rollout correction (`algorithm.rollout_is` / `rollout_rs`) or the decoupled PPO loss correct
for the gap. Each step logs its tokens' staleness (`Segment.version`: the version that wrote a segment).

Checkpoints: at a checkpointed step c no batch is in flight (batch c + 1 waits for version c: one rollout is not
overlapped per save), so the checkpoint holds the rollout ranks' sampler and RNG states after batch c
(`rng/rollout_rank_R.pt`), and a resumed run samples what the uninterrupted one sampled.

Messages over `D.bridge()` (a gloo group of every process of the launch; host memory): trainer 0 sends each rollout
rank the weights of each version some batch needs (gathered, LoRA merged); rollout rank 0 sends each trainer its
share of batch s (`regroup`), the version that sampled it and the rollout's timings, and trainer 0, before a
checkpoint, the rollout ranks' sampler, RNG states and paused responses. Sends do not wait for their receiver; a
receiver waits. Ctrl-C or a failing rank: torchrun stops every process.
"""

from __future__ import annotations

import os
import pickle
from collections import Counter
from contextlib import nullcontext
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import torch

from rllava import distributed as D
from rllava.algorithms.ppo import build_algorithm
from rllava.engine.inference.base import weight_buckets
from rllava.errors import RllavaError
from rllava.train import checkpoint as C
from rllava.train.loop import build_run, train_loop
from rllava.train.tracker import Timer


def version_for(step: int, max_staleness: int, save_freq: int) -> int:
    """v(s): the update whose weights sample batch `step` (see the module docstring)."""
    saved = (step - 1) // save_freq * save_freq if save_freq > 0 else 0
    return max(0, step - 1 - max_staleness, saved)


def needed_versions(start: int, steps: int, max_staleness: int, save_freq: int) -> list[int]:
    """The versions batches start+1..steps are sampled by, ascending: what trainer 0 sends."""
    return sorted({version_for(s, max_staleness, save_freq) for s in range(start + 1, steps + 1)})


def staleness_metrics(trajectories, step: int) -> dict[str, float]:
    """Per sampled token, how many updates its sampler lagged behind the policy that trains on it at `step`
    (step - 1 - version): mean, max and the share of each lag (`async/staleness_share_<lag>`)."""
    lags = Counter()
    for t in trajectories:
        for seg in t.segments:
            if seg.trained and seg.version is not None:
                lags[step - 1 - seg.version] += len(seg.token_ids)
    total = sum(lags.values())
    if not total:
        return {}
    out = {"async/staleness_mean": sum(k * n for k, n in lags.items()) / total, "async/staleness_max": float(max(lags))}
    return {**out, **{f"async/staleness_share_{k}": n / total for k, n in sorted(lags.items())}}


def regroup(parts: list, shares: int) -> list:
    """The rollout ranks' Rollouts as `shares` equal runs of whole prompt groups, renumbered from 0: one per trainer."""
    groups: dict[tuple[int, int], list] = {}  # (rank, its group id) -> that group's rows, in order
    for p, part in enumerate(parts):
        for j, t in enumerate(part.trajectories):
            groups.setdefault((p, t.group_id), []).append((p, j))
    keys = list(groups)
    if len(keys) % shares:
        raise RllavaError(f"{len(keys)} prompt groups cannot be split evenly over {shares} trainers")
    per, out = len(keys) // shares, []
    for i in range(shares):
        picked = [(gid, p, j) for gid, key in enumerate(keys[i * per:(i + 1) * per]) for p, j in groups[key]]
        first = parts[0]
        out.append(type(first)(
            trajectories=[replace(parts[p].trajectories[j], group_id=gid) for gid, p, j in picked],
            scores=torch.stack([parts[p].scores[j] for _, p, j in picked]),
            details=[parts[p].details[j] for _, p, j in picked],
            dropped=[r for r, (_, p, j) in enumerate(picked) if j in parts[p].dropped],
            baseline=torch.stack([parts[p].baseline[j] for _, p, j in picked]) if first.baseline is not None else None,
            metrics={k: float(np.mean([q.metrics[k] for q in parts if k in q.metrics])) for k in first.metrics}))
    return out


# ---- messages: pickled objects over the bridge, each tagged by its step or version ----
def _send(group, obj, dst: int, tag: int, pending: list) -> None:
    """Send without waiting; the buffers stay in `pending` until `_settle` sees them received."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
    size = torch.tensor([data.numel()], dtype=torch.int64)
    pending.append((tag, [group.send([size], dst, 2 * tag), group.send([data], dst, 2 * tag + 1)], (size, data)))


def _recv(group, src: int, tag: int):
    size = torch.zeros(1, dtype=torch.int64)
    group.recv([size], src, 2 * tag).wait()
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    group.recv([data], src, 2 * tag + 1).wait()
    return pickle.loads(data.numpy().tobytes())  # from a process of this launch, running this code


def _settle(pending: list, upto: int | None = None) -> None:
    """Wait for the sends tagged <= `upto` (all: None), which the caller knows are received or about to be."""
    for item in [p for p in pending if upto is None or p[0] <= upto]:
        for work in item[1]:
            work.wait()
        pending.remove(item)


BATCH, WEIGHTS = 0, 1  # tag = 2 x step (a batch) or 2 x version + 1 (weights)


# ---- the trainers' side ----
def train(run, learn) -> str:
    """`train_loop` on Rollouts received from the rollout ranks; each update's weights go out if a batch needs them."""
    cfg = run.cfg
    group, _, trainers = D.bridge()
    leader, rollout_ranks = trainers, range(trainers, group.size())
    pending: list = []
    start = C.read_state(run.resume_from)["global_step"] if run.resume_from else 0
    needed = set(needed_versions(start, run.steps, cfg.trainer.max_staleness, cfg.trainer.save_freq))

    def publish(version: int) -> None:
        if version not in needed:
            return
        model = run.actor.engine.model  # every trainer gathers (FSDP2), trainer 0 sends
        weights = {n: t.to("cpu", copy=True) for b in weight_buckets(model, cfg.rollout.bucket_size) for n, t in b}
        if D.is_main():
            for dst in rollout_ranks:
                _send(group, weights, dst, 2 * version + WEIGHTS, pending)

    def step(_, timer: Timer):
        if run.step == start + 1:  # the checkpoint's (or the initial) weights, loaded by train_loop by now
            publish(start)
        with timer("wait_rollout"):  # the rollout ranks' lag behind this trainer
            got = _recv(group, leader, 2 * run.step + BATCH)
        _settle(pending, 2 * got["version"] + WEIGHTS)  # its weights were received before it was sampled
        metrics, batch = learn(got["rollouts"], timer)
        metrics.update(got["timings"])
        if "sampler" in got:  # what trainer 0's checkpoint holds of the rollout ranks
            run.sampler.load_state_dict(got["sampler"])
            run.rollout_rng = got["rng"]
        with timer("publish_weights"):  # gathered, copied to the host, handed to gloo (the send overlaps)
            publish(run.step)
        return metrics, batch

    try:
        return train_loop(run, step, "rlvr (async)", draw=lambda: [])
    finally:
        _settle(pending)


# ---- the rollout ranks' side ----
def serve(cfg, make_produce) -> str:
    """A rollout rank's run: stages 1-2 of each batch, by the weights the schedule names, sent to the trainers."""
    run = build_run(cfg, role="rollout")  # (SFT+RL hybrids are refused at start-up: the config's _async_problems)
    try:
        baseline = build_algorithm(cfg.algorithm, cfg.actor).needs("baseline_scores")
        # `generate_context`'s train engine here: the received weights, nothing to gather or offload
        received = SimpleNamespace(model=run.model, rollout_phase=lambda shares_train_model: nullcontext())
        produce = make_produce(run, None, baseline, received,
                               lambda s: version_for(s, cfg.trainer.max_staleness, cfg.trainer.save_freq))
        path = C.find_resume(cfg, run.outputs_dir)
        if path:  # the sampler, this rank's RNG states and paused responses after the checkpointed step's batch
            state = C.read_state(path)
            run.sampler.load_state_dict(state["sampler"])
            rng = os.path.join(path, "rng", f"rollout_rank_{D.rank()}.pt")
            if os.path.isfile(rng):  # saved without "extra" in actor.checkpoint.save_contents: the trainers warn
                C.set_rng_state(C.load_rng_file(rng))
            partial = os.path.join(path, "rng", f"rollout_partial_rank_{D.rank()}.pt")
            if run.partial is not None and os.path.isfile(partial):
                run.partial.load_state_dict(C.load_rng_file(partial))
            run.step = int(state["global_step"])
        _serve(run, produce)
    finally:
        run.reward.close()
    return run.outputs_dir


def _serve(run, produce) -> None:
    cfg = run.cfg
    group, _, trainers = D.bridge()  # made by every process of the launch, the trainers' too
    if cfg.trainer.val_only:  # the trainers validate and stop: nothing to sample
        return
    k, save_freq = cfg.trainer.max_staleness, cfg.trainer.save_freq
    versions, held, pending = iter(needed_versions(run.step, run.steps, k, save_freq)), -1, []
    for s in range(run.step + 1, run.steps + 1):
        run.step, version = s, version_for(s, k, save_freq)
        while held < version:  # every version sent arrives in order; the newest needed one is loaded
            held = next(versions)
            weights = _recv(group, 0, 2 * held + WEIGHTS)
            if held == version:
                missing, unexpected = run.model.load_state_dict(weights, strict=False)
                if missing or unexpected:
                    raise RllavaError(f"the trainers' weights do not fit the rollout ranks' copy of actor.model: "
                                      f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
            del weights
        timer = Timer()
        r = produce(run.next_samples(), timer)
        parts, timings = D.gather([r]), D.mean_metrics(timer.pop())
        saved = save_freq > 0 and (s % save_freq == 0 or s == run.steps)  # the trainers checkpoint after step s
        states = D.gather([{"rng": C.rng_state(), "partial": run.partial.state_dict() if run.partial else None}]) \
            if saved else None
        _settle(pending, 2 * (s - 1 - k) + BATCH)  # trained already: its weights were needed for this batch
        if D.is_main():
            for dst, share in enumerate(regroup(parts, trainers) if len(parts) > 1 or trainers > 1 else parts):
                msg = {"rollouts": share, "version": version, "timings": timings}
                if dst == 0 and saved:
                    msg.update(sampler=run.sampler.state_dict(), rng=states)
                _send(group, msg, dst, 2 * s + BATCH, pending)
    _settle(pending)
