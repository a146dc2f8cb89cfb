import os
import sys
import time

import pytest

from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.reward.function import RewardError, RewardFunction, load_reward_function
from rllava.reward.guard import Hanging


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
    ("def f(response, ground_truth):\n    return 'high'\n", r"sample 7: returned overall='high': expected a finite"),
    ("def f(response, ground_truth):\n    return float('nan')\n", "sample 7: returned overall=nan: expected a finite"),
    ("def f(response, ground_truth):\n    return float('-inf')\n", "returned overall=-inf"),
    ("def f(response, ground_truth):\n    return None\n", "returned overall=None"),
    ("def f(response, ground_truth):\n    return {'overall': 1.0, 'acc': '1'}\n", "returned acc='1'"),
    ("def f(response, ground_truth):\n    return {'acc': 1.0}\n", "without 'overall'"),
    ("def f(response, ground_truth):\n    raise KeyError('oops')\n", r"r.py:f, sample 7: raised KeyError: 'oops'"),
    ("def f(response, ground_truth):\n    import sys; sys.exit(0)\n", r"sample 7: called sys.exit\(0\)"),
    ("def f(response, ground_truth):\n    import os; os._exit(3)\n", r"sample 7: called os._exit\(3\)"),
    ("def f(reward_inputs):\n    return [1.0]\n", r"the batch \(samples 7..8\): returned list of 1: expected a list of 2"),
    ("def f(reward_inputs):\n    return [1.0, float('nan')]\n", r"sample 8: returned overall=nan"),
])
def test_bad_results_are_one_clear_error(tmp_path, body, message):
    """Raised, exited, non-finite or wrong-type results: one line naming the function and the sample; never a
    score (the process is still here: os._exit was caught)."""
    path = _write(tmp_path, body)
    with pytest.raises(RewardError, match=message):
        RewardFunction(f"{path}:f", strict=True).score([_traj("a", "1", index=7), _traj("b", "1", index=8)])


def test_not_strict_gives_the_fallback_score_and_counts_it(tmp_path, caplog):
    """reward.strict=false (the default), reward.fallback_score=-1: each failing sample scores -1, is counted
    and logged with the function and its index."""
    path = _write(tmp_path, "def f(response, ground_truth):\n"
                            "    return {'a': 1.0, 'b': float('nan'), 'c': None}[response]\n")
    fn = RewardFunction(f"{path}:f", fallback_score=-1)
    scores, details = fn.score([_traj("a", "1", 0), _traj("b", "1", 1), _traj("c", "1", 2), _traj("d", "1", 3)])
    assert scores.tolist() == [1.0, -1.0, -1.0, -1.0] and details[1] == {"overall": -1.0} and fn.errors == 3
    assert "r.py:f, sample 3: raised KeyError: 'd': scored -1 (reward.strict=false)" in caplog.text
    assert fn.last_error.endswith("sample 3: raised KeyError: 'd'")


def test_a_sleeping_reward_times_out_in_process(tmp_path):
    path = _write(tmp_path, "import time\n"
                            "def f(response, ground_truth):\n"
                            "    try:\n        time.sleep(30 if response == 'slow' else 0)\n"
                            "    except Exception:\n        pass\n"  # a broad except must not eat the limit
                            "    return 1.0\n")
    fn = RewardFunction(f"{path}:f", timeout=0.2)
    start = time.time()
    assert fn.score([_traj("fast", "1"), _traj("slow", "1", 1)])[0].tolist() == [1.0, 0.0]
    assert time.time() - start < 25 and fn.errors == 1  # not the 30 s the slow call sleeps
    with pytest.raises(RewardError, match=r"sample 1: did not return within reward.timeout=0.2s"):
        RewardFunction(f"{path}:f", timeout=0.2, strict=True).score([_traj("slow", "1", 1)])


@pytest.mark.parametrize("num_cpus", [1, 2])
def test_a_reward_that_hangs_stops_the_run_naming_it(tmp_path, num_cpus):
    """A timeout costs reward.timeout per sample: 3 in a row in one batch (in the order calls end) is a hang,
    which stops the run naming the function, strict or not; a slow sample between fast ones is only its own."""
    calls = tmp_path / "calls"
    path = _write(tmp_path, "import time\n"
                            "def f(response, ground_truth):\n"
                            f"    open({str(calls)!r}, 'a').write(response + '\\n')\n"
                            "    time.sleep(30 if response == 'slow' else 0)\n    return 1.0\n")
    fn = RewardFunction(f"{path}:f", timeout=0.2, num_cpus=num_cpus)
    try:
        mixed = [_traj(r, "1", i) for i, r in enumerate(["slow", "fast", "slow", "fast", "slow"])]
        assert fn.score(mixed)[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0] and fn.errors == 3
        calls.unlink()
        with pytest.raises(Hanging, match=r"reward.reward_function=.*r.py:f: 3 calls in a row did not return "
                                              r"within reward.timeout=0.2s: it hangs"):
            fn.score([_traj("slow", "1", i) for i in range(64)])
        assert len(calls.read_text().split()) <= 3 + num_cpus  # not 64 x 0.2 s: it stopped at the third
    finally:
        fn.close() if hasattr(fn, "close") else None


def test_worker_pool_scores_kills_hung_workers_and_replaces_dead_ones(tmp_path):
    """reward.num_cpus=2: the same scores as in-process; a reward stuck in C code (no signal reaches it) or
    calling os._exit costs its worker, which is replaced, and the run is told which sample did it."""
    path = _write(tmp_path, "import os, re, time\n"
                            "def f(response, ground_truth):\n"
                            "    if response == 'hang':\n        re.match(r'(a+)+$', 'a' * 40 + 'b')\n"
                            "    if response == 'exit':\n        os._exit(5)\n"
                            "    return float(len(response))\n")
    fn = RewardFunction(f"{path}:f", timeout=1.0, num_cpus=2)
    try:
        trajs = [_traj(r, "1", i) for i, r in enumerate(["ab", "hang", "abc", "exit", "abcd", "a"])]
        start = time.time()
        scores, _ = fn.score(trajs)
        assert scores.tolist() == [2.0, 0.0, 3.0, 0.0, 4.0, 1.0] and fn.errors == 2
        assert time.time() - start < 60  # the hung worker never returns: it was killed
        assert fn.score([_traj("xy", "1")])[0].tolist() == [2.0]  # the replaced workers serve on
        with pytest.raises(RewardError, match=r"sample 3: ended its worker process \(exit code 5"):
            RewardFunction(f"{path}:f", num_cpus=2, strict=True).score(trajs[2:4])
    finally:
        workers = list(fn.runner.workers)
        fn.close()
    assert workers and all(not w.proc.is_alive() for w in workers) and not fn.runner.workers


def test_pool_and_in_process_agree(tmp_path):
    path = _write(tmp_path, "def f(reward_input):\n    return {'overall': reward_input['response_length'] + "
                            "len(reward_input['response']), 'kind': float(reward_input['kind'] == 'count')}\n")
    trajs = [_traj("x" * i, "1", i) for i in range(7)]
    pool = RewardFunction(f"{path}:f", num_cpus=3)
    try:
        assert pool.score(trajs)[1] == RewardFunction(f"{path}:f").score(trajs)[1]
    finally:
        pool.close()


RLLAVA_FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rllava_files")


@pytest.mark.parametrize("name, reward_type", [("grounding", "sequential"), ("ovd", "sequential"),
                                               ("r1v", "sequential"), ("math", "batch")])
def test_rllava_reward_files_run_unchanged(name, reward_type):
    """RLLaVA's own reward files (tests/reward/rllava_files, copied as they are; mathruler is a dependency), with
    the reward_type RLLaVA's scripts set and under auto, which reads the same from their signatures."""
    truth = {"grounding": "[100, 100, 500, 500]", "ovd": "<answer>[{'Position': [10, 10, 50, 50], 'Confidence': 1}]</answer>",
             "r1v": "<answer>3</answer>", "math": "3"}[name]
    good = {"grounding": "<|object_ref_start|>cat<|object_ref_end|><|box_start|>(100,100),(500,500)<|box_end|>"
                         "<|im_end|>",
            "ovd": "<think>a cat</think> <answer>[{'Position': [10, 10, 50, 50], 'Confidence': 0.9}]</answer>",
            "r1v": "<think>one two three</think> <answer>3</answer>", "math": "<think>x</think> \\boxed{3}"}[name]
    spec = os.path.join(RLLAVA_FILES, f"{name}.py:compute_score")
    for rt in (reward_type, "auto"):
        fn = RewardFunction(spec, reward_type=rt)
        assert fn.reward_type == reward_type
        scores, details = fn.score([_traj(good, truth, 0), _traj("no idea", truth, 1)])
        assert scores[0] > scores[1] and scores[0] > 0.5 and set(details[0]) >= {"overall", "format"}, details


def test_rllava_files_with_the_other_reward_type_fail_at_start_up():
    with pytest.raises(RewardError, match=r"compute_score\(reward_input\) takes a dict but reward_type=batch passes "
                                          r"a list: set reward.reward_type=sequential"):
        RewardFunction(os.path.join(RLLAVA_FILES, "grounding.py:compute_score"), reward_type="batch")
    with pytest.raises(RewardError, match=r"takes a list but reward_type=sequential passes a dict: set "
                                          r"reward.reward_type=batch"):
        RewardFunction(os.path.join(RLLAVA_FILES, "math.py:compute_score"), reward_type="sequential")


@pytest.mark.parametrize("body, reward_type, kwargs, message", [
    ("def f(response, ground_truth):\n    return [0.0]\n", "batch", {},
     r"reward_type=batch calls f\(reward_inputs: list\[dict\]\) once per batch, but f takes 2 positional "
     r"parameters \(response, ground_truth\): set reward.reward_type=auto"),
    ("def f():\n    return 0.0\n", "auto", {}, "f takes no positional parameter"),
    ("def f(response, ground_truth, *, w=1):\n    return 0.0\n", "auto", {"weight": 2},
     r"reward.reward_function_kwargs: .*takes no parameter 'weight' \(its parameters: ground_truth, response, w\)"),
    ("import sys\nsys.exit(1)\n", "auto", {}, r"importing .* failed: SystemExit: 1"),
    ("import mathruler_not_here\n", "auto", {}, r"No module named 'mathruler_not_here' \(install that package"),
])
def test_signature_problems_fail_when_the_reward_is_built(tmp_path, body, reward_type, kwargs, message):
    path = _write(tmp_path, body)
    with pytest.raises(RewardError, match=message):
        RewardFunction(f"{path}:f", reward_type=reward_type, kwargs=kwargs)


@pytest.mark.parametrize("signature, reward_type, form", [
    ("f(response, ground_truth)", "auto", "named"),
    ("f(response, ground_truth)", "sequential", "named"),  # cannot take one dict: called by name
    ("f(reward_input)", "auto", "sequential"),
    ("f(x: dict)", "auto", "sequential"),
    ("f(x: 'Mapping[str, Any]')", "auto", "sequential"),
    ("f(reward_inputs)", "auto", "batch"),
    ("f(x, w=1)", "auto", "batch"),  # RLLaVA's default
    ("f(x: 'list[dict]')", "auto", "batch"),
    ("f(x)", "sequential", "sequential"),
])
def test_call_forms(tmp_path, signature, reward_type, form):
    path = _write(tmp_path, f"def {signature}:\n    return 0.0\n")
    assert RewardFunction(f"{path}:f", reward_type=reward_type).reward_type == form


COUNTING = "examples/reward_function/counting.py:score_one"


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
    from rllava.reward.shaping import overlong_penalty

    # L_max 10, buffer 4: no penalty up to 6 tokens, then linear to -factor at 10
    assert [overlong_penalty(n, 10, 4, 0.5) for n in (3, 6, 7, 8, 10)] == [0.0, 0.0, -0.125, -0.25, -0.5]


def test_named_functions_get_the_per_sample_fields_they_name(tmp_path):
    path = _write(tmp_path, "def f(response, ground_truth, kind=None, model_image_sizes=(), image_sizes=(), *, w=1.0,"
                            " unknown='default'):\n"
                            "    assert unknown == 'default'\n"
                            "    return w * (kind == 'count') + len(model_image_sizes) + 10 * len(image_sizes)\n")
    t = _traj("3", "3")
    t.model_image_sizes, t.sample.image_sizes = [(28, 28)], [(100, 100), (50, 50)]
    fn = RewardFunction(f"{path}:f", kwargs={"w": 0.5})
    assert fn.reward_type == "named" and fn.score([t])[0].tolist() == [0.5 + 1 + 20]
    # a configured kwarg wins over a record field of the same name
    assert RewardFunction(f"{path}:f", kwargs={"kind": "other"}).score([t])[0].tolist() == [1 + 20]
