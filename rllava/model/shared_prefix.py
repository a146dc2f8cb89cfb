"""Shared-prefix forward (Prefix Grouper, arXiv 2506.05433): a group's K responses run after ONE copy of its prompt.

GRPO's K rows of a group begin with the same prompt, image tokens included, usually longer than the response in a
VLM: the padded forward computes it K times (vision tower, every layer, and the backward). Here each group is laid
out as one sequence [prompt, response_1, ..., response_K] under a 4-D attention mask letting response k attend to
the prompt and its own earlier tokens only, every token keeping its own row's position ids (the model's own M-RoPE
positions). Each hidden state is then the K-copies forward's (exact up to floating-point summation order), the K
responses' gradients all flow into the one prompt, and each distinct image is encoded once.

Rows share a prompt when they are in the same group, their given first segment (the prompt) has the same tokens and
images, and no image or video token follows it (an agent's image observations: such a row runs alone, as in the
padded forward). Layouts: one sequence per group, padded to the longest (`packed=False`), or all groups in one row
(`packed=True`, for `padding_free`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rllava.data.protocol import Batch, Trajectory, concat_mm


@dataclass
class PrefixLayout:
    """Where each token of a batch runs in the shared-prefix layout."""

    source_row: torch.Tensor  # [R, L] the batch row a layout position is read from (-1: padding)
    source_pos: torch.Tensor  # [R, L] its position in that row
    allowed: torch.Tensor  # [R, L, L] bool: query position q may attend key position k
    index: torch.Tensor  # [B, T] flat layout index (r * L + j) of each real token of the batch; -1 elsewhere
    media_rows: list[int]  # the row whose images each layout sequence carries, in layout order
    shared_rows: int  # rows that run after another row's copy of their prompt


def prompt_length(t: Trajectory) -> int:
    """Tokens of the trajectory's given first segment (its prompt); 0 when it opens with a trained one."""
    return len(t.segments[0].token_ids) if t.segments and not t.segments[0].trained else 0


def _same_media(a: Trajectory, b: Trajectory) -> bool:
    return a.mm_inputs.keys() == b.mm_inputs.keys() and all(
        a.mm_inputs[k] is b.mm_inputs[k] or torch.equal(a.mm_inputs[k], b.mm_inputs[k]) for k in a.mm_inputs)


def prefix_layout(batch: Batch, media_token_ids: list[int], *, packed: bool) -> PrefixLayout | None:
    """The layout of `batch`, or None when no two rows share a prompt (the plain forward is then the same)."""
    lengths = batch.attention_mask.sum(-1).tolist()
    media = torch.tensor(media_token_ids, dtype=torch.long, device=batch.input_ids.device)
    sets: dict[tuple, list[int]] = {}  # prompt key -> rows, in order of first appearance
    prompt = {}
    for i, t in enumerate(batch.trajectories):
        row, p = batch.input_ids[i, :lengths[i]], prompt_length(t)
        key = (int(batch.group_ids[i]), p, tuple(row[:p].tolist()))
        if p == 0 or torch.isin(row[p:], media).any() or (
                key in sets and not _same_media(t, batch.trajectories[sets[key][0]])):
            key, p = ("alone", i), lengths[i]  # the whole row as its own "prompt"
        sets.setdefault(key, []).append(i)
        prompt[i] = p
    if len(sets) == len(batch):
        return None
    # each layout sequence: (row, pos) of every position, its owner (-1: the prompt) and its sequence id
    seqs = []
    for s, rows in enumerate(sets.values()):
        first, p = rows[0], prompt[rows[0]]
        src = [(first, j, -1) for j in range(p)]
        for i in rows:
            src += [(i, j, i) for j in range(p, lengths[i])]
        seqs.append((s, src))
    layout_rows = [[x for x in seqs]] if packed else [[x] for x in seqs]
    L = max(sum(len(src) for _, src in row) for row in layout_rows)
    R = len(layout_rows)
    source_row = torch.full((R, L), -1, dtype=torch.long)
    source_pos, owner, seq = torch.zeros_like(source_row), torch.full_like(source_row, -2), torch.full_like(source_row, -1)
    for r, row in enumerate(layout_rows):
        flat = [(s, *x) for s, src in row for x in src]
        n = len(flat)
        t = torch.tensor(flat, dtype=torch.long)  # [n, 4]: seq, row, pos, owner
        seq[r, :n], source_row[r, :n], source_pos[r, :n], owner[r, :n] = t.unbind(-1)
    valid = source_row >= 0
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    allowed = (causal & (seq[:, :, None] == seq[:, None, :]) & valid[:, None, :]
               & ((owner[:, None, :] == -1) | (owner[:, :, None] == owner[:, None, :])))
    allowed |= torch.eye(L, dtype=torch.bool) & ~valid[:, :, None]  # padding attends to itself (no empty row)
    index = torch.full(batch.input_ids.shape, -1, dtype=torch.long)
    flat = torch.arange(R * L).view(R, L)
    real = valid & (owner != -1)  # response positions: their own row's tokens
    index[source_row[real], source_pos[real]] = flat[real]
    for rows in sets.values():  # prompt positions: every row of the set reads the one copy
        first = rows[0]
        where = (source_row == first) & (owner == -1)
        for i in rows:
            index[i, source_pos[where]] = flat[where]
    return PrefixLayout(source_row, source_pos, allowed, index, [rows[0] for rows in sets.values()],
                        shared_rows=len(batch) - len(sets))


def layout_inputs(batch: Batch, layout: PrefixLayout, positions: torch.Tensor, dtype: torch.dtype) -> dict:
    """Forward kwargs of the layout: ids, the 4-D additive mask, the rows' own `positions` ([P, B, T], P = 1 or
    4 position rows) moved to their layout places, and each layout sequence's images once."""
    device = batch.input_ids.device
    row, pos = layout.source_row.clamp(min=0).to(device), layout.source_pos.to(device)
    valid = layout.source_row.to(device) >= 0
    ids = torch.where(valid, batch.input_ids[row, pos], batch.input_ids[0, 0])
    mask = torch.zeros(layout.allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~layout.allowed.to(device), torch.finfo(dtype).min)
    inputs = {"input_ids": ids, "attention_mask": mask[:, None],
              "position_ids": torch.where(valid, positions[:, row, pos], 0).squeeze(0)}
    return {**inputs, **concat_mm([batch.trajectories[i].mm_inputs for i in layout.media_rows])}
