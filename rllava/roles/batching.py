"""Splitting a batch for the roles' passes: mini-batches (one optimizer step each), micro-batches (a forward
each) by row count or by a token budget (`MicroBatching`), the no-grad passes over them (`forward_in_chunks`,
`compute_logprobs`: old log-probs, the reference's, a critic's values), and the means logged over them."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

import torch

from rllava import distributed as D
from rllava.data.protocol import Batch
from rllava.model import ulysses
from rllava.model.forward import LOGPROB_CHUNK, compute_device, token_logprobs


def chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def token_budget_groups(lengths: list[int], max_tokens: int, *, packed: bool) -> list[list[int]]:
    """Indices of `lengths` grouped so that each group's token count, what its forward computes over, stays within
    `max_tokens`: the sum of its lengths when `packed` (padding-free), else rows x its longest row (`Batch.select`
    pads to that). Rows are taken longest first, added to the current group until the next would overflow it: rows
    of similar length together waste less padding and leave fewer partly empty groups. A row over the budget gets a
    group of its own. Each group lists its indices in ascending order."""
    groups: list[list[int]] = []
    group: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):  # stable: equal lengths keep row order
        rows = group + [i]
        tokens = sum(lengths[j] for j in rows) if packed else len(rows) * max(lengths[j] for j in rows)
        if group and tokens > max_tokens:
            groups.append(sorted(group))
            rows = [i]
        group = rows
    return groups + [sorted(group)] if group else groups


@dataclass(frozen=True)
class MicroBatching:
    """How a batch's rows are split into micro-batches (one forward each, and in an update one backward): `size`
    rows each, in row order, or with `max_tokens` (RLLaVA's `dynamic_batching`) as many rows as fit that token
    budget (`token_budget_groups`). `padding_free` micro-batches run packed (`rllava.model.forward.packed_inputs`),
    which also changes what a micro-batch's tokens count."""

    size: int
    max_tokens: int | None = None
    padding_free: bool = False
    shared_prefix: bool = False  # each forward runs a group's prompt once (rllava.model.shared_prefix)

    @property
    def layout(self) -> dict[str, bool]:
        """The forward's layout switches (`token_logprobs` / `ValueModel` keywords)."""
        return {"padding_free": self.padding_free, "shared_prefix": self.shared_prefix}

    def split(self, batch: Batch, rows: list[int]) -> list[list[int]]:
        """`rows` (indices into `batch`) as a list of micro-batches of row indices."""
        if self.max_tokens is None:  # (a hybrid's demonstration rows may make ranks' row counts differ)
            groups = [[rows[i] for i in idx] for idx in chunks(len(rows), self.size)]
        else:
            lengths = batch.attention_mask[rows].sum(-1).tolist()
            groups = [[rows[i] for i in idx] for idx in token_budget_groups(lengths, self.max_tokens,
                                                                            packed=self.padding_free)]
        return equal_count(groups, D.all_max(len(groups)))


def equal_count(groups: list[list[int]], n: int) -> list[list[int]]:
    """`groups` split, the biggest first, until there are `n` (the largest count over ranks: under FSDP each forward
    is a collective); past this rank's rows they come out empty (a teacher's route may hold fewer rows here)."""
    groups = [list(g) for g in groups]
    while len(groups) < n:
        big = max(range(len(groups)), key=lambda i: len(groups[i]))
        g = groups.pop(big)
        groups[big:big] = [g[:len(g) // 2], g[len(g) // 2:]]
    return groups


@torch.no_grad()
def forward_in_chunks(model, batch: Batch, batching: MicroBatching, fn) -> torch.Tensor:
    """`fn(micro)` -> [b, t] for each micro-batch, in eval mode and without grad, gathered into [B, T] (zeros past
    each micro-batch's trimmed length). The old-log-prob, reference and critic-value passes all run this way (under
    sequence parallelism over the group's rows, this rank's kept: `ulysses.union`)."""
    was_training, (batch, own, _), T = model.training, ulysses.union(batch), batch.input_ids.shape[1]
    model.eval()
    out = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=compute_device(model))  # to the host once
    for idx in batching.split(batch, list(range(len(batch)))):
        v = fn(batch.select(idx or [0]).to(out.device))  # []: more forwards than rows here (a teacher's route)
        out[idx, :v.shape[1]] = v[:len(idx)]
    model.train(was_training)
    return out[own, :T].cpu()


def compute_logprobs(model, batch: Batch, batching: MicroBatching, temperature: float, *,
                     chunk_size: int = LOGPROB_CHUNK) -> torch.Tensor:
    """log pi(x_t | x_<t) [B, T] at every trained position, without grad (old-policy / reference pass)."""
    return forward_in_chunks(model, batch, batching, lambda micro: token_logprobs(
        model, micro, temperature=temperature, chunk_size=chunk_size, **batching.layout)[0])


def group_minis(batch: Batch, rows: list[int], groups: int) -> list[list[int]]:
    """`rows` as mini-batches of `groups` whole groups each, in the order of their first rows. A group is one
    prompt's rows (`batch.group_ids`): its K responses, and any row an agent's episode adds (a turn the endpoint
    retokenized starts a row of its own, `rllava.agent.program.chains`), so such a row joins its group's optimizer
    step instead of making one more (34 rows in mini-batches of 32 made a second step of 2 rows)."""
    ids, by_group = batch.group_ids.tolist(), {}
    for i in rows:
        by_group.setdefault(ids[i], []).append(i)
    members = list(by_group.values())
    return [sorted(itertools.chain.from_iterable(members[s:s + groups])) for s in range(0, len(members), groups)]


def _split_groups(batch: Batch, rows: list[int], size: int, group_size: int) -> tuple[list[list[int]], list[int]]:
    """(`rows`' groups as mini-batches of `size` // `group_size` groups, the demonstration rows among `rows`:
    `batch.sft_only`, in no group), both in row order."""
    demos = [] if batch.sft_only is None else [i for i in rows if batch.sft_only[i]]
    skip = set(demos)
    return group_minis(batch, [i for i in rows if i not in skip], max(1, size // group_size)), demos


def mini_batch_count(batch: Batch, size: int, group_size: int) -> int:
    """How many mini-batches `mini_batches` makes of `batch` (the most over ranks: each is a collective step)."""
    return D.all_max(len(_split_groups(batch, list(range(len(batch))), size, group_size)[0]))


def mini_batches(batch: Batch, epochs: int, size: int, rl_mask: torch.Tensor | None = None,
                 sft_mask: torch.Tensor | None = None, parts: list[slice] = (slice(None),), group_size: int = 1):
    """(row indices, aggregation normalisers) of each mini-batch of each epoch: one optimizer step each. A
    mini-batch holds `size` // `group_size` whole groups (`group_minis`; `size` rows when each group has its
    `group_size` rows), and every rank takes as many steps as the rank with the most (`equal_count`). The
    normalisers are the mini-batch's token / sequence counts, so its micro-batches sum to the unsplit loss. With N
    ranks (`size` and `batch` are then this rank's share; gradients are averaged over ranks) each divides by 1/N
    of the *global* counts: the ranks' mean loss is the global mini-batch's, however its tokens are spread.
    `parts`: the rows of each rank of a sequence-parallel group (`ulysses.union`): mini-batch k holds each one's
    k-th, as each rank's own would be.

    Hybrids: the counts are `rl_mask`'s (the RL term's tokens) instead of loss_mask's; `sft_mask` adds its counts
    as `sft_tokens` / `sft_seqs`, and `batch.sft_only` rows (demonstrations beside the groups) are spread evenly
    over the mini-batches of the other rows, so every optimizer step mixes both."""
    rl_mask = batch.loss_mask if rl_mask is None else rl_mask
    each = []
    for part in parts:
        minis, extra = _split_groups(batch, list(range(len(batch)))[part], size, group_size)
        minis = minis or [[]]
        for k, share in enumerate(chunks(len(extra), -(-len(extra) // len(minis))) if extra else []):
            minis[k] = sorted(minis[k] + [extra[j] for j in share])
        each.append(minis)
    minis = [sum(ms, []) for ms in itertools.zip_longest(*each, fillvalue=[])]
    minis = equal_count(minis, D.all_max(len(minis)))
    for _ in range(epochs):
        for mini in minis:
            masks = [rl_mask[mini]] + ([] if sft_mask is None else [sft_mask[mini]])
            counts = D.all_sum([float(c) for m in masks for c in (m.sum(), (m.sum(-1) > 0).sum())])
            norm = [torch.tensor(max(c, 1.0) / D.world_size()) for c in counts]
            yield mini, dict(zip(("num_tokens", "num_seqs", "sft_tokens", "sft_seqs"), norm))


def logged_scale(micros: int, split, mini: list[int], own: range) -> float:
    """The factor on a micro-batch's loss as logged (actor/pg_loss, critic/vf_loss; `MeanMetrics` averages them): under
    sequence parallelism m' = `micros`, the group's rows' count, over m = what `split` makes of this rank's own rows
    of `mini` (size 1's); else 1. The group's m' shares s of a normaliser N x as large (`mini_batches`) log sum(s)/m';
    at size 1 N ranks' m shares, N x as large, average to sum(s)/m (verl: any size, workers/actor/dp_actor.py L662)."""
    if ulysses.size() == 1:
        return 1.0
    return micros / len(split([i for i in mini if i in own]))


class MeanMetrics:
    """Averages named scalars over the micro-/mini-batches of one update. Tensors stay on the device until
    `means()`: reading one (`.item()`) would make the host wait for the device after every micro-batch."""

    def __init__(self):
        self.sums, self.counts = defaultdict(float), defaultdict(int)

    def add(self, metrics: dict[str, float | torch.Tensor]) -> None:
        for name, value in metrics.items():
            self.sums[name] = self.sums[name] + (value.detach() if torch.is_tensor(value) else float(value))
            self.counts[name] += 1

    def means(self) -> dict[str, float]:
        return {k: float(self.sums[k]) / self.counts[k] for k in self.sums}
