"""The training forward's memory switches change memory, never the numbers: chunked LM head (with grad),
padding-free packing, and dynamic (token-budget) micro-batching."""

import contextlib
from dataclasses import replace

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, Qwen2Config, Qwen2ForCausalLM

from rllava.algorithms.ppo import build_algorithm
from rllava.config.schema import ActorConfig, AlgorithmConfig
from rllava.data.protocol import Batch, Sample, Segment, Trajectory, collate
from rllava.model.forward import logprobs_from_hidden, token_logprobs
from rllava.model.processor import get_tokenizer, load_processor
from rllava.model.tiny import build_tiny, build_tokenizer
from rllava.model.value import ValueModel
from rllava.roles.actor import Actor
from rllava.roles.batching import MicroBatching, compute_logprobs, token_budget_groups
from rllava.roles.critic import Critic

# (image size or None, prompt words, response tokens): rows of different lengths, one without an image
ROWS = [((56, 56), 1, 7), (None, 4, 3), ((84, 56), 2, 12), ((56, 112), 0, 1), ((56, 56), 6, 9), (None, 1, 5)]
BUDGET = 120  # tokens: the rows above (29-45 tokens) fall into micro-batches of 2, 3 and 1 rows, padded or packed


def _vlm(path):
    return AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)


def _vlm_batch(path, rows=ROWS) -> Batch:
    """Prompts through the model's own processor (chat template, image placeholders, pixel tensors) followed
    by random trained responses."""
    proc = load_processor(path)
    tok = get_tokenizer(proc)
    g = torch.Generator().manual_seed(0)
    trajectories = []
    for i, (size, words, n) in enumerate(rows):
        content = ([{"type": "image"}] if size else []) + [{"type": "text", "text": "How many" + " red" * words}]
        text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
        image = [Image.new("RGB", size, (40 * i, 90, 200))] if size else None
        enc = proc(text=[text], images=image, return_tensors="pt")
        mm = {k: v for k, v in enc.items() if k in ("pixel_values", "image_grid_thw")}
        response = torch.randint(20, len(tok), (n,), generator=g).tolist()
        trajectories.append(Trajectory(sample=Sample(i, [], [], None), group_id=i, mm_inputs=mm, segments=[
            Segment(enc["input_ids"][0].tolist(), trained=False), Segment(response, trained=True)]))
    return collate(trajectories, tok.pad_token_id)


def _text_lm_and_batch():
    """A tiny random Qwen2ForCausalLM (text only, 1-D RoPE) and a batch of rows of different lengths."""
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         attn_implementation="sdpa"))
    g = torch.Generator().manual_seed(1)
    trajectories = [Trajectory(sample=Sample(i, [], [], None), group_id=i, mm_inputs={}, segments=[
        Segment(torch.randint(20, len(tok), (p,), generator=g).tolist(), trained=False),
        Segment(torch.randint(20, len(tok), (r,), generator=g).tolist(), trained=True)])
        for i, (p, r) in enumerate([(5, 9), (12, 2), (3, 1), (8, 14)])]
    return model, collate(trajectories, tok.pad_token_id)


@pytest.fixture(scope="module")
def vlm_batch(tiny_model_dir):
    return _vlm_batch(tiny_model_dir)


def _values_and_grads(model, fn):
    """(outputs of fn(), grads of sum_k <output_k, fixed random weights> w.r.t. every parameter)."""
    model.zero_grad(set_to_none=True)
    outs = [o for o in fn() if o is not None]
    g = torch.Generator().manual_seed(2)
    loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in outs if o.requires_grad)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [o.detach() for o in outs], grads


def _assert_same(a, b, atol=1e-5, rtol=1e-5):
    (va, ga), (vb, gb) = a, b
    for x, y in zip(va, vb, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=rtol)
    assert ga.keys() == gb.keys() and len(ga) > 10
    for name in ga:
        torch.testing.assert_close(ga[name], gb[name], atol=atol, rtol=rtol, msg=name)


# ---------------------------------------------------------------- chunked LM head


@pytest.mark.parametrize("entropy_grad", [True, False])
def test_chunked_logprobs_and_entropy_match_full_logits(tiny_model_dir, vlm_batch, entropy_grad):
    model = _vlm(tiny_model_dir).train()
    n = int(vlm_batch.loss_mask.sum())

    def run(chunk_size):
        return token_logprobs(model, vlm_batch, temperature=0.7, with_entropy=True, entropy_grad=entropy_grad,
                              chunk_size=chunk_size)

    full = _values_and_grads(model, lambda: run(-1))
    for chunk in (5, n - 1, 4 * n):  # several chunks, a short last one, one chunk
        _assert_same(_values_and_grads(model, lambda: run(chunk)), full)
    assert run(5)[1].requires_grad == entropy_grad
    with torch.no_grad():  # the no-grad passes (old log-probs, reference) chunk without recomputation
        torch.testing.assert_close(run(5)[0], full[0][0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("wrapped", [False, True])  # a plain bias-free Linear head / any other head module
def test_chunked_head_recomputes_instead_of_keeping_logits(wrapped):
    """With grad, no [n x V] tensor is kept for the backward (only h, the head's own weight, [N] vectors), and
    the gradients equal those of full logits."""
    V, H, N = 5000, 16, 64
    linear = torch.nn.Linear(H, V, bias=False)
    head = torch.nn.Sequential(linear) if wrapped else linear
    h, labels = torch.randn(N, H, requires_grad=True), torch.randint(0, V, (N,))
    saved = []

    def pack(t):
        saved.append(t)
        return t

    grads = {}
    for chunk_size in (-1, 8):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, ent = logprobs_from_hidden(head, h, labels, with_entropy=True, entropy_grad=True,
                                           chunk_size=chunk_size, temperature=0.7)
        kept = [t for t in saved if t.data_ptr() != linear.weight.data_ptr()]
        biggest = max(t.numel() for t in kept)
        assert biggest == N * V if chunk_size < 0 else biggest <= N * H
        h.grad = linear.weight.grad = None
        (lp * torch.linspace(-1, 1, N)).sum().add(ent.sum()).backward()
        grads[chunk_size] = (h.grad, linear.weight.grad)
    for a, b in zip(grads[-1], grads[8]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- padding-free


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_padding_free_matches_padded_vlm(tmp_path, tiny_model_dir, arch):
    """Packed rows with images (M-RoPE positions per row, attention per row) give the padded log-probs,
    entropy and gradients."""
    path = tiny_model_dir if arch == "qwen2_vl" else build_tiny(arch, str(tmp_path / arch), size="small")
    model, batch = _vlm(path).train(), _vlm_batch(path, ROWS[:4])
    assert len(set(batch.attention_mask.sum(-1).tolist())) == 4 and "pixel_values" in batch.model_inputs()

    def run(padding_free):
        return token_logprobs(model, batch, temperature=0.7, with_entropy=True, entropy_grad=True,
                              padding_free=padding_free)

    _assert_same(_values_and_grads(model, lambda: run(True)), _values_and_grads(model, lambda: run(False)))


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_vl"])
def test_media_encoded_first_on_several_ranks_changes_nothing(tmp_path, tiny_model_dir, monkeypatch, arch):
    """On several ranks a VLM encodes its media before the forward, image then video (the rows' own, or the
    smallest input times 0), so every rank runs the vision tower in one sequence whatever its rows hold: the
    log-probs, entropy and gradients are those of the plain forward, and text-only rows give the tower a zero
    gradient (where the plain forward gives it none)."""
    from rllava import distributed as D

    path = tiny_model_dir if arch == "qwen2_vl" else build_tiny(arch, str(tmp_path / arch), size="small")
    model = _vlm(path).train()
    sequences = []
    for rows in (ROWS[:4], [ROWS[1], ROWS[5]]):  # with images; text only
        batch = _vlm_batch(path, rows)

        def run():
            return token_logprobs(model, batch, temperature=0.7, with_entropy=True, entropy_grad=True,
                                  padding_free=True)

        with monkeypatch.context() as m:
            plain = _values_and_grads(model, run)
            m.setattr(D, "world_size", lambda: 2)
            calls = []
            for name in ("get_image_features", "get_video_features"):
                method = getattr(model.model, name)
                m.setattr(model.model, name, lambda *a, _m=method, _n=name, **kw: calls.append(_n) or _m(*a, **kw))
            first = _values_and_grads(model, run)
        sequences.append(calls)
        (va, ga), (vb, gb) = plain, first
        for x, y in zip(va, vb, strict=True):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
        for name in gb:
            torch.testing.assert_close(gb[name], ga.get(name, torch.zeros_like(gb[name])), atol=1e-5, rtol=1e-5,
                                       msg=name)
        assert any("visual" in n for n in gb)
    assert sequences[0] == sequences[1] and sequences[0][:2] == ["get_image_features", "get_video_features"]


def test_padding_free_matches_padded_text_lm():
    model, batch = _text_lm_and_batch()
    model.train()

    def run(padding_free):
        return token_logprobs(model, batch, with_entropy=True, entropy_grad=True, padding_free=padding_free)

    _assert_same(_values_and_grads(model, lambda: run(True)), _values_and_grads(model, lambda: run(False)))


def test_padding_free_critic_values_match_padded(tiny_model_dir, vlm_batch):
    torch.manual_seed(0)
    critic = ValueModel(_vlm(tiny_model_dir))
    torch.nn.init.normal_(critic.value_head.weight, std=0.1)  # the zero init would make every value 0
    _assert_same(_values_and_grads(critic, lambda: [critic(vlm_batch, padding_free=True)]),
                 _values_and_grads(critic, lambda: [critic(vlm_batch)]))


# ---------------------------------------------------------------- dynamic batching


def test_token_budget_groups():
    lengths = [5, 9, 3, 9, 2, 20]
    # padded: a group costs rows x its longest row. Longest first: 20 | 9, 9 (18) | 5, 3, 2 (15)
    assert token_budget_groups(lengths, 18, packed=False) == [[5], [1, 3], [0, 2, 4]]
    # packed: a group costs the sum of its lengths: 20 | 9 + 9 | 5 + 3 + 2
    assert token_budget_groups(lengths, 19, packed=True) == [[5], [1, 3], [0, 2, 4]]
    assert token_budget_groups(lengths, 29, packed=True) == [[1, 5], [0, 2, 3, 4]]  # 20 + 9 | 9 + 5 + 3 + 2
    assert token_budget_groups(lengths, 4, packed=True) == [[5], [1], [3], [0], [2], [4]]  # too long: alone
    assert token_budget_groups(lengths, 1000, packed=False) == [[0, 1, 2, 3, 4, 5]]
    assert token_budget_groups([], 10, packed=True) == []
    for packed in (True, False):  # every row exactly once, whatever the budget
        for budget in range(1, 60):
            groups = token_budget_groups(lengths, budget, packed=packed)
            assert sorted(i for g in groups for i in g) == list(range(len(lengths)))


def test_micro_batching_split(vlm_batch):
    lengths = vlm_batch.attention_mask.sum(-1).tolist()
    rows = [5, 0, 2, 3]
    assert MicroBatching(3).split(vlm_batch, rows) == [[5, 0, 2], [3]]
    budget = 2 * max(lengths)
    for packed in (False, True):
        groups = MicroBatching(1, budget, packed).split(vlm_batch, rows)
        assert sorted(i for g in groups for i in g) == sorted(rows)
        for g in groups:
            cost = sum(lengths[i] for i in g) if packed else len(g) * max(lengths[i] for i in g)
            assert cost <= budget


class RecordingEngine:
    """A train engine that records each optimizer step's gradients instead of stepping."""

    device = torch.device("cpu")

    def __init__(self, model):
        self.model, self.steps = model, []

    def backward(self, loss):
        loss.backward()

    def update_phase(self):
        return contextlib.nullcontext()

    def optimizer_step(self):
        self.steps.append({n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None})
        self.model.zero_grad(set_to_none=True)
        return 0.0


def _update_grads(model, batch, **batching):
    engine = RecordingEngine(model)
    actor = Actor(model, engine, build_algorithm(AlgorithmConfig(), ActorConfig()), ppo_epochs=1, mini_batch_size=len(batch),
                  log_prob_micro_batch_size=2, loss_agg_mode="seq-mean-token-mean", max_response_length=16,
                  temperature=0.8, use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="low_var_kl",
                  entropy_coeff=0.01, logprob_chunk_size=4, **batching)
    actor.update(batch)
    (grads,) = engine.steps
    return grads, actor


@pytest.mark.parametrize("padding_free", [False, True])
def test_dynamic_batching_gives_the_same_gradients(tiny_model_dir, vlm_batch, padding_free):
    """The loss normalisers are the mini-batch's, so regrouping its rows into micro-batches by a token budget
    leaves the accumulated gradient as it was (PPO clip, entropy bonus and seq-mean aggregation included)."""
    model = _vlm(tiny_model_dir)
    g = torch.Generator().manual_seed(3)
    batch = replace(vlm_batch, advantages=torch.randn(vlm_batch.loss_mask.shape, generator=g) * vlm_batch.loss_mask)
    batch.old_logprobs = compute_logprobs(model, batch, MicroBatching(len(batch)), 0.8) - 0.1 * batch.loss_mask
    fixed, _ = _update_grads(model, batch, micro_batch_size=2, padding_free=padding_free)
    dynamic, actor = _update_grads(model, batch, micro_batch_size=2, padding_free=padding_free, max_token_len=BUDGET)
    sizes = [len(rows) for rows in actor.micro_batching.split(batch, list(range(len(batch))))]
    assert sizes == [2, 3, 1]  # really grouped differently from the fixed split
    assert fixed.keys() == dynamic.keys() and len(fixed) > 10
    for name in fixed:
        torch.testing.assert_close(dynamic[name], fixed[name], rtol=1e-5, atol=1e-6, msg=name)


def test_no_grad_passes_match_with_dynamic_packed_micro_batches(tiny_model_dir, vlm_batch):
    """Old-log-prob / reference / value passes: micro-batches out of row order are gathered back in place."""
    model = _vlm(tiny_model_dir)
    budget = BUDGET
    plain = compute_logprobs(model, vlm_batch, MicroBatching(2), 0.8)
    for batching in (MicroBatching(2, budget, False), MicroBatching(2, budget, True), MicroBatching(4, None, True)):
        torch.testing.assert_close(compute_logprobs(model, vlm_batch, batching, 0.8, chunk_size=3), plain,
                                   atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)
    value = ValueModel(model)
    torch.nn.init.normal_(value.value_head.weight, std=0.1)
    kw = dict(ppo_epochs=1, mini_batch_size=6, micro_batch_size=2, cliprange_value=0.5, loss_avg_mode="token",
              gamma=1.0, lam=1.0)
    padded = Critic(value, None, values_micro_batch_size=2, **kw).compute_values(vlm_batch)
    packed = Critic(value, None, values_micro_batch_size=2, padding_free=True, values_max_token_len=budget,
                    **kw).compute_values(vlm_batch)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    assert padded.abs().sum() > 0 and (padded[vlm_batch.loss_mask == 0] == 0).all()
