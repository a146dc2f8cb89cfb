"""The shared-prefix forward (each group's prompt once, its K responses attending to it) gives the K-copies
forward's log-probs, entropy, values and gradients, encodes each distinct image once, and runs rows it cannot
share (an image after the prompt, a different prompt in the same group) as they are."""

from dataclasses import replace

import pytest
import torch
from PIL import Image

from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.model.forward import token_logprobs
from rllava.model.processor import get_tokenizer, load_processor
from rllava.model.shared_prefix import prefix_layout
from rllava.model.tiny import build_tiny
from rllava.model.value import ValueModel
from rllava.roles.batching import MicroBatching, compute_logprobs

from tests.model.test_forward import _assert_same, _text_lm_and_batch, _update_grads, _values_and_grads, _vlm

# groups: (image size or None, prompt words, response lengths of its rows)
GROUPS = [((56, 56), 1, [7, 3, 12]), (None, 4, [3, 5]), ((84, 56), 2, [1, 9, 4, 6])]


def _grouped_batch(path, groups=GROUPS, observation_image: bool = False):
    """Each group's rows share one prompt (the same processor output, as the rollout gives them) and end in
    random trained responses of different lengths. `observation_image`: the last row of the first group gets
    an image after its first turn, as an agent's observation does."""
    proc = load_processor(path)
    tok = get_tokenizer(proc)
    g = torch.Generator().manual_seed(0)
    trajectories = []
    for gid, (size, words, lengths) in enumerate(groups):
        content = ([{"type": "image"}] if size else []) + [{"type": "text", "text": "How many" + " red" * words}]
        text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
        enc = proc(text=[text], images=[Image.new("RGB", size, (60 * gid, 90, 200))] if size else None,
                   return_tensors="pt")
        mm = {k: v for k, v in enc.items() if k in ("pixel_values", "image_grid_thw")}
        for n in lengths:
            response = torch.randint(20, len(tok), (n,), generator=g).tolist()
            trajectories.append(Trajectory(sample=Sample(gid, [], [], None), group_id=gid, mm_inputs=mm, segments=[
                Segment(enc["input_ids"][0].tolist(), trained=False), Segment(response, trained=True)]))
    if observation_image:
        t = trajectories[len(groups[0][2]) - 1]
        obs = proc(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[Image.new("RGB", (56, 84), "red")],
                   return_tensors="pt")
        t.segments += [Segment(obs["input_ids"][0].tolist(), trained=False), Segment([30, 31, 32], trained=True)]
        t.mm_inputs = {k: torch.cat([t.mm_inputs[k], obs[k]]) for k in t.mm_inputs}
    return collate(trajectories, tok.pad_token_id)


def _run(model, batch, **layout):
    return token_logprobs(model, batch, temperature=0.7, with_entropy=True, entropy_grad=True, chunk_size=5,
                          **layout)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "tinyllava"])
@pytest.mark.parametrize("packed", [False, True])
def test_shared_prefix_matches_k_copies_vlm(tmp_path, tiny_model_dir, arch, packed):
    path = tiny_model_dir if arch == "qwen2_vl" else build_tiny(arch, str(tmp_path / arch), size="small")
    model, batch = _vlm(path).train(), _grouped_batch(path)
    copies = _values_and_grads(model, lambda: _run(model, batch, padding_free=packed))
    shared = _values_and_grads(model, lambda: _run(model, batch, padding_free=packed, shared_prefix=True))
    _assert_same(shared, copies)
    assert shared[0][0].abs().sum() > 0


def test_shared_prefix_matches_k_copies_text_lm():
    model, batch = _text_lm_and_batch()
    batch = replace(batch, group_ids=torch.tensor([0, 1, 1, 2]))  # rows 1 and 2: a group with different prompts
    assert prefix_layout(batch, [], packed=False) is None  # nothing to share: the plain forward runs
    rows = [0, 0, 1, 3, 3, 3]  # groups of rows with the same prompts
    trajectories = [batch.trajectories[i] for i in rows]
    grouped = collate([replace(t, group_id=i) for t, i in zip(trajectories, rows)], pad_token_id=0)
    model.train()
    for packed in (False, True):
        _assert_same(_values_and_grads(model, lambda: _run(model, grouped, padding_free=packed, shared_prefix=True)),
                     _values_and_grads(model, lambda: _run(model, grouped, padding_free=packed)))


def test_layout_attends_to_the_prompt_and_its_own_tokens_only(tiny_model_dir):
    batch = _grouped_batch(tiny_model_dir, GROUPS[:2], observation_image=True)
    layout = prefix_layout(batch, [_image_id(tiny_model_dir)], packed=False)
    # group 0: rows 0, 1 share the prompt; row 2 has an image after it and runs alone; group 1 shares
    assert layout.media_rows == [0, 2, 3] and layout.shared_rows == 2
    p0 = len(batch.trajectories[0].segments[0].token_ids)
    n0, n1 = 7, 3
    allowed = layout.allowed[0]
    assert allowed[:p0, :p0].equal(torch.ones(p0, p0, dtype=torch.bool).tril())  # the prompt: causal
    first, second = p0, p0 + n0  # row 0's and row 1's first response positions
    assert allowed[first, :p0].all() and allowed[first, first] and not allowed[first, first + 1:].any()
    assert allowed[second, :p0].all() and not allowed[second, first:second].any() and allowed[second, second]
    assert (layout.source_row[0, :p0 + n0 + n1] >= 0).all()
    # every row's tokens are found in the layout: its prompt at the one copy, its response in its own slot
    for i in range(3):
        length = int(batch.attention_mask[i].sum())
        assert (layout.index[i, :length] >= 0).all() and (layout.index[i, length:] == -1).all()
    assert layout.index[0, :p0].equal(layout.index[1, :p0])
    flat_row, flat_pos = layout.source_row.flatten(), layout.source_pos.flatten()
    for i in range(len(batch)):
        length = int(batch.attention_mask[i].sum())
        idx = layout.index[i, :length]
        torch.testing.assert_close(batch.input_ids[flat_row[idx], flat_pos[idx]], batch.input_ids[i, :length])


def _image_id(path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).image_token_id


def test_image_observations_run_alone_and_stay_exact(tiny_model_dir):
    model = _vlm(tiny_model_dir).train()
    batch = _grouped_batch(tiny_model_dir, observation_image=True)
    _assert_same(_values_and_grads(model, lambda: _run(model, batch, shared_prefix=True)),
                 _values_and_grads(model, lambda: _run(model, batch)))


def test_each_distinct_image_is_encoded_once(tiny_model_dir):
    model = _vlm(tiny_model_dir)
    batch = _grouped_batch(tiny_model_dir)
    patches = []
    hook = model.model.visual.register_forward_hook(lambda m, args, out: patches.append(len(args[0])))
    try:
        for shared in (False, True):
            with torch.no_grad():
                _run(model, batch, shared_prefix=shared)
    finally:
        hook.remove()
    per_image = [len(t.mm_inputs["pixel_values"]) for t in batch.trajectories if t.mm_inputs]
    assert patches == [sum(per_image), per_image[0] + per_image[-1]]  # 7 images -> the 2 distinct ones


def test_update_and_no_grad_passes_match_with_shared_prefix(tiny_model_dir):
    """An Actor update (PPO clip, entropy bonus) accumulates the same gradient, so the parameters after one
    optimizer step are the K-copies path's; the old-log-prob and value passes give the same numbers."""
    model = _vlm(tiny_model_dir)
    batch = _grouped_batch(tiny_model_dir)
    g = torch.Generator().manual_seed(3)
    batch = replace(batch, advantages=torch.randn(batch.loss_mask.shape, generator=g) * batch.loss_mask)
    batch.old_logprobs = compute_logprobs(model, batch, MicroBatching(len(batch)), 0.8) - 0.1 * batch.loss_mask
    for micro in (len(batch), 4):  # whole groups, and micro-batches that split them
        copies, _ = _update_grads(model, batch, micro_batch_size=micro)
        shared, _ = _update_grads(model, batch, micro_batch_size=micro, shared_prefix=True)
        assert copies.keys() == shared.keys() and len(copies) > 10
        for name in copies:
            torch.testing.assert_close(shared[name], copies[name], rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(compute_logprobs(model, batch, MicroBatching(4, shared_prefix=True), 0.8),
                               compute_logprobs(model, batch, MicroBatching(4), 0.8), atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)
    critic = ValueModel(model)
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)
    _assert_same(_values_and_grads(critic, lambda: [critic(batch, shared_prefix=True)]),
                 _values_and_grads(critic, lambda: [critic(batch)]))
