"""Model-based rewards (rllava.reward.models) on tiny models built offline, and the real all-MiniLM-L6-v2."""

import json
import os

import pytest
import torch
from PIL import Image, ImageDraw

from rllava.config import ConfigError, load_config
from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.errors import RllavaError
from rllava.reward.function import RewardError
from rllava.reward.models import JudgeReward, build_model_reward, model_sources
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CPU = torch.device("cpu")
PROMPT = "How many red cubes?"


def _image(color="red"):
    img = Image.new("RGB", (56, 56), "white")
    ImageDraw.Draw(img).rectangle([8, 8, 40, 40], fill=color)
    return img


def _traj(response, truth="3", index=0, image=None, **extra):
    """A trajectory of a VLM task: one image before the question, as the dataset builds it."""
    image = image or _image()
    sample = Sample(index=index, messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPT}]}],
                    images=[image], ground_truth=truth, extra=extra)
    return Trajectory(sample=sample, group_id=0, segments=[Segment([1], trained=True)], mm_inputs={}, response=response)


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    from rllava.model.tiny import build_tiny

    return build_tiny("qwen2_rm", str(tmp_path_factory.mktemp("rm") / "qwen2_rm"), size="small")


@pytest.fixture(scope="module")
def vision_rm_dir(tmp_path_factory):
    """A tiny vision-language reward model: Qwen3.5 (its sequence-classification head takes pixel_values) with
    the tiny Qwen3-VL processor."""
    from transformers import Qwen3_5Config, Qwen3_5ForSequenceClassification

    from rllava.model.tiny import SIZES, _model_and_processor, build_tokenizer

    tok = build_tokenizer()
    _, _, processor = _model_and_processor("qwen3_vl", tok, SIZES["small"])
    ids = {k: tok.convert_tokens_to_ids(t) for k, t in [("image_token_id", "<|image_pad|>"),
                                                        ("video_token_id", "<|video_pad|>"),
                                                        ("vision_start_token_id", "<|vision_start|>"),
                                                        ("vision_end_token_id", "<|vision_end|>")]}
    text = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, layer_types=["linear_attention", "full_attention"],
                linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16, out_hidden_size=128,
                  num_position_embeddings=256)
    torch.manual_seed(0)
    model = Qwen3_5ForSequenceClassification(Qwen3_5Config(text_config=text, vision_config=vision, num_labels=1, **ids))
    out = str(tmp_path_factory.mktemp("vision_rm") / "rm")
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


# ------------------------------------------------------------------------------------------------ reward model


def test_reward_model_score_is_its_logit_for_prompt_and_response(rm_dir):
    """reward.model.model_path: batched, padded micro-batches score as each conversation run alone by hand; a
    text-only reward model on a VLM sample reads the text (no image placeholder)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    cfg = load_config([f"reward.model.model_path={rm_dir}", f"reward.model.tokenizer_path={rm_dir}",
                       "reward.model_micro_batch_size=2", "reward.model_weight=0.5"])
    [(name, weight, rm)] = model_sources(cfg, CPU)
    assert (name, weight) == ("reward_model", 0.5)
    responses = ["<answer>3</answer>", "I count three red cubes, so <answer>3</answer>", ""]
    scores, details = rm.score([_traj(r, index=i) for i, r in enumerate(responses)])
    tok, model = AutoTokenizer.from_pretrained(rm_dir), AutoModelForSequenceClassification.from_pretrained(rm_dir)
    for r, s, d in zip(responses, scores.tolist(), details):
        text = (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n"
                f"<|im_start|>assistant\n{r}<|im_end|>\n")
        with torch.no_grad():
            logit = model(**tok(text, add_special_tokens=False, return_tensors="pt")).logits[0, 0].item()
        assert s == pytest.approx(logit, abs=1e-5) and d == {"overall": s}
    assert len(set(scores.tolist())) == 3


def test_reward_model_dtype_attention_and_config_keys(rm_dir):
    cfg = load_config([f"reward.model.model_path={rm_dir}", "reward.model.torch_dtype=bfloat16",
                       "reward.model.attn_implementation=eager", "reward.model.override_config.rms_norm_eps=0.001"])
    [(_, _, rm)] = model_sources(cfg, CPU)
    assert next(rm.model.parameters()).dtype == torch.bfloat16 and not rm.model.training
    assert rm.model.config._attn_implementation == "eager" and rm.model.config.rms_norm_eps == 0.001
    assert not any(p.requires_grad for p in rm.model.parameters())
    assert torch.isfinite(rm.score([_traj("<answer>3</answer>")])[0]).all()


def test_vision_reward_model_sees_the_images(vision_rm_dir):
    from rllava.model.processor import load_processor
    from transformers import AutoModelForSequenceClassification

    rm = build_model_reward({"model": vision_rm_dir, "micro_batch_size": 4}, load_config([]), CPU, key="vlm_rm")
    trajs = [_traj("<answer>1</answer>", image=_image(c), index=i) for i, c in enumerate(["red", "blue"])]
    scores, _ = rm.score(trajs)
    assert scores[0] != scores[1]  # same text, different images
    processor, model = load_processor(vision_rm_dir), AutoModelForSequenceClassification.from_pretrained(vision_rm_dir)
    messages = trajs[1].sample.messages + [{"role": "assistant", "content": "<answer>1</answer>"}]
    enc = processor(text=[processor.apply_chat_template(messages, tokenize=False)], images=trajs[1].sample.images,
                    return_tensors="pt")
    with torch.no_grad():
        assert scores[1].item() == pytest.approx(model(**enc).logits[0, 0].item(), abs=1e-4)


def test_reward_model_checkpoints_that_are_not_one_logit_fail_at_start_up(tmp_path, rm_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    two = str(tmp_path / "two_labels")
    AutoModelForSequenceClassification.from_pretrained(rm_dir, num_labels=2, id2label={0: "bad", 1: "good"},
                                                       ignore_mismatched_sizes=True).save_pretrained(two)
    AutoTokenizer.from_pretrained(rm_dir).save_pretrained(two)
    with pytest.raises(RewardError, match=r"reward.model.model_path=.*two_labels has 2 labels: a reward model scores "
                                          r"with one logit \(num_labels=1\)"):
        model_sources(load_config([f"reward.model.model_path={two}"]), CPU)
    from rllava.model.tiny import build_tiny

    lm = build_tiny("qwen2", str(tmp_path / "lm"), size="small")
    with pytest.raises(RewardError, match="is not a reward model: its checkpoint is Qwen2ForCausalLM"):
        model_sources(load_config([f"reward.model.model_path={lm}"]), CPU)
    with pytest.raises(RllavaError, match=r"reward.model.model_path='/nonexistent': no such local directory"):
        model_sources(load_config(["reward.model.model_path=/nonexistent"]), CPU)


@pytest.mark.parametrize("args, message", [
    (["reward.model.model_path=rm", "reward.model.use_peft=true"],
     "reward.model.use_peft=true is not read: the reward model is run, never trained"),
    (["reward.model.model_path=rm", "reward.model.enable_gradient_checkpointing=true"],
     "reward.model.enable_gradient_checkpointing=true is not read"),
    (["reward.model.freeze_vision_tower=true"], "reward.model.freeze_vision_tower=true is not read"),
    (["reward.model.torch_dtype=bfloat16"], "reward.model.torch_dtype=bfloat16 is read only with a reward model: "
                                            "set reward.model.model_path=DIR"),
    (["reward.model_weight=0.5"], "reward.model_weight=0.5 is read only with a reward model"),
    (["reward.model.model_path=rm", "reward.model_micro_batch_size=0"], "reward.model_micro_batch_size=0 must be > 0"),
])
def test_reward_model_keys_for_training_are_start_up_errors(args, message):
    with pytest.raises(ConfigError) as e:
        load_config(args)
    assert message in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------------- judge


def _judge(**kw) -> JudgeReward:
    """A judge without a model, for its template and verdict rules."""
    import jinja2
    from types import SimpleNamespace

    template = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(
        kw.pop("template", "Q: {{ prompt }} A: {{ response }} T: {{ ground_truth }} ({{ difficulty }})"))
    return JudgeReward("judge", None, SimpleNamespace(processor=object()), template, "t.jinja", 8, strict=True, **kw)


def test_judge_template_renders_prompt_response_truth_and_record_fields():
    sample = _judge()._sample(_traj("<answer>3</answer>", index=4, difficulty="easy"))
    assert sample.messages == [{"role": "user", "content": f"Q: <image>{PROMPT} A: <answer>3</answer> T: 3 (easy)"}]
    assert sample.images == [] and sample.index == 4  # a text-only judge reads the text
    with pytest.raises(RewardError, match="judge.template t.jinja: rendering it for record 0 failed: 'difficulty' "
                                          "is undefined"):
        _judge()._sample(_traj("x"))


def test_judge_verdicts():
    number, words = _judge(), _judge(verdict=r"(?i)\b(yes|no)\b", labels={"YES": 1, "no": 0})
    assert number.verdict("Score: 7.5 out of 10") == {"overall": 7.5}
    assert number.verdict("no digits").startswith("no verdict: '([-+]?\\\\d+(?:\\\\.\\\\d+)?)' does not match")
    assert words.verdict("Verdict: Yes, correct.") == {"overall": 1.0}
    assert words.verdict("no.") == {"overall": 0.0}
    assert _judge(verdict="Score: (\\w+)").verdict("Score: high") == ("verdict 'high' is not a number (map words to "
                                                                     "numbers with labels)")
    assert _judge(verdict="(\\w+)", labels={"yes": 1}).verdict("maybe") == "verdict 'maybe' is none of the labels ['yes']"


@pytest.mark.parametrize("entry, message", [
    ({"type": "judge", "model": "m"}, "j.template is not set"),
    ({"type": "judge", "model": "m", "template": "missing.jinja"}, "j.template: template file 'missing.jinja' does not"),
    ({"type": "judge", "model": "m", "template": "T", "verdict": "no group"}, "j.verdict='no group' has no (group)"),
    ({"type": "judge", "model": "m", "template": "T", "verdict": "(["}, "j.verdict='([' is not a regular expression"),
    ({"type": "judge", "model": "m", "template": "T", "labels": {"yes": "1"}}, "j.labels must map words to numbers"),
    ({"type": "judge", "model": "m", "template": "T", "verdict_function": "nope.py:f"},
     "j.verdict_function='nope.py:f': file 'nope.py' does not exist"),
    ({"type": "judge", "model": "m", "template": "T", "max_tokens": 0}, "j.max_tokens=0 must be a positive integer"),
    ({"type": "judge", "model": "m", "template": "T", "micro_batch_size": 2}, "j.micro_batch_size is not read by "
                                                                               "judge rewards"),
    ({"type": "critic", "model": "m"}, "j.type=critic: choose classifier (a reward model), judge or embedding"),
    ({"type": "embedding", "model": "bert"}, "j.model=bert: the embedding reward runs all-MiniLM-L6-v2"),
    ({"type": "classifier"}, "j.model is not set"),
])
def test_bad_entries_name_the_key_before_loading_a_model(entry, message, tmp_path, monkeypatch):
    """(model "m" does not exist: each problem is found before the model would load)"""
    (tmp_path / "t.jinja").write_text("{{ response }}")
    monkeypatch.chdir(tmp_path)
    entry = {**entry, **({"template": "t.jinja"} if entry.get("template") == "T" else {})}
    with pytest.raises(RewardError) as e:
        build_model_reward(entry, load_config([]), CPU, key="j")
    assert message in str(e.value)


def test_judge_generates_through_the_rollout_engine(tmp_path, tiny_model_dir):
    """A tiny Qwen2-VL judge on the HF engine: the verdict function receives exactly the greedy answer to the
    rendered template with the sample's image (checked against `generate` run by hand), and scores it."""
    from transformers import AutoModelForImageTextToText

    from rllava.engine.inference.hf import HFRolloutEngine
    from rllava.model.processor import get_tokenizer, load_processor
    from rllava.engine.inference.base import VISION_PLACEHOLDERS

    (tmp_path / "judge.jinja").write_text("Question: {{ prompt }}\nTruth: {{ ground_truth }} ({{ level }})\n"
                                          "Answer: {{ response }}\nIs the answer right?")
    seen = tmp_path / "seen.jsonl"
    (tmp_path / "verdict.py").write_text(f"import json\ndef verdict(text):\n    open({str(seen)!r}, 'a').write("
                                         "json.dumps(text) + '\\n')\n"
                                         "    return {'overall': len(text) / 10, 'length': float(len(text))}\n")
    entry = {"type": "judge", "model": tiny_model_dir, "template": str(tmp_path / "judge.jinja"), "max_tokens": 6,
             "verdict_function": f"{tmp_path / 'verdict.py'}:verdict", "weight": 0.3}
    judge = build_model_reward(entry, load_config(["rollout.name=hf"]), CPU, key="reward.judge")
    assert isinstance(judge.rollout.engine, HFRolloutEngine) and judge.vision
    trajs = [_traj("<answer>3</answer>", index=5, level="easy"), _traj("two", index=6, image=_image("blue"), level="hard")]
    scores, details = judge.score(trajs)
    processor = load_processor(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    tok = get_tokenizer(processor)
    banned = [tok.get_vocab()[t] for t in VISION_PLACEHOLDERS if t in tok.get_vocab()]
    expected = []
    for t, level in zip(trajs, ["easy", "hard"]):
        prompt = f"Question: <image>{PROMPT}\nTruth: 3 ({level})\nAnswer: {t.response}\nIs the answer right?"
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        enc = processor(text=[processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)],
                        images=t.sample.images, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, do_sample=False, max_new_tokens=6, eos_token_id=[tok.eos_token_id],
                                 pad_token_id=tok.pad_token_id, suppress_tokens=banned)
        expected.append(tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True))
    assert [json.loads(line) for line in open(seen)] == expected
    assert [d["length"] for d in details] == [float(len(x)) for x in expected]
    assert scores.tolist() == pytest.approx([len(x) / 10 for x in expected])
    assert not judge.model.training


def test_judge_unparsable_verdicts_follow_strict(tmp_path, tiny_model_dir):
    (tmp_path / "judge.jinja").write_text("{{ response }}")
    entry = {"type": "judge", "model": tiny_model_dir, "template": str(tmp_path / "judge.jinja"), "max_tokens": 4,
             "verdict": r"<score>(\d+)</score>"}
    raising = build_model_reward(entry, load_config(["reward.strict=true"]), CPU, key="reward.judge")
    with pytest.raises(RewardError, match=r"reward.judge, sample 9: no verdict: '<score>\(\\\\d\+\)</score>' does not "
                                          r"match; the judge wrote '.*' \(reward.strict=false"):
        raising.score([_traj("x", index=9)])
    zero = build_model_reward(entry, load_config(["reward.fallback_score=-1"]), CPU, key="reward.judge")
    scores, _ = zero.score([_traj("x", index=9), _traj("y", index=10)])
    assert scores.tolist() == [-1.0, -1.0] and zero.errors == 2 and "sample 10" in zero.last_error


def test_judge_without_a_verdict_on_every_sample_stops_the_run_even_with_on_error_zero():
    """docs/reward_models.md ("The judge") as the behaviour is (issue 62 item 9): with `reward.on_error=zero` a
    judge's answer without a verdict scores that sample 0 and counts in reward/errors; a judge without a verdict on
    every sample of a call stops the run, as any reward failing on every sample does (rllava.reward.scoring: its
    template or verdict does not fit what it writes, and all-zero rewards give every advantage 0)."""
    import jinja2
    from types import SimpleNamespace

    from rllava.reward.scoring import Scoring

    def judge(answers):
        engine = SimpleNamespace(load=lambda model: None, offload=lambda: None)
        rollout = SimpleNamespace(processor=object(), engine=engine,
                                  generate=lambda samples, sampling: [SimpleNamespace(response=a) for a in answers])
        strict, fallback = load_config(["reward.on_error=zero"]).reward.error_policy()
        source = JudgeReward("reward.judge", None, rollout, jinja2.Template("{{ response }}"), "t.jinja", 8,
                             verdict=r"Verdict: (\w+)", labels={"yes": 1, "no": 0}, strict=strict,
                             fallback_score=fallback)
        return Scoring([("judge", 1.0, source)], strict=strict, fallback_score=fallback)

    some = judge(["Verdict: yes", "I think it is right"])
    scores, _ = some.score([_traj("3", index=0), _traj("4", index=1)])
    assert scores.tolist() == [1.0, 0.0] and some.errors == 1
    with pytest.raises(RewardError, match=r"^reward judge: all 2 samples of this call failed \(last: reward.judge, "
                                          r"sample 1: no verdict: 'Verdict: \(\\\\w\+\)' does not match; the judge "
                                          r"wrote 'Right.'\)"):
        judge(["Looks fine", "Right."]).score([_traj("3", index=0), _traj("4", index=1)])


# --------------------------------------------------------------------------------------------------- embedding


def test_embedding_similarity_with_the_real_minilm():
    emb = build_model_reward({"type": "embedding"}, load_config([]), CPU, key="reward.embedding")
    scores, details = emb.score([_traj("There are three red cubes.", "There are three red cubes."),
                                 _traj("Three red cubes are in the picture.", "There are three red cubes."),
                                 _traj("The stock market closed lower on Friday.", "There are three red cubes.")])
    same, paraphrase, unrelated = scores.tolist()
    assert same == pytest.approx(1.0, abs=1e-5) and details[0] == {"overall": same}
    assert unrelated < 0.3 < paraphrase < same
    ref = build_model_reward({"type": "embedding", "reference": "{{ solution }}"}, load_config([]), CPU, key="e")
    assert ref.score([_traj("a b c", solution="a b c")])[0].item() == pytest.approx(1.0, abs=1e-5)


# ---------------------------------------------------------------------------------------------------- training


def test_rl_steps_with_only_a_reward_model_and_with_both(tmp_path, tiny_model_dir, counting_dir, rm_dir, monkeypatch):
    """reward.model.model_path alone trains; with reward.reward_function too the reward is the function's score +
    reward.model_weight x the reward model's logit (means add up the same way)."""
    from rllava.train.pipeline import rlvr

    monkeypatch.chdir(REPO)

    def run(name, *extra):
        out = str(tmp_path / name)
        rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
                   f"data.train_files={counting_dir}/train.jsonl", f"data.val_files={counting_dir}/val.jsonl",
                   "data.max_samples=8", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4",
                   "trainer.max_steps=1", "trainer.val_before_train=false", "trainer.val_freq=-1",
                   *keys_for(out), "trainer.logger=[jsonl]", f"reward.model.model_path={rm_dir}", *extra])
        return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if "reward/mean" in line][0]

    alone = run("alone", "reward.reward_function=null")
    assert alone["reward/mean"] == pytest.approx(alone["reward/reward_model_mean"]) and alone["reward/std"] > 0
    both = run("both", "reward.model_weight=0.5")
    assert both["reward/mean"] == pytest.approx(both["reward/compute_score_mean"] + 0.5 * both["reward/reward_model_mean"],
                                                abs=1e-5)
    assert "reward/accuracy_mean" in both and "reward/compute_score/accuracy_mean" in both  # the function by its name
    # the real MiniLM in the loop: an embedding entry of the weighted list scores a training step on its own
    sim = run("sim", "reward.reward_function=null", "reward.model.model_path=null",
              "reward.reward_functions=[{type: embedding, weight: 2.0, name: sim}]")
    assert sim["reward/mean"] == pytest.approx(2.0 * sim["reward/sim_mean"], abs=1e-5) and -1 <= sim["reward/sim_mean"] <= 1


def test_model_entries_in_the_weighted_list(tmp_path, rm_dir):
    """reward.reward_functions mixes functions and models: r = 1.0 x rule + 0.5 x cosine + 0.25 x RM logit, each
    logged under its name; a model entry's unknown key is an error naming the entry."""
    from rllava.train.builders import add_reward_models, build_reward

    (tmp_path / "rule.py").write_text("def rule(response, ground_truth):\n    return float(response == ground_truth)\n")
    entries = (f"reward.reward_functions=[{{function: {tmp_path}/rule.py:rule, weight: 1.0}}, "
               f"{{type: embedding, weight: 0.5, name: sim}}, {{type: classifier, model: {rm_dir}, weight: 0.25}}]")
    cfg = load_config([entries])
    reward = add_reward_models(build_reward(cfg), cfg, CPU)
    trajs = [_traj("3", "3"), _traj("a cat on a mat", "3", index=1)]
    scores, details = reward.score(trajs)
    for s, d in zip(scores.tolist(), details):
        assert set(d) == {"rule", "sim", "classifier", "overall"}
        assert s == pytest.approx(d["rule"] + 0.5 * d["sim"] + 0.25 * d["classifier"], abs=1e-5)
    assert details[0]["sim"] == pytest.approx(1.0, abs=1e-4) and details[1]["sim"] < 0.5
    reward.close()
    bad = load_config(["reward.reward_functions=[{type: embedding, weight: 0.5, template: x.jinja}]"])
    with pytest.raises(RewardError, match=r"reward.reward_functions\[0\].template is not read by embedding rewards"):
        add_reward_models(build_reward(bad), bad, CPU)


def test_a_reward_model_scores_what_an_agent_program_returned_none_for(rm_dir, tmp_path):
    """rollout.agent.program + reward.model.model_path: the episodes the program returned None for are scored by the
    reward model, those it scored keep the program's reward (before: the model added to every episode, and a program
    returning None with no reward file was an error although the model could score it)."""
    from rllava.agent.tools import AgentState
    from rllava.train import builders as B

    program = tmp_path / "agent.py"
    program.write_text("def run(client, sample):\n    return None\n")
    cfg = load_config(["reward.reward_function=null", f"rollout.agent.program={program}:run",
                       f"reward.model.model_path={rm_dir}", f"reward.model.tokenizer_path={rm_dir}"])
    reward = B.add_reward_models(B.build_reward(cfg), cfg, CPU)
    [(_, _, rm)] = model_sources(cfg, CPU)
    trajectories = [_traj("<answer>3</answer>", index=0), _traj("<answer>4</answer>", index=1)]
    for t, returned in zip(trajectories, [None, 0.25]):
        t.agent = AgentState(t.sample)
        t.agent.memory["program"] = {"reward": returned, "error": None, "metrics": {}}
    try:
        scores, _ = reward.score(trajectories)
    finally:
        reward.close()
    alone, _ = rm.score(trajectories[:1])
    assert scores.tolist() == pytest.approx([alone.item(), 0.25], abs=1e-5)
