"""The one place that runs a (VL)M forward for training: per-token log-probs and entropy of a Batch.

Only positions whose next token is trained go through the LM head (`trained_hidden`), and three switches change
memory, speed or work, never the numbers: `chunk_size` (at most that many positions through the head at a time,
`logprobs_from_hidden`), `padding_free` (the rows packed into one, `packed_inputs`) and `shared_prefix` (each
group's prompt run once, `rllava.model.shared_prefix`).
"""

from __future__ import annotations

import functools

import torch
from torch.utils.checkpoint import checkpoint

from rllava import distributed as D
from rllava.data.protocol import Batch, concat_mm
from rllava.model import ulysses
from rllava.model.shared_prefix import layout_inputs, prefix_layout


def model_inputs(model, batch: Batch, inputs: dict | None = None) -> dict[str, torch.Tensor]:
    """Forward kwargs for `batch` (or the given `inputs`): ids, mask, pixel tensors, and for Qwen-VL the per-token
    modality types (`mm_token_type_ids`: 0 text, 1 image, 2 video) its M-RoPE position ids are computed from."""
    inputs = batch.model_inputs() if inputs is None else inputs
    types = modality_types(model, inputs["input_ids"])
    return inputs if types is None else {**inputs, "mm_token_type_ids": types}


# what Qwen-VL's `get_rope_index` reads besides the ids: the images' and videos' grids (and video timing)
MROPE_KEYS = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")


def modality_types(model, ids: torch.Tensor) -> torch.Tensor | None:
    """Qwen-VL's `mm_token_type_ids` of `ids` (0 text, 1 image, 2 video); None for a model without images."""
    image_id, video_id = (getattr(model.config, k, None) for k in ("image_token_id", "video_token_id"))
    if image_id is None:
        return None
    types = (ids == image_id).int()
    return types if video_id is None else types + 2 * (ids == video_id).int()


def _backbone_and_head(model):
    """(decoder returning hidden states, LM head) of a HF causal LM or VLM."""
    return getattr(model, model.base_model_prefix), model.get_output_embeddings()


def packed_inputs(model, batch: Batch) -> dict[str, torch.Tensor]:
    """Forward kwargs running `batch` as one row [1, L] (L = its real tokens) without padding or attention mask:
    the position ids restart at 0 in each row, and transformers reads a position that does not follow its
    predecessor as a new sequence (masking_utils' `find_packed_sequence_indices`): each row gets its own causal
    block under sdpa/eager, the varlen kernel under flash_attention_2. M-RoPE models (Qwen-VL) take [4, 1, L]
    positions: that text row, from which the mask is built, then the (t, h, w) rows the padded forward computes."""
    inputs = model_inputs(model, batch)
    mask = inputs.pop("attention_mask").bool()  # [B, T]
    positions = (mask.cumsum(-1) - 1)[mask][None]  # [1, L]: 0..len_i-1 for each row i
    backbone, _ = _backbone_and_head(model)
    if hasattr(backbone, "get_rope_index"):
        positions = torch.cat([positions[None], _mrope_rows(backbone, inputs, mask)[:, mask][:, None]])  # [4, 1, L]
    for name in ("input_ids", "mm_token_type_ids"):
        if name in inputs:
            inputs[name] = inputs[name][mask][None]
    return {**inputs, "position_ids": positions}


def _mrope_rows(backbone, inputs: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """[3, B, T] M-RoPE (t, h, w) positions of the padded rows: the model's own `get_rope_index` (each row
    from its own images). Text-only rows count 0, 1, ..."""
    grids = {k: inputs[k] for k in MROPE_KEYS if k in inputs}
    if not grids:
        return (mask.long().cumsum(-1) - 1).clamp(min=0)[None].expand(3, -1, -1)
    rope, _ = backbone.get_rope_index(inputs["input_ids"], mm_token_type_ids=inputs["mm_token_type_ids"],
                                      attention_mask=mask.long(), **grids)
    return rope


def shared_prefix_inputs(model, batch: Batch, packed: bool):
    """(forward kwargs, layout) running `batch` with each group's prompt once (`rllava.model.shared_prefix`), or
    None when no two of its rows share a prompt. Every token keeps its own row's position ids."""
    media_ids = [getattr(model.config, k) for k in ("image_token_id", "video_token_id")
                 if getattr(model.config, k, None) is not None]  # none for a text-only LM
    layout = prefix_layout(batch, media_ids, packed=packed)
    if layout is None:
        return None
    mask = batch.attention_mask
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)[None]  # [1, B, T]
    backbone, _ = _backbone_and_head(model)
    if hasattr(backbone, "get_rope_index"):
        grids = concat_mm([t.mm_inputs for t in batch.trajectories], keys=MROPE_KEYS)
        rope = _mrope_rows(backbone, {"input_ids": batch.input_ids, **grids,
                                      "mm_token_type_ids": modality_types(model, batch.input_ids)}, mask)
        positions = torch.cat([positions, rope])  # [4, B, T]: text row, then (t, h, w)
    return model_inputs(model, batch, layout_inputs(batch, layout, positions, next(model.parameters()).dtype)), layout


# each media kind a VLM's vision tower encodes: (its feature method, its pixel key, its grid key)
MEDIA = {"image": ("get_image_features", "pixel_values", "image_grid_thw"),
         "video": ("get_video_features", "pixel_values_videos", "video_grid_thw")}


def compute_device(model) -> torch.device:
    """Where `model` computes: its parameters' device, except a DTensor's that rests elsewhere (FSDP2's CPU
    offload keeps the shards on the host and gathers them onto the mesh's device for each forward; the reference
    of RLLaVA's offloaded config ran its first forward with inputs on the host, issue 46's GPU run)."""
    p = next(model.parameters())
    mesh = getattr(p, "device_mesh", None)
    return torch.device(mesh.device_type) if mesh is not None and mesh.device_type != p.device.type else p.device


def _dummy_media(backbone, kind: str) -> dict:
    """The smallest input of `kind` the VLM's vision tower takes: Qwen-VL, one 2 x 2-merged patch grid (a frame
    pair for video); the modular VLM, one image of the tower's size."""
    vision, device = backbone.config.vision_config, compute_device(backbone)
    _, pixels, grid = MEDIA[kind]
    if hasattr(vision, "temporal_patch_size"):  # Qwen-VL: flattened patches and their (t, h, w) grid
        m = getattr(vision, "spatial_merge_size", 2)
        width = getattr(vision, "in_channels", 3) * vision.temporal_patch_size * vision.patch_size ** 2
        return {pixels: torch.zeros(m * m, width, device=device), grid: torch.tensor([[1, m, m]], device=device)}
    size = getattr(vision, "image_size", 224)
    return {pixels: torch.zeros(1, getattr(vision, "num_channels", 3), size, size, device=device)}


def _tensors(x):
    if torch.is_tensor(x):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict) or hasattr(x, "values"):
        for y in x.values():
            yield from _tensors(y)


def _media_first(backbone, inputs: dict) -> tuple[dict, torch.Tensor | None]:
    """Under FSDP2 / DeepSpeed ZeRO-3 every rank must run the same collectives in the same order, but the vision
    tower's shards are gathered only for a micro-batch with an image (or video): a rank of text-only rows would
    skip them (gloo: `Received data size doesn't match expected size`; NCCL: a hang). So on several ranks a VLM
    encodes each media kind it takes before its forward, image then video: the rows' own media (passed on as
    `mm_encoder_outputs`), or, for a kind the rows lack, its smallest input, whose outputs come back as 0 x their
    sum (added to the hidden states: only the tower's zero gradient changes, reduced like the rest). Returns (the
    forward's inputs, that zero or None); one rank, or a model without images: the inputs as they are."""
    vision = getattr(backbone.config, "vision_config", None)
    if D.world_size() == 1 or vision is None or not hasattr(backbone, "get_image_features"):
        return inputs, None
    inputs, encoded, zero = dict(inputs), {}, None
    for kind, (method, pixels, grid) in MEDIA.items():
        if not hasattr(backbone, method):
            continue
        if inputs.get(pixels) is not None:
            args = {pixels: inputs.pop(pixels), **({grid: inputs[grid]} if inputs.get(grid) is not None else {})}
            encoded[kind] = getattr(backbone, method)(**args, return_dict=True)
        else:
            out = getattr(backbone, method)(**_dummy_media(backbone, kind), return_dict=True)
            part = 0.0 * sum(t.float().sum() for t in _tensors(out) if t.is_floating_point())
            zero = part if zero is None else zero + part
    return ({**inputs, "mm_encoder_outputs": encoded} if encoded else inputs), zero


def trained_hidden(model, batch: Batch, *, padding_free: bool = False,
                   shared_prefix: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(h [N, H], target [B, T-1]): the backbone's last hidden state at every position t whose next token is
    trained (target[b, t] = loss_mask[b, t+1]), in row-major order. Shared by the LM head and the critic.
    Every rank runs the same collectives whatever its rows hold (`_media_first`)."""
    backbone, _ = _backbone_and_head(model)
    target = batch.loss_mask[:, 1:] > 0
    shared = shared_prefix_inputs(model, batch, padding_free) if shared_prefix else None
    if shared is not None:
        inputs, layout = shared
    else:
        inputs = packed_inputs(model, batch) if padding_free else model_inputs(model, batch)
    inputs, zero = _media_first(backbone, inputs)
    with ulysses.cutting():  # actor.model.ulysses_size: this rank's part of each sequence (rllava.model.ulysses)
        hidden = backbone(**inputs, use_cache=False).last_hidden_state  # [R, L, H] shared, [1, L, H] packed, [B, T, H]
        if shared is not None:  # -> [N, H], the trained positions
            hidden = hidden.flatten(0, 1)[layout.index.to(hidden.device)[:, :-1][target]]
        else:  # (row, position) of each trained position; packed: the count of real tokens before it in the row
            rows, cols = target.nonzero(as_tuple=True)
            if padding_free:
                packed = batch.attention_mask.flatten().cumsum(0).view(batch.attention_mask.shape) - 1
                rows, cols = torch.zeros_like(rows), packed[:, :-1][target]
            hidden, target = ulysses.take(hidden, rows.to(hidden.device), cols.to(hidden.device), target)
    return (hidden if zero is None else hidden + zero.to(hidden.dtype)), target


# Trained tokens per LM-head chunk (actor.logprob_chunk_size): at 4096 tokens of a 152k vocabulary the log-prob
# pass then peaks at ~0.18x the full-logits pass (benchmarks/logprob_memory.py: 1024 -> 0.25x, 256 -> 0.14x).
LOGPROB_CHUNK = 512


def _chunk_logprobs(head, h: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool,
                    entropy_grad: bool) -> tuple[torch.Tensor, ...]:
    """(log p(labels) [n],) or (log p [n], entropy [n]) of softmax(head(h) / temperature) for n hidden states."""
    logits = head(h).float()  # [n, V]
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, labels[:, None]).squeeze(-1)
    if not with_entropy:
        return (lp,)
    p_logp = logp if entropy_grad else logp.detach()  # a detached metric unless there is an entropy bonus
    return lp, -(p_logp.exp() * p_logp).sum(-1)


def _head_logp(h: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax((h W^T).float() / temperature) [n, V], dividing in place."""
    z = (h @ weight.T).float()
    if temperature != 1.0:
        z.div_(temperature)
    return torch.log_softmax(z, dim=-1)


class _ChunkedHead(torch.autograd.Function):
    """log p(labels) and entropy of softmax(h W^T / T), chunk by chunk, with a hand-written backward.

    Neither pass keeps a [N x V] tensor: the forward saves only h; the backward recomputes one chunk's logits,
    turns them into d loss / d logits with the closed forms below, and accumulates d/dh and d/dW (in place,
    one [V x H] buffer for all chunks). With z = logits / T, p = softmax(z), y the label:
        d logp_y / dz_j = 1[j = y] - p_j          d H / dz_j = -p_j (log p_j + H)
    """

    @staticmethod
    def forward(ctx, h, weight, labels, temperature, chunk, entropy_grad):
        lp, ent = h.new_empty(len(h), dtype=torch.float32), h.new_empty(len(h), dtype=torch.float32)
        for s in range(0, len(h), chunk):
            sl = slice(s, s + chunk)
            logp = _head_logp(h[sl], weight, temperature)
            lp[sl] = logp.gather(-1, labels[sl, None]).squeeze(-1)
            ent[sl] = -logp.exp().mul_(logp).sum(-1)
        ctx.save_for_backward(h, weight, labels, ent)
        ctx.temperature, ctx.chunk, ctx.entropy_grad = temperature, chunk, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        h, weight, labels, ent = ctx.saved_tensors
        T, chunk = ctx.temperature, ctx.chunk
        grad_h, grad_w = torch.empty_like(h), torch.zeros_like(weight)
        for s in range(0, len(h), chunk):
            hc, sl = h[s:s + chunk], slice(s, s + chunk)
            logp = _head_logp(hc, weight, T)  # [n, V]; at most two such buffers are alive at once
            grad_z = logp.exp()  # p
            if ctx.entropy_grad and g_ent is not None:  # p * (-g_lp - g_ent (log p + H)), in logp's memory
                grad_z.mul_(logp.add_(ent[sl, None]).mul_(-g_ent[sl, None]).sub_(g_lp[sl, None]))
            else:
                grad_z.mul_(-g_lp[sl, None])
            del logp
            grad_z[torch.arange(len(hc), device=hc.device), labels[sl]] += g_lp[sl]
            grad_z = grad_z.div_(T).to(weight.dtype)
            grad_h[sl] = grad_z @ weight
            grad_w.addmm_(grad_z.T, hc)
        return grad_h, grad_w, None, None, None, None


def logprobs_from_hidden(head, h: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                         with_entropy: bool = False, entropy_grad: bool = False,
                         chunk_size: int = LOGPROB_CHUNK) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(labels) [N] (and entropy [N] or None) under softmax(head(h) / temperature), `chunk_size` rows of
    h at a time (<= 0: all N at once, i.e. full [N x V] logits). Chunking alone bounds memory only without grad:
    autograd would keep every chunk's [n x V] log-softmax (the full logits again) and add a fresh [V x H] head
    gradient per chunk. So with grad a bias-free linear head (every Qwen / LLaMA-style LM head) runs through
    `_ChunkedHead` (one extra head matmul per chunk, the head gradient accumulated in place); any other head
    (e.g. one wrapped by LoRA) runs each chunk under activation checkpointing."""
    step = chunk_size if chunk_size > 0 else max(len(h), 1)
    plain = type(head) is torch.nn.Linear and head.bias is None
    if torch.is_grad_enabled() and chunk_size > 0 and len(h):
        if plain:
            lp, ent = _ChunkedHead.apply(h, head.weight, labels, temperature, step, entropy_grad)
            return lp, (ent if with_entropy else None)
        outs = [checkpoint(_chunk_logprobs, head, h[s:s + step], labels[s:s + step], temperature, with_entropy,
                           entropy_grad, use_reentrant=False) for s in range(0, len(h), step)]
    else:  # a plain head by its weight: calling the module once per chunk would make the calls data-dependent,
        # which DeepSpeed ZeRO-3 (it traces module calls, the same on every rank) cannot follow
        fn = functools.partial(torch.nn.functional.linear, weight=head.weight) if plain else head
        outs = [_chunk_logprobs(fn, h[s:s + step], labels[s:s + step], temperature, with_entropy, entropy_grad)
                for s in range(0, len(h), step)]
    if not outs:  # no trained token in this micro-batch (an HPT group trained on its demonstration instead): a
        # zero that still reaches the head (`fn`, as the no-grad branch took it) and the backbone, so the backward
        # runs, and under FSDP / ZeRO-3 its collectives run like every other rank's
        outs = [(fn(h).sum(-1).float() * 0,) * (2 if with_entropy else 1)]
    cols = [torch.cat(col) for col in zip(*outs)]
    return cols[0], (cols[1] if with_entropy else None)


def _kl_rows(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """sum_v p_v (log p_v - log q_v) of each row of two [n, V] log-distributions."""
    return (logp.exp() * (logp - logq)).sum(-1)


def _chunk_kl(head, h, ref_h, ref_weight, temperature: float) -> torch.Tensor:
    """KL(softmax(head(h) / T) || softmax(ref_h ref_weight^T / T)) [n]; autograd through `head` only."""
    logits = head(h).float()[:, :len(ref_weight)]
    return _kl_rows(torch.log_softmax(logits / temperature, -1), _head_logp(ref_h, ref_weight, temperature))


class _ChunkedKL(torch.autograd.Function):
    """KL(p || q) per row, p = softmax(h W^T / T) (the policy), q = softmax(h_r W_r^T / T) (the reference, no grad),
    chunk by chunk: like `_ChunkedHead`, only the hidden states are saved and each chunk's two [n x V]
    log-softmaxes are recomputed in the backward, with (z = h W^T / T)

        d KL / d z_j = p_j (log p_j - log q_j - KL)
    """

    @staticmethod
    def forward(ctx, h, weight, ref_h, ref_weight, temperature, chunk):
        kl = h.new_empty(len(h), dtype=torch.float32)
        for s in range(0, len(h), chunk):
            sl = slice(s, s + chunk)
            kl[sl] = _kl_rows(_head_logp(h[sl], weight, temperature), _head_logp(ref_h[sl], ref_weight, temperature))
        ctx.save_for_backward(h, weight, ref_h, ref_weight, kl)
        ctx.temperature, ctx.chunk = temperature, chunk
        return kl

    @staticmethod
    def backward(ctx, g):
        h, weight, ref_h, ref_weight, kl = ctx.saved_tensors
        T = ctx.temperature
        grad_h, grad_w = torch.empty_like(h), torch.zeros_like(weight)
        for s in range(0, len(h), ctx.chunk):
            sl = slice(s, s + ctx.chunk)
            logp = _head_logp(h[sl], weight, T)
            diff = (logp - _head_logp(ref_h[sl], ref_weight, T)).sub_(kl[sl, None])
            grad_z = logp.exp_().mul_(diff).mul_(g[sl, None] / T).to(weight.dtype)
            del logp, diff
            grad_h[sl] = grad_z @ weight
            grad_w.addmm_(grad_z.T, h[sl])
        return grad_h, grad_w, None, None, None, None


def full_kl_from_hidden(head, h: torch.Tensor, ref_h: torch.Tensor, ref_weight: torch.Tensor, *,
                        temperature: float = 1.0, chunk_size: int = LOGPROB_CHUNK) -> torch.Tensor:
    """KL(pi || pi_ref) over the whole vocabulary at each of N positions [N] (`actor.kl_loss_type=full`,
    `algorithm.kl_penalty=full`), both at the sampling temperature:

        KL_t = sum_v pi(v | x_<t) (log pi(v | x_<t) - log pi_ref(v | x_<t))

    from the policy's hidden states `h` [N, H] through its `head` and the reference's `ref_h` [N, H] through its
    head weight `ref_weight` [V, H]. Exact, unlike the sampled k1/k2/k3 estimates, and never negative. The two
    [N x V] distributions are never stored: `chunk_size` rows at a time as the log-prob pass, with grad through
    `_ChunkedKL` for a bias-free linear head (recomputing each chunk in the backward), else under activation
    checkpointing (LoRA on the LM head). The reference gets no grad.

    Why hidden states: the KL needs both whole distributions at the same positions; the reference's [B, T, V]
    cannot be stored until the update and a top-k summary is not exact, but its last hidden states ([N, H],
    H << V) plus its head are. So the reference runs on the same micro-batch, without grad, right before the
    policy's forward: in the update for the loss (`Actor._backward`), beside the old policy in the reference
    stage for the reward (`Reference.full_kl`). Cost: one reference forward per micro-batch, two more head
    matmuls per chunk (four in the backward). Both heads must be whole in one process: single-device engine only
    (FSDP2 / DeepSpeed shard them: a start-up error says so). Heads of different lengths (a distillation teacher
    with the same tokenizer, its embedding padded to another multiple: Qwen2.5-VL-3B's 151936 rows, 7B's 152064)
    are compared over their common first rows, every real token; the padding rows past them are never sampled."""
    step = chunk_size if chunk_size > 0 else max(len(h), 1)
    rows = min(len(ref_weight), head.weight.shape[0])
    ref_h, ref_weight = ref_h.detach(), ref_weight.detach()[:rows]
    plain = type(head) is torch.nn.Linear and head.bias is None
    if torch.is_grad_enabled() and len(h):
        if plain:
            return _ChunkedKL.apply(h, head.weight[:rows], ref_h, ref_weight, temperature, step)
        return torch.cat([checkpoint(_chunk_kl, head, h[s:s + step], ref_h[s:s + step], ref_weight, temperature,
                                     use_reentrant=False) for s in range(0, len(h), step)])
    fn = functools.partial(torch.nn.functional.linear, weight=head.weight[:rows]) if plain else head
    return torch.cat([_chunk_kl(fn, h[s:s + step], ref_h[s:s + step], ref_weight, temperature)
                      for s in range(0, len(h), step)] or [h.new_zeros(0, dtype=torch.float32)])


def _scatter(values: torch.Tensor, target) -> torch.Tensor:
    """[N] values at the target positions -> [B, T] (position t+1 holds target t's value; zeros elsewhere); a
    sequence-parallel rank's own values (`ulysses.Local`) first become every position's."""
    if isinstance(target, ulysses.Local):
        values, target = target.expand(values), target.target
    B, T1 = target.shape
    out = values.new_zeros(B, T1 + 1)
    out[:, 1:][target] = values
    return out


# Under FSDP2 the backbone and head must run inside a forward of the sharded root, so that its parameters are
# gathered: the FSDP2 engine installs `_token_logprobs` as this method of the root and registers it with FSDP.
FSDP_FORWARD_METHOD = "rllava_token_logprobs"


def token_logprobs(model, batch: Batch, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """See `_token_logprobs` (this entry point routes through the FSDP2 forward method when there is one)."""
    method = getattr(model, FSDP_FORWARD_METHOD, None)
    return method(batch, **kwargs) if method is not None else _token_logprobs(model, batch, **kwargs)


def _token_logprobs(model, batch: Batch, *, temperature: float = 1.0, with_entropy: bool = False,
                    entropy_grad: bool = False, chunk_size: int = LOGPROB_CHUNK, padding_free: bool = False,
                    shared_prefix: bool = False, ref_hidden: list[tuple[torch.Tensor, torch.Tensor]] | None = None
                    ) -> tuple[torch.Tensor, ...]:
    """log pi(x_t | x_<t) [B, T] and the policy's entropy at t ([B, T] or None), zero where loss_mask[t] = 0.

    Logits are divided by the sampling `temperature` (the distribution the rollout sampled from). `chunk_size`:
    see `logprobs_from_hidden`; `padding_free`: `packed_inputs`; `shared_prefix`: `shared_prefix_inputs`. The
    entropy carries grad only with `entropy_grad` (an entropy bonus), else it is a detached metric. `ref_hidden`:
    other models' (hidden states at the same trained positions [N, H'], LM head weight [V, H'])
    (`rllava.roles.reference.Reference.hidden`: the reference, a distillation teacher); for each, one more [B, T]
    tensor is returned: the full-vocabulary KL(pi || that model) at each position (`full_kl_from_hidden`)."""
    h, target = trained_hidden(model, batch, padding_free=padding_free, shared_prefix=shared_prefix)
    _, head = _backbone_and_head(model)
    ids = batch.input_ids[:, 1:]
    labels = target.pick(ids) if isinstance(target, ulysses.Local) else ids[target]  # [N] (this rank's, cut)
    lp, ent = logprobs_from_hidden(head, h, labels, temperature=temperature, with_entropy=with_entropy,
                                   entropy_grad=entropy_grad, chunk_size=chunk_size)
    out = _scatter(lp, target), (_scatter(ent, target) if ent is not None else None)
    return (*out, *[_scatter(full_kl_from_hidden(head, h, *ref, temperature=temperature, chunk_size=chunk_size),
                             target) for ref in ref_hidden or []])
