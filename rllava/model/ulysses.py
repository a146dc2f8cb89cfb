"""Ulysses sequence parallelism (`actor.model.ulysses_size=N`; DeepSpeed-Ulysses, arXiv:2309.14509, as verl runs it,
volcengine/verl@b178a3c: verl/models/transformers/monkey_patch.py L87 `_ulysses_flash_attention_forward`,
verl/utils/ulysses.py L225 and L243 `gather_outputs_and_unpad(grad_scaler=True)`, the gradient x N). The N
consecutive ranks of a group train on the same rows (`union`), each running the decoder on 1/N of every sequence;
around attention an all-to-all trades the sequence shard for a head shard, so each rank attends over the whole
sequence for H/N heads:

    q, k, v [B, H, L/N, d] -all-to-all-> [B, H/N, L, d] -attention-> [B, L, H/N, d] -all-to-all-> [B, L/N, H, d]

The decoder's input is cut after the model has merged it (text and image embeddings, M-RoPE positions, Qwen3-VL's
deepstack features): the vision tower runs on every rank of the group over the rows' images, so an image whose
tokens fall on two ranks stays whole. Each rank takes the LM head (or the value head) over its own trained
positions; their values are summed over the group (`Local.expand`), so every rank holds the micro-batch's whole
[B, T] log-probs and computes the same loss. That sum's backward sums the N equal gradients: N x each rank's own
positions' share, which the engines' mean over all dp x N ranks (FSDP2, ZeRO-3) turns into the mean over
data-parallel groups of the whole gradient, as with ulysses_size=1."""

from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import fields
from typing import NamedTuple

import torch
import torch.distributed as dist

from rllava import distributed as D

_group: tuple | None = None  # (process group, rank in it, size) of this rank's sequence-parallel group
_decoders: weakref.WeakSet = weakref.WeakSet()  # every module of a sequence-parallel model's decoder
_cutting = False  # trained_hidden's forward: the decoder's input is cut (the rollout's generate is not)


class Shard(NamedTuple):
    """One forward's cut: this rank's 1/N of the padded `length`; `mask` [B, 1, L, L] (True: attend) of the whole
    sequence, causal within each row (each packed sequence), or None: causal."""
    length: int
    mask: torch.Tensor


_current: Shard | None = None


def init(size: int) -> None:
    """The sequence-parallel groups of `size` consecutive ranks (every rank makes every group, in order)."""
    global _group
    world, rank = D.world_size(), D.rank()
    if size > 1 and _group is None:
        for first in range(0, world, size):
            group = dist.new_group(list(range(first, first + size)))
            if first <= rank < first + size:
                _group = (group, rank - first, size)


@contextlib.contextmanager
def groups(size: int):
    """`init(size)` for the block only (the memory planner, on its fake process group)."""
    global _group
    init(size)
    try:
        yield
    finally:
        _group = None


def size() -> int:
    return _group[2] if _group else 1


def enable(model) -> None:
    """Under sequence parallelism, cut `model`'s decoder input in rllava's training forwards and run its attention
    over the group (sdpa / eager); else nothing."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    backbone = getattr(model, model.base_model_prefix)
    decoder = getattr(backbone, "language_model", backbone)
    if _group is None:
        return
    _decoders.update(decoder.modules())
    if not any(h is _cut for h in decoder._forward_pre_hooks.values()):  # (a deep copy has it already)
        decoder.register_forward_pre_hook(_cut, with_kwargs=True)
    for impl in ("sdpa", "eager"):
        if not getattr(ALL_ATTENTION_FUNCTIONS.get(impl), "ulysses", False):
            ALL_ATTENTION_FUNCTIONS[impl] = _attention(impl, ALL_ATTENTION_FUNCTIONS.get(impl))


@contextlib.contextmanager
def cutting():
    """trained_hidden's backbone call: the decoder's input cut (the shard lives on in gradient checkpointing's
    recomputation, `recompute_context`)."""
    global _cutting, _current
    _cutting = _group is not None
    try:
        yield
    finally:
        _cutting, _current = False, None


@contextlib.contextmanager
def _installed(shard: Shard | None):
    global _current
    saved, _current = _current, shard
    try:
        yield
    finally:
        _current = saved


def recompute_context():
    """torch.utils.checkpoint's context_fn: a layer recomputed in the backward sees its forward's shard."""
    return contextlib.nullcontext(), _installed(_current)


def _pad_cut(x: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    """`x` padded (zeros) to `length` along `dim`, then this rank's 1/N of it."""
    if pad := length - x.shape[dim]:
        x = torch.cat([x, x.new_zeros((*x.shape[:dim], pad, *x.shape[dim + 1:]))], dim)
    _, rank, n = _group
    return x.narrow(dim, rank * length // n, length // n)


def _causal(length: int, device) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def _cut(module, args, kwargs):
    """The decoder's pre-hook: its sequence inputs cut to this rank's positions, its mask made whole here."""
    global _current
    if not _cutting:
        return None
    x = kwargs["input_ids"] if kwargs.get("inputs_embeds") is None else kwargs["inputs_embeds"]
    (B, L), (_, rank, n) = x.shape[:2], _group
    heads, kv = module.config.num_attention_heads, module.config.num_key_value_heads
    if heads % n or kv % n:
        raise ValueError(f"actor.model.ulysses_size={n} must divide the decoder's {heads} attention heads and its "
                         f"{kv} key-value heads")
    length, mask, positions = -(-L // n) * n, kwargs.get("attention_mask"), kwargs.get("position_ids")
    whole = None  # right-padded rows: causal alone (a real token's keys are all real; pad positions go untrained)
    if mask is not None and not bool((mask[:, 1:] <= mask[:, :-1]).all()):  # other padding: real keys only
        whole = _causal(length, x.device) & torch.nn.functional.pad(mask.bool(), (0, length - L))[:, None, None, :]
    elif mask is None:  # packed rows (padding-free): causal within each sequence, which restarts at text position 0
        text = positions if positions.dim() == 2 else positions[0]
        seq = torch.nn.functional.pad((text == 0).long(), (0, length - L), value=1).cumsum(-1)
        whole = _causal(length, x.device) & (seq[:, None, :, None] == seq[:, None, None, :])
    _current = Shard(length, whole)
    if positions is None:  # the decoder would number this rank's positions from 0
        positions = torch.arange(L, device=x.device).expand(B, L)
    kwargs = {**kwargs, "attention_mask": None, "position_ids": _pad_cut(positions, positions.dim() - 1, length)}
    if (visual := kwargs.get("visual_pos_masks")) is not None:  # Qwen3-VL's deepstack: this rank's positions' ones
        keep = (torch.arange(L, device=visual.device) // (length // n) == rank).expand_as(visual)[visual]
        kwargs["deepstack_visual_embeds"] = [e[keep.to(e.device)] for e in kwargs["deepstack_visual_embeds"]]
    for name in ("input_ids", "inputs_embeds", "visual_pos_masks"):
        if kwargs.get(name) is not None:
            kwargs[name] = _pad_cut(kwargs[name], 1, length)
    return args, kwargs


class _AllToAll(torch.autograd.Function):
    """dist.all_to_all_single over the group: chunk j of dim 0 to rank j; its own inverse (the backward)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, x = group, x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad, ctx.group), None


class _Sum(torch.autograd.Function):
    """Sum over the group; the backward sums the gradients over it too."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return _Sum.apply(grad, ctx.group), None


def _attention(impl: str, inner):
    """`impl`'s attention function, over the sequence-parallel group for a sequence-parallel decoder's layers."""
    def attention(module, query, key, value, attention_mask, **kwargs):
        shard = _current
        fn = inner or sys.modules[type(module).__module__].eager_attention_forward  # eager: the model's own
        if shard is None or module not in _decoders:
            return fn(module, query, key, value, attention_mask, **kwargs)
        group, _, n = _group

        def heads(x):  # [B, H, L/N, d] -> [B, H/N, L, d]: chunk j (heads j H/N ...) to rank j
            B, H, Ln, d = x.shape
            y = _AllToAll.apply(x.reshape(B, n, H // n, Ln, d).transpose(0, 1), group)
            return y.permute(1, 2, 0, 3, 4).reshape(B, H // n, n * Ln, d)
        mask = shard.mask  # None: causal (sdpa's kernel, no [L, L] mask)
        if impl == "eager":  # an additive mask
            mask = _causal(shard.length, query.device) if mask is None else mask
            mask = torch.zeros(mask.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~mask, torch.finfo(query.dtype).min)
        out, _ = fn(module, heads(query), heads(key), heads(value), mask, **kwargs)  # [B, L, H/N, d]
        B, L, Hn, d = out.shape
        y = _AllToAll.apply(out.reshape(B, n, L // n, Hn, d).transpose(0, 1), group)  # piece j to rank j
        return y.permute(1, 2, 0, 3, 4).reshape(B, L // n, n * Hn, d), None
    attention.ulysses = True
    return attention


class Local(NamedTuple):
    """The trained positions [B, T-1] of a cut forward and which of them (`sel` [N]) this rank computed."""
    target: torch.Tensor
    sel: torch.Tensor

    def pick(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T-1] at this rank's trained positions [n]."""
        return x[self.target][self.sel.to(x.device)]

    def expand(self, values: torch.Tensor) -> torch.Tensor:
        """This rank's values [n] -> every trained position's [N], summed over the group (see the docstring)."""
        full = values.new_zeros(len(self.sel), *values.shape[1:])
        full[self.sel.to(values.device)] = values
        return _Sum.apply(full, _group[0])


def take(hidden: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, target: torch.Tensor):
    """(hidden states at (rows, cols) [N, H], target): under a cut forward only this rank's, with `Local`."""
    if _current is None:
        return hidden[rows, cols], target
    _, rank, n = _group
    sel = cols // (_current.length // n) == rank
    return hidden[rows[sel], cols[sel] - rank * _current.length // n], Local(target, sel)


# A row's value where it has none of a field (and its padding's): collate leaves these None on a rank with no such row
# (expert token, demonstration, agent turn; sampled token: a rollout engine gives every one's log-prob or none)
_NONE = {"off_policy_mask": 0, "sft_only": False, "turn_index": -1, "turn_anchors": -1, "turn_rewards": 0,
         "rollout_logprobs": 0}


def union(batch):
    """(the group's rows, this rank's among them, each rank's): every rank's batch in rank order, 2-D tensors
    right-padded to the longest (`_NONE`), group ids kept apart; without a group (batch, all, [all])."""
    if _group is None:
        return batch, slice(None), [slice(None)]
    parts, out = [None] * _group[2], {}
    dist.all_gather_object(parts, batch, group=_group[0])
    T, sizes = max(p.input_ids.shape[1] for p in parts), [len(p) for p in parts]
    step = max(int(q.group_ids.max()) + 1 for q in parts if len(q))
    for k, p in enumerate(parts):  # rank k's group ids past the earlier ranks'
        p.group_ids = p.group_ids + k * step
    for f in fields(batch):
        values = [getattr(p, f.name) for p in parts]
        out[f.name] = like = next((v for v in values if v is not None), None)
        if isinstance(like, list):
            out[f.name] = [x for v in values for x in v]
        elif isinstance(like, torch.Tensor):  # a rank's None: what its rows hold, as in one process's collate
            values = [torch.full((len(p), p.input_ids.shape[1])[:like.dim()], _NONE[f.name], dtype=like.dtype)
                      if v is None else v for p, v in zip(parts, values)]
            out[f.name] = torch.cat([torch.nn.functional.pad(v, (0, T - v.shape[1]), value=_NONE.get(f.name, 0))
                                     if v.dim() == 2 else v for v in values])
    parts = [slice(sum(sizes[:k]), sum(sizes[:k + 1])) for k in range(len(sizes))]
    return type(batch)(**out), parts[_group[1]], parts
