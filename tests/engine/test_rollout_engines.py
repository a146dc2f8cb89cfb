"""The vLLM and SGLang rollout engines' glue, on CPU, without either package.

The fakes implement only the calls rllava makes, with the real signatures: vLLM 0.33 (`vllm.LLM`,
`LLM.generate(prompts, sampling_params, *, use_tqdm)`, `SamplingParams.clone()`, `sleep(level)`, `wake_up(tags)`, `reset_prefix_cache()`,
`reset_mm_cache()`, `llm_engine.reset_encoder_cache()`, `llm_engine.engine_core.shutdown()`,
`collective_rpc(method, timeout, args, kwargs)` calling the worker's method of that name,
`Worker.reload_weights(weights_iterator, weights_path, is_checkpoint_format)`,
`vllm.platforms.current_platform.is_sleep_mode_available()`; `RequestOutput.outputs` of
`CompletionOutput(token_ids, logprobs: list[dict[int, Logprob]], finish_reason)`) and SGLang 0.5
(`sglang.Engine(**server_args)`, `generate(input_ids=, sampling_params=, return_logprob=, image_data=, ...)` ->
dicts with `output_ids` and `meta_info`, `update_weights_from_tensor(named_tensors, load_format, flush_cache)`,
`release_memory_occupation(tags)` / `resume_memory_occupation(tags)`). They record what they are given. Scoring
(`SamplingParams(prompt_logprobs=0)` / `logprob_start_len=0, max_new_tokens=0`) returns the prompt's log-probs over
the prompt as the engine processed it: the fakes expand each image placeholder to IMAGE_TOKENS tokens.
"""

import os
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from rllava.config import load_config
from rllava.data.protocol import Sample
from rllava.engine.inference.base import GenerationRequest, SamplingParams, generate_context
from rllava.errors import RllavaError
from rllava.model.lora import apply_lora, merged_state_dict
from rllava.model.processor import get_tokenizer, load_processor
from rllava.train import builders as B
from rllava.train.pipeline import rlvr

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EOS = 7  # the fakes' completions end with the stop id they were given; 7 stands in for it in expectations
IMAGE_TOKENS = 3  # the fakes' processor expands each image placeholder to this many tokens


# ----------------------------------------------------------------------------------------------- fakes


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def _fake_tokens(i: int, j: int, eos: int) -> tuple[list[int], list[float], str]:
    """Request i, sample j: odd requests hit the length limit, even ones stop at EOS."""
    ids = [10 + i, 20 + j] + ([] if i % 2 else [eos])
    return ids, [-0.5 - 0.1 * k - j for k in range(len(ids))], "length" if i % 2 else "stop"


def _expand(ids: list[int], image_pad: int | None) -> list[int]:
    """The fakes' multimodal processor: each image placeholder becomes IMAGE_TOKENS tokens."""
    return [x for t in ids for x in ([t] * IMAGE_TOKENS if t == image_pad else [t])]


def _fake_prompt_logprob(k: int, t: int) -> float:
    """The fakes' log p(token t at position k | tokens before it)."""
    return -0.5 / (k + 1) - t * 1e-6


def fake_vllm(log: list, image_pad: int | None = None):
    mod = types.ModuleType("vllm")

    class SamplingParams:
        def __init__(self, **kwargs):
            self.n = 1  # vLLM's default
            self.__dict__.update(kwargs)

        def clone(self):
            return SamplingParams(**self.__dict__)

    class Worker:  # WorkerWrapperBase forwards attribute access to the GPU worker
        def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
            assert is_checkpoint_format and weights_path is None
            log.append(("reload_weights", [(n, t.clone()) for n, t in weights_iterator]))

    class EngineCore:  # the in-process engine core client (InprocClient)
        def shutdown(self):
            log.append(("shutdown",))

    class LLM:
        def __init__(self, model, **kwargs):
            log.append(("LLM", model, kwargs))
            self.worker = Worker()
            self.llm_engine = types.SimpleNamespace(reset_encoder_cache=lambda: log.append(("reset_encoder_cache",)),
                                                    engine_core=EngineCore())

        def sleep(self, level=1):
            log.append(("sleep", level))

        def wake_up(self, tags=None):
            log.append(("wake_up", tags))

        def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
            log.append(("reset_prefix_cache",))

        def reset_mm_cache(self):
            log.append(("reset_mm_cache",))

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            return [getattr(self.worker, method)(*args, **(kwargs or {}))]

        def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                     tokenization_kwargs=None):
            log.append(("generate", prompts, sampling_params))
            if not isinstance(sampling_params, list):  # one for every prompt, or one each (vLLM takes both)
                sampling_params = [sampling_params] * len(prompts)
            if getattr(sampling_params[0], "prompt_logprobs", None) is not None:  # scoring: RequestOutput.prompt_logprobs
                outs = []
                for p in prompts:
                    ids = _expand(p["prompt_token_ids"], image_pad if p.get("multi_modal_data") else None)
                    outs.append(types.SimpleNamespace(prompt_token_ids=ids, prompt_logprobs=[None] + [
                        {t: Logprob(_fake_prompt_logprob(k, t), 1)} for k, t in enumerate(ids) if k > 0]))
                return outs
            outs = []
            for i, params in enumerate(sampling_params):
                samples = []
                for j in range(params.n):
                    ids, lps, finish = _fake_tokens(i, j, params.stop_token_ids[0])
                    samples.append(types.SimpleNamespace(token_ids=ids, finish_reason=finish,
                                                         logprobs=[{t: Logprob(lp, 1)} for t, lp in zip(ids, lps)]))
                outs.append(types.SimpleNamespace(outputs=samples))
            return outs

    mod.LLM, mod.SamplingParams = LLM, SamplingParams
    mod.platforms = types.SimpleNamespace(current_platform=types.SimpleNamespace(  # a GPU platform
        device_type="cuda", is_sleep_mode_available=lambda: True))
    return mod


def fake_sglang(log: list, image_pad: int | None = None):
    mod = types.ModuleType("sglang")

    class Engine:
        def __init__(self, **kwargs):
            log.append(("Engine", kwargs))
            self.seen = {}  # how many times each prompt came, to number the samples

        def release_memory_occupation(self, tags=None):
            log.append(("release_memory_occupation", tags))

        def resume_memory_occupation(self, tags=None):
            log.append(("resume_memory_occupation", tags))

        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            log.append(("update_weights_from_tensor", [(n, t.clone()) for n, t in named_tensors], flush_cache))

        def generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None, audio_data=None,
                     video_data=None, return_logprob=False, logprob_start_len=None, **kwargs):
            log.append(("generate", input_ids, image_data, video_data, sampling_params, return_logprob,
                        logprob_start_len))
            if sampling_params.get("max_new_tokens") == 0:  # prefill only: the input's log-probs, None first
                assert return_logprob and logprob_start_len == 0
                outs = []
                for i, raw in enumerate(input_ids):
                    ids = _expand(raw, image_pad if image_data and image_data[i] else None)
                    lps = [None] + [_fake_prompt_logprob(k, t) for k, t in enumerate(ids) if k > 0]
                    outs.append({"text": "", "output_ids": [], "meta_info": {
                        "finish_reason": {"type": "length"}, "output_token_logprobs": [],
                        "input_token_logprobs": list(zip(lps, ids, [None] * len(ids)))}})
                return outs
            eos, outs, order = sampling_params["stop_token_ids"][0], [], {}
            for ids in input_ids:
                i = order.setdefault(tuple(ids), len(order))
                j = self.seen.get(i, 0)
                self.seen[i] = j + 1
                out_ids, lps, finish = _fake_tokens(i, j, eos)
                outs.append({"text": "", "output_ids": out_ids, "meta_info": {
                    "finish_reason": {"type": finish}, "output_token_logprobs": list(zip(lps, out_ids, [None] * 9))}})
            self.seen = {}
            return outs

    mod.Engine = Engine
    return mod


class FakeTrainEngine:
    def __init__(self, model, log):
        self.model, self.log = model, log

    @contextmanager
    def rollout_phase(self, shares_model):
        self.log.append(("train_offload", shares_model))
        yield
        self.log.append(("train_back",))


# ----------------------------------------------------------------------------------------------- helpers


def _cfg(model_dir, name, *extra):
    return load_config([f"actor.model.model_path={model_dir}", f"rollout.name={name}", "rollout.seed=7",
                        "data.max_prompt_length=128", "data.max_response_length=10", *extra])


def _sample(i, n_images):
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": f"How many? {i}"}]
    images = [Image.new("RGB", (56, 56), (40 * i, 80 * k, 200)) for k in range(n_images)]
    return Sample(index=i, messages=[{"role": "user", "content": content}], images=images, ground_truth="1")


def _install(monkeypatch, name, log, image_pad):
    """The fake package (and vLLM's `vllm.platforms`) in sys.modules, as `import` finds them."""
    fake = (fake_vllm if name == "vllm" else fake_sglang)(log, image_pad)
    monkeypatch.setitem(sys.modules, name, fake)
    if name == "vllm":
        monkeypatch.setitem(sys.modules, "vllm.platforms", fake.platforms)


def _engine(monkeypatch, name, model_dir, *extra):
    log = []
    processor = load_processor(model_dir)
    image_pad = get_tokenizer(processor).convert_tokens_to_ids("<|image_pad|>")
    _install(monkeypatch, name, log, image_pad)
    rollout = B.build_rollout(_cfg(model_dir, name, *extra), processor, torch.device("cpu"))
    return rollout, processor, log


def _teacher(monkeypatch, name, model_dir, **kwargs):
    """A scoring engine built directly, as a teacher is: from its own checkpoint, never loaded with a policy."""
    log = []
    processor = load_processor(model_dir)
    image_pad = get_tokenizer(processor).convert_tokens_to_ids("<|image_pad|>")
    _install(monkeypatch, name, log, image_pad)
    common = dict(model_path=model_dir, stop_token_ids=[], banned_token_ids=[], tensor_parallel_size=1, seed=0,
                  load_format="auto", bucket_mb=64)
    if name == "vllm":
        from rllava.engine.inference.vllm import VLLMRolloutEngine
        return VLLMRolloutEngine(**common, **kwargs), processor, log
    from rllava.engine.inference.sglang import SGLangRolloutEngine
    return SGLangRolloutEngine(**common, gpu_id=0, **kwargs), processor, log


def _score_requests(processor) -> list[GenerationRequest]:
    """Whole sequences to score: a prompt with two images + a response, a text-only one, and one with no raw ids
    (`prompt_ids` then go as they are). The expanded `prompt_ids` and pixel tensors are the trainer's: not sent."""
    tok = get_tokenizer(processor)
    requests = []
    for i, n_images in ((0, 2), (1, 0)):
        sample = _sample(i, n_images)
        text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
        raw = tok(text, add_special_tokens=False)["input_ids"] + [100 + i, 101 + i, EOS]
        requests.append(GenerationRequest([1] * 999, {"pixel_values": torch.zeros(1)}, raw, sample.images))
    return requests + [GenerationRequest([5, 6, 7, 8])]


def _expected_scores(requests, image_pad) -> list[list[float]]:
    scores = []
    for r in requests:
        ids = _expand(r.raw_prompt_ids if r.raw_prompt_ids is not None else r.prompt_ids,
                      image_pad if r.images else None)
        scores.append([0.0] + [_fake_prompt_logprob(k, t) for k, t in enumerate(ids) if k > 0])
    return scores


def _events(log):
    return [e[:2] if e[0] in ("sleep", "wake_up", "release_memory_occupation", "train_offload") else e[0] for e in log]


# ----------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_missing_package_is_a_one_line_cli_error(monkeypatch, capsys, tmp_path, tiny_model_dir, counting_dir, name):
    monkeypatch.chdir(REPO)
    monkeypatch.setitem(sys.modules, name, None)  # `import name` raises ImportError, installed or not
    with pytest.raises(SystemExit) as exit_:
        rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
                   f"data.train_files={counting_dir}/train.jsonl", "data.max_samples=8", f"rollout.name={name}",
                   f"trainer.outputs_dir={tmp_path}", "trainer.logger=[jsonl]"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (f'rllava: error: rollout.name={name} needs {"vLLM" if name == "vllm" else "SGLang"}, which is not '
                   f'installed: pip install "rllava[{name}]"')


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_generate_sends_unexpanded_prompts_and_maps_outputs(monkeypatch, tiny_model_dir, name):
    rollout, processor, log = _engine(monkeypatch, name, tiny_model_dir)
    tok = get_tokenizer(processor)
    image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
    samples = [_sample(0, 2), _sample(1, 1), _sample(2, 0)]
    trajectories = rollout.generate(samples, SamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=5,
                                                            max_new_tokens=4))
    # prompts: the chat template's tokens with one <|image_pad|> per image, and the PIL images themselves
    if name == "vllm":
        (_, prompts, params), = [e for e in log if e[0] == "generate"]
        ids = [p["prompt_token_ids"] for p in prompts]
        images = [p.get("multi_modal_data", {}).get("image", []) for p in prompts]
        assert (params.n, params.temperature, params.top_p, params.top_k, params.max_tokens, params.logprobs) == \
               (3, 0.7, 0.9, 5, 4, 0)
        assert params.stop_token_ids == [tok.eos_token_id] and params.logit_bias[image_pad] == -100.0
    else:
        (_, ids, image_lists, videos, params, return_logprob, _), = [e for e in log if e[0] == "generate"]
        assert return_logprob and videos is None and len(ids) == 9  # each prompt 3 times, one sample each
        ids, images = ids[::3], image_lists[::3]
        assert (params["temperature"], params["top_p"], params["top_k"], params["max_new_tokens"]) == (0.7, 0.9, 5, 4)
        assert params["stop_token_ids"] == [tok.eos_token_id] and params["logit_bias"][str(image_pad)] == -100.0
    for sample, prompt_ids, imgs in zip(samples, ids, images):
        text = processor.apply_chat_template(sample.messages, add_generation_prompt=True, tokenize=False)
        assert prompt_ids == tok(text, add_special_tokens=False)["input_ids"]
        assert prompt_ids.count(image_pad) == len(sample.images) and list(imgs) == sample.images
    # completions: 3 per prompt, token ids, the sampled tokens' log-probs and finish reasons
    eos = tok.eos_token_id
    assert [t.group_id for t in trajectories] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for t in trajectories:
        i, j = t.group_id, trajectories.index(t) % 3
        ids_, lps, finish = _fake_tokens(i, j, eos)
        assert t.segments[1].token_ids == ids_ and t.segments[1].logprobs == pytest.approx(lps)
        assert t.finish_reason == finish and t.segments[1].trained
    # the training side still gets the expanded prompt and the pixel tensors (what the HF engine gets)
    assert trajectories[0].segments[0].token_ids.count(image_pad) > 2 and "pixel_values" in trajectories[0].mm_inputs


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_greedy_samples_once_and_copies(monkeypatch, tiny_model_dir, name):
    rollout, _, log = _engine(monkeypatch, name, tiny_model_dir)
    trajectories = rollout.generate([_sample(0, 1), _sample(1, 0)], SamplingParams(n=2, temperature=0.0))
    gen = [e for e in log if e[0] == "generate"][0]
    if name == "vllm":
        assert gen[2].n == 1 and gen[2].temperature == 0.0
    else:
        assert len(gen[1]) == 2 and gen[4]["temperature"] == 0.0
    assert [t.group_id for t in trajectories] == [0, 0, 1, 1]
    assert trajectories[0].segments[1].token_ids == trajectories[1].segments[1].token_ids


@pytest.mark.parametrize("name", ["vllm", "sglang"])
@pytest.mark.parametrize("lora", [False, True])
def test_load_pushes_current_weights_and_offload_wraps_rollout(monkeypatch, tiny_model_dir, name, lora):
    extra = ["rollout.bucket_size=1"] if name == "sglang" else []  # several buckets: flush only after the last
    rollout, _, log = _engine(monkeypatch, name, tiny_model_dir, *extra)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        next(iter(model.parameters())).add_(1.0)  # "trained": differs from the checkpoint
    if lora:
        model = apply_lora(model, load_config(["actor.model.use_peft=true", "actor.model.lora_r=4"]).actor.model)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_()  # peft starts B at 0: make the merge visible
    expected = merged_state_dict(model) if lora else model.state_dict()
    del log[:]
    train = FakeTrainEngine(model, log)
    with generate_context(rollout.engine, train):
        rollout.generate([_sample(0, 0)], SamplingParams(n=1))
    if name == "vllm":  # one in-place reload of every weight; then no cache of the old weights is left
        pushed = [w for e in log if e[0] == "reload_weights" for w in e[1]]
        assert _events(log) == [("train_offload", False), ("wake_up", ["weights"]), "reload_weights",
                                ("wake_up", ["kv_cache"]), "reset_prefix_cache", "reset_mm_cache",
                                "reset_encoder_cache", "generate", ("sleep", 1), "train_back"]
    else:
        updates = [e for e in log if e[0] == "update_weights_from_tensor"]
        pushed = [w for e in updates for w in e[1]]
        assert len(updates) > 1 and [e[2] for e in updates] == [False] * (len(updates) - 1) + [True]
        assert _events(log) == [("train_offload", False), "resume_memory_occupation"] + \
               ["update_weights_from_tensor"] * len(updates) + \
               ["generate", ("release_memory_occupation", None), "train_back"]
    assert [n for n, _ in pushed] == list(expected) and not any("lora_" in n for n, _ in pushed)
    for n, t in pushed:
        torch.testing.assert_close(t, expected[n], rtol=0, atol=0, msg=n)
    if lora:  # the merged weights differ from the base layer's
        base = model.state_dict()
        assert any(not torch.equal(t, base[n.replace(".weight", ".base_layer.weight")])
                   for n, t in pushed if n.replace(".weight", ".base_layer.weight") in base)


def test_engines_are_built_from_rollout_keys(monkeypatch, tiny_model_dir):
    _, _, log = _engine(monkeypatch, "vllm", tiny_model_dir, "rollout.tensor_parallel_size=1",
                        "rollout.vllm.gpu_memory_utilization=0.5", "rollout.limit_images=2")
    (_, model, kw), = [e for e in log if e[0] == "LLM"]
    assert model == tiny_model_dir and kw["seed"] == 7 and kw["gpu_memory_utilization"] == 0.5
    assert kw["max_model_len"] == 138 and kw["limit_mm_per_prompt"] == {"image": 2} and kw["load_format"] == "dummy"
    assert kw["enable_sleep_mode"] and kw["distributed_executor_backend"] == "external_launcher"
    assert log[-1] == ("sleep", 1)  # asleep until the first rollout
    _, _, log = _engine(monkeypatch, "sglang", tiny_model_dir, "rollout.sglang.mem_fraction_static=0.4")
    (_, kw), = [e for e in log if e[0] == "Engine"]
    assert kw["model_path"] == tiny_model_dir and kw["random_seed"] == 7 and kw["mem_fraction_static"] == 0.4
    assert kw["enable_memory_saver"] and kw["context_length"] == 138 and kw["tp_size"] == 1
    assert log[-1] == ("release_memory_occupation", None)


def test_logprob_gap_metrics_over_trained_tokens():
    from rllava.data.protocol import Segment, Trajectory, collate
    from rllava.roles.rollout import logprob_gap_metrics

    # row 0: prompt [1, 2], response [3, 4] with rollout log-probs [-1.0, -2.0]; row 1: response [5], [-0.5]
    trajs = [Trajectory(Sample(i, [], [], None), i, [Segment([1, 2], False), Segment(ids, True, logprobs=lps)], {})
             for i, (ids, lps) in enumerate([([3, 4], [-1.0, -2.0]), ([5], [-0.5])])]
    batch = collate(trajs, 0)
    assert logprob_gap_metrics(batch) == {}  # no old log-probs yet
    batch.old_logprobs = torch.tensor([[9.0, 9.0, -1.5, -2.0], [9.0, 9.0, -0.25, 9.0]])  # 9: not trained, ignored
    # gaps |rollout - old| on trained tokens: 0.5, 0.0, 0.25 -> mean 0.25, max 0.5
    assert logprob_gap_metrics(batch) == pytest.approx({"rollout/logprob_gap_mean": 0.25,
                                                        "rollout/logprob_gap_max": 0.5})


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_async_mode_keeps_the_engine_awake(monkeypatch, tiny_model_dir, name):
    """rollout.async_mode (RLLaVA's SGLang engine skips its sleep / wake-up calls): the weights still go in
    before each rollout, and nothing is freed after it or at start-up."""
    rollout, _, log = _engine(monkeypatch, name, tiny_model_dir, "rollout.async_mode=true")
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for _ in range(2):
        with generate_context(rollout.engine, FakeTrainEngine(model, log)):
            rollout.generate([_sample(0, 0)], SamplingParams(n=1))
    events = [e[0] if isinstance(e, tuple) else e for e in _events(log)]
    assert not set(events) & {"sleep", "wake_up", "resume_memory_occupation", "release_memory_occupation"}
    assert ("reload_weights" if name == "vllm" else "update_weights_from_tensor") in events


# ----------------------------------------------------------------------------------------------- scoring (teachers)


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_score_returns_the_engines_prompt_logprobs_and_sleeps_around_them(monkeypatch, tiny_model_dir, name):
    engine, processor, log = _teacher(monkeypatch, name, tiny_model_dir,
                                      **({"keep_weights": True} if name == "sglang" else {}))
    image_pad = get_tokenizer(processor).convert_tokens_to_ids("<|image_pad|>")
    if name == "vllm":  # its own weights; asleep (in host memory) from the start
        (_, _, kw), = [e for e in log if e[0] == "LLM"]
        assert kw["load_format"] == "auto" and log[-1] == ("sleep", 1)
    else:  # its weights survive release / resume only with SGLang's CPU backup
        (_, kw), = [e for e in log if e[0] == "Engine"]
        assert kw["load_format"] == "auto" and kw["enable_weights_cpu_backup"] and kw["enable_memory_saver"]
        assert log[-1] == ("release_memory_occupation", None)
    del log[:]
    requests = _score_requests(processor)
    scores = engine.score(requests)
    # one log-prob per token as the engine processed it (2 images: 2 x (IMAGE_TOKENS - 1) more), 0.0 first
    expected = _expected_scores(requests, image_pad)
    with_images, text_only, no_raw = requests
    assert [len(s) for s in scores] == [len(with_images.raw_prompt_ids) + 2 * (IMAGE_TOKENS - 1),
                                        len(text_only.raw_prompt_ids), len(no_raw.prompt_ids)]
    assert all(s[0] == 0.0 for s in scores) and scores == [pytest.approx(e) for e in expected]
    # unexpanded ids (prompt_ids when there are no raw ones) and the images, nothing else; temperature 1
    sent_ids = [r.raw_prompt_ids for r in requests[:2]] + [requests[2].prompt_ids]
    if name == "vllm":
        (_, prompts, params), = [e for e in log if e[0] == "generate"]
        assert [p["prompt_token_ids"] for p in prompts] == sent_ids
        assert [p.get("multi_modal_data", {}).get("image") for p in prompts] == [requests[0].images, None, None]
        assert (params.max_tokens, params.prompt_logprobs, params.temperature) == (1, 0, 1.0)
        assert not hasattr(params, "logprobs") and not hasattr(params, "logit_bias")
        assert _events(log) == [("wake_up", None), "generate", ("sleep", 1)]  # all tags awake for the call only
    else:
        (_, ids, images, videos, params, return_logprob, start), = [e for e in log if e[0] == "generate"]
        assert ids == sent_ids and images == [requests[0].images, [], []] and videos is None
        assert params == {"max_new_tokens": 0, "temperature": 1.0} and return_logprob and start == 0
        assert _events(log) == ["resume_memory_occupation", "generate", ("release_memory_occupation", None)]


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_score_frees_the_gpu_even_when_the_engine_fails(monkeypatch, tiny_model_dir, name):
    engine, processor, log = _teacher(monkeypatch, name, tiny_model_dir,
                                      **({"keep_weights": True} if name == "sglang" else {}))

    def fail(*args, **kwargs):
        raise RuntimeError("engine failed")

    monkeypatch.setattr(engine.llm if name == "vllm" else engine.engine, "generate", fail)
    with pytest.raises(RuntimeError, match="engine failed"):
        engine.score(_score_requests(processor))
    assert log[-1] == (("sleep", 1) if name == "vllm" else ("release_memory_occupation", None))


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_score_leaves_an_awake_engine_awake(monkeypatch, tiny_model_dir, name):
    engine, processor, log = _teacher(monkeypatch, name, tiny_model_dir, stay_awake=True)
    requests = _score_requests(processor)
    image_pad = get_tokenizer(processor).convert_tokens_to_ids("<|image_pad|>")
    assert engine.score(requests) == [pytest.approx(e) for e in _expected_scores(requests, image_pad)]
    events = [e[0] for e in log]
    assert "generate" in events and not set(events) & {"sleep", "wake_up", "resume_memory_occupation",
                                                       "release_memory_occupation"}


def test_sglang_score_needs_the_weights_kept(monkeypatch, tiny_model_dir):
    """Without the CPU backup a released engine resumes with undefined weights: scoring it is refused."""
    engine, processor, log = _teacher(monkeypatch, "sglang", tiny_model_dir)
    (_, kw), = [e for e in log if e[0] == "Engine"]
    assert "enable_weights_cpu_backup" not in kw
    del log[:]
    with pytest.raises(RllavaError, match="keep_weights=True"):
        engine.score(_score_requests(processor))
    assert log == []


def test_vllm_score_runs_the_tensor_parallel_groups_requests(monkeypatch, tiny_model_dir):
    """Rank 1 of a 2-rank tensor-parallel engine: it runs both ranks' requests (rank 0's first) and keeps its own."""
    import rllava.engine.inference.vllm as vllm_engine

    engine, processor, log = _teacher(monkeypatch, "vllm", tiny_model_dir)
    theirs, mine = _score_requests(processor)[:2]
    monkeypatch.setattr(vllm_engine, "dist", types.SimpleNamespace(
        get_world_size=lambda group: 2, get_rank=lambda group: 1,
        all_gather_object=lambda out, obj, group: out.__setitem__(slice(None), [[theirs], obj])))
    engine.tp_group = object()
    scores = engine.score([mine])
    (_, prompts, _), = [e for e in log if e[0] == "generate"]
    assert [p["prompt_token_ids"] for p in prompts] == [theirs.raw_prompt_ids, mine.raw_prompt_ids]
    image_pad = get_tokenizer(processor).convert_tokens_to_ids("<|image_pad|>")
    assert scores == [pytest.approx(e) for e in _expected_scores([mine], image_pad)]


@pytest.mark.parametrize("name, kwargs", [("vllm", "{max_model_len: 64}"), ("sglang", "{context_length: 64}")])
def test_a_teacher_engine_is_built_from_the_distill_keys_and_scores_the_trained_tokens(monkeypatch, tiny_model_dir,
                                                                                       name, kwargs):
    """algorithm.distill.engine=vllm|sglang: an engine of the teacher's own weights (load_format auto, not the policy
    engine's dummy; SGLang keeps a CPU copy across release), algorithm.distill.engine_kwargs over the rollout's
    keys; the teacher's log-probs of the sampled responses land at their trained positions, zero elsewhere."""
    from rllava.data.protocol import collate

    rollout, processor, log = _engine(monkeypatch, name, tiny_model_dir)
    cfg = _cfg(tiny_model_dir, name, f"algorithm.distill.teacher_path={tiny_model_dir}",
               f"algorithm.distill.engine={name}", "algorithm.distill.loss=k1",
               f"algorithm.distill.engine_kwargs={kwargs}")
    distill = B.build_distillation(cfg, processor, None, torch.device("cpu"))
    made = [e for e in log if e[0] in ("LLM", "Engine")][-1]
    options = made[2] if name == "vllm" else made[1]
    assert (made[1] if name == "vllm" else options["model_path"]) == tiny_model_dir
    assert options["load_format"] == "auto" and (options.get("max_model_len") or options.get("context_length")) == 64
    assert name == "vllm" or options["enable_weights_cpu_backup"] is True
    batch = collate(rollout.generate([_sample(i, 0) for i in range(2)], SamplingParams(n=2, max_new_tokens=10)), 0)
    lp = distill.teachers.compute_logprobs(batch)
    for i in range(len(batch)):
        ids = batch.input_ids[i][batch.attention_mask[i] == 1].tolist()
        want = torch.tensor([0.0] + [_fake_prompt_logprob(k, t) for k, t in enumerate(ids) if k > 0])
        torch.testing.assert_close(lp[i, :len(ids)], want * batch.loss_mask[i, :len(ids)])
    assert (lp[batch.loss_mask == 0] == 0).all() and (lp[batch.loss_mask == 1] < 0).all()
