import pytest

from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.reward.function import RewardError, RewardFunction, load_reward_function


def _traj(response, truth, index=0):
    sample = Sample(index=index, messages=[], images=[], ground_truth=truth, extra={"kind": "count"})
    return Trajectory(sample=sample, group_id=0, segments=[Segment([1, 2], trained=True)], mm_inputs={},
                      response=response)


def _write(tmp_path, body, name="r.py"):
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_sequential_float_and_dict(tmp_path):
    path = _write(tmp_path, "def f(response, ground_truth):\n    return float(response == ground_truth)\n"
                            "def g(response, ground_truth):\n    return {'overall': 0.5, 'format': 1.0}\n")
    scores, details = RewardFunction(f"{path}:f").score([_traj("3", "3"), _traj("2", "3")])
    assert scores.tolist() == [1.0, 0.0] and details[1] == {"overall": 0.0}
    scores, details = RewardFunction(f"{path}:g").score([_traj("x", "3")])
    assert details == [{"overall": 0.5, "format": 1.0}]


def test_batch_style_sees_every_field(tmp_path):
    path = _write(tmp_path, "def f(reward_inputs, bonus=0.0):\n"
                            "    return [len(r['response']) + r['response_length'] + bonus + (r['kind'] == 'count')"
                            " for r in reward_inputs]\n")
    fn = RewardFunction(f"{path}:f", kwargs={"bonus": 10.0})
    assert fn.reward_type == "batch"
    scores, _ = fn.score([_traj("abc", "1")])
    assert scores.tolist() == [3 + 2 + 10 + 1]


@pytest.mark.parametrize("spec, message", [
    ("", "reward.reward_function is not set"),
    ("nofile.py", "expected 'path/to/file.py:function_name'"),
    ("missing.py:f", "does not exist"),
])
def test_bad_specs(spec, message):
    with pytest.raises(RewardError, match=message):
        load_reward_function(spec)


def test_bad_files_name_the_spec(tmp_path):
    syntax = _write(tmp_path, "def f(:\n", "syntax.py")
    with pytest.raises(RewardError, match=r"syntax.py:f.*importing .* failed: SyntaxError"):
        load_reward_function(f"{syntax}:f")
    ok = _write(tmp_path, "def other(a, b):\n    return 1\nX = 3\n", "ok.py")
    with pytest.raises(RewardError, match=r"has no function 'f' \(callables there: other\)"):
        load_reward_function(f"{ok}:f")
    with pytest.raises(RewardError, match="not callable"):
        load_reward_function(f"{ok}:X")


@pytest.mark.parametrize("body, message", [
    ("def f(response, ground_truth):\n    return 'high'\n", "returned overall='high'"),
    ("def f(response, ground_truth):\n    return float('nan')\n", "expected a finite number"),
    ("def f(response, ground_truth):\n    return {'acc': 1.0}\n", "without 'overall'"),
    ("def f(response, ground_truth):\n    raise KeyError('oops')\n", "raised on sample 7: KeyError"),
    ("def f(reward_inputs):\n    return [1.0]\n", r"must return a list of 2 results, got list of 1"),
])
def test_bad_results_are_one_clear_error(tmp_path, body, message):
    path = _write(tmp_path, body)
    with pytest.raises(RewardError, match=message):
        RewardFunction(f"{path}:f").score([_traj("a", "1", index=7), _traj("b", "1", index=8)])


def test_sequential_requires_two_parameters(tmp_path):
    path = _write(tmp_path, "def f(reward_inputs):\n    return [0.0]\n")
    with pytest.raises(RewardError, match="reward_type=sequential needs"):
        RewardFunction(f"{path}:f", reward_type="sequential")


COUNTING = "examples/reward_function/counting.py:compute_score"


@pytest.mark.parametrize("response, truth, expected", [
    ("<answer>3</answer>", "3", (1.0, 1.0, 1.0)),
    (" <answer> 3 </answer>\n", 3, (1.0, 1.0, 1.0)),
    ("<answer>4</answer>", "3", (0.0, 1.0, 0.0)),
    ("I think <answer>3</answer>", "3", (0.0, 0.0, 1.0)),
    ("", "3", (0.0, 0.0, 0.0)),
    ("<answer>99999999999999999999</answer>", "3", (0.0, 0.0, 0.0)),
    ("<answer>3</answer>", "three", (0.0, 1.0, 0.0)),
    ("\u00e9\u4e2d<answer>\u0663</answer>" * 1000, "3", (0.0, 0.0, 0.0)),
])
def test_counting_reward(response, truth, expected):
    score = load_reward_function(COUNTING)(response, truth)
    assert (score["overall"], score["format"], score["accuracy"]) == expected


def test_overlong_penalty_by_hand():
    from rllava.reward.function import overlong_penalty

    # L_max 10, buffer 4: no penalty up to 6 tokens, then linear to -factor at 10
    assert [overlong_penalty(n, 10, 4, 0.5) for n in (3, 6, 7, 8, 10)] == [0.0, 0.0, -0.125, -0.25, -0.5]


def test_sequential_functions_get_the_per_sample_fields_they_name(tmp_path):
    path = _write(tmp_path, "def f(response, ground_truth, kind=None, model_image_sizes=(), image_sizes=(), *, w=1.0,"
                            " unknown='default'):\n"
                            "    assert unknown == 'default'\n"
                            "    return w * (kind == 'count') + len(model_image_sizes) + 10 * len(image_sizes)\n")
    t = _traj("3", "3")
    t.model_image_sizes, t.sample.image_sizes = [(28, 28)], [(100, 100), (50, 50)]
    fn = RewardFunction(f"{path}:f", kwargs={"w": 0.5})
    assert fn.reward_type == "sequential" and fn.score([t])[0].tolist() == [0.5 + 1 + 20]
    # a configured kwarg wins over a record field of the same name
    assert RewardFunction(f"{path}:f", kwargs={"kind": "other"}).score([t])[0].tolist() == [1 + 20]
