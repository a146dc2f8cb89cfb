"""The Scoring stage (rllava.reward.scoring): several weighted rewards, the fields a reward can read, and what a
failing reward does (reward.strict / fallback_score / on_error)."""

import os
import re

import pytest
import torch
from PIL import Image

from rllava.algorithms.advantage import grpo
from rllava.config import ConfigError, load_config
from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.data.video import Video
from rllava.reward.function import RewardError, RewardFunction
from rllava.reward.scoring import Scoring
from rllava.train.builders import build_reward

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RED, BLUE = Image.new("RGB", (4, 2), (200, 10, 30)), Image.new("RGB", (6, 6), (0, 0, 250))


def _traj(response, index=0, truth="3", images=(), videos=(), turn_rewards=()):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"How many? #{index}"}]
    sample = Sample(index=index, messages=[{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": content}],
                    images=list(images), videos=list(videos), ground_truth=truth, extra={"kind": "count"},
                    image_sizes=[im.size for im in images])
    return Trajectory(sample=sample, group_id=0, segments=[Segment([1, 2, 3], trained=True)], mm_inputs={},
                      response=response, turn_rewards=list(turn_rewards))


@pytest.fixture
def files(tmp_path):
    """format.py:format ({'overall', 'tag'}), acc.py:accuracy (a float) and a second `format` in other.py."""
    (tmp_path / "format.py").write_text("def format(response, ground_truth):\n"
                                        "    return {'overall': float(response.startswith('<')), 'tag': 0.5}\n")
    (tmp_path / "acc.py").write_text("def accuracy(reward_inputs):\n"
                                     "    return [0.5 if r['ground_truth'] in r['response'] else 0.0"
                                     " for r in reward_inputs]\n")
    (tmp_path / "other.py").write_text("def format(response, ground_truth, scale=1.0):\n    return scale\n")
    return tmp_path


def test_weighted_sum_from_the_command_line_by_hand(files):
    """r = 0.25 * format + 1.0 * accuracy; each source's unweighted score as <name>, its parts as <name>/<part>."""
    cfg = load_config([f"reward.reward_functions=[{{function: {files}/format.py:format, weight: 0.25}}, "
                       f"{{function: {files}/acc.py:accuracy, weight: 1.0}}]"])
    reward = build_reward(cfg)
    scores, details = reward.score([_traj("<a>3</a>"), _traj("3", 1), _traj("<b>", 2)])
    assert scores.tolist() == [0.25 * 1 + 0.5, 0.25 * 0 + 0.5, 0.25 * 1 + 0.0] == [0.75, 0.5, 0.25]
    assert details[0] == {"format": 1.0, "format/tag": 0.5, "accuracy": 0.5, "overall": 0.75}


def test_list_form_from_yaml_with_kwargs_names_and_reward_type(files, tmp_path):
    (tmp_path / "c.yaml").write_text(f"""reward:
  reward_functions:
    - {{function: {files}/format.py:format, weight: 2}}
    - function: {files}/other.py:format
      name: scaled
      weight: -0.5
      kwargs: {{scale: 4.0}}
      reward_type: sequential
""")
    cfg = load_config([f"config={tmp_path}/c.yaml"])
    reward = build_reward(cfg)
    assert [(n, w) for n, w, _ in reward.sources] == [("format", 2.0), ("scaled", -0.5)]
    assert reward.sources[1][2].reward_type == "named"  # two positional parameters: called by name
    scores, details = reward.score([_traj("<x>")])
    assert scores.tolist() == [2 * 1.0 - 0.5 * 4.0] and details[0]["scaled"] == 4.0


def test_single_function_form_is_unchanged(files):
    """reward.reward_function: the function's own details, no per-source names (the seeds' logs)."""
    reward = build_reward(load_config([f"reward.reward_function={files}/format.py:format"]))
    alone = RewardFunction(f"{files}/format.py:format")
    trajs = [_traj("<a>"), _traj("b", 1)]
    expected = [{"overall": 1.0, "tag": 0.5}, {"overall": 0.0, "tag": 0.5}]
    assert reward.score(trajs)[1] == alone.score(trajs)[1] == expected


@pytest.mark.parametrize("args, message", [
    (["reward.reward_function=a.py:f", "reward.reward_functions=[{function: b.py:g}]"],
     "reward.reward_function and reward.reward_functions are both set: keep one"),
    (["reward.reward_functions=[{function: a.py:score}, {function: b.py:score}]"],
     r"reward.reward_functions\[1\]: the name 'score' is taken by reward_functions\[0\]: give one of them a name"),
    (["reward.reward_functions=[{function: a.py:overall}]"], r"reward_functions\[0\].name=overall: choose another"),
    (["reward.reward_functions=[{function: a.py:f, weight: .nan}]"],
     r"reward_functions\[0\].weight=nan must be a finite number"),
    (["reward.reward_functions=[{function: a.py:f, wieght: 1}]"], r"reward_functions\[0\].wieght: unknown key"),
    (["reward.reward_functions=[{weight: 1}]"], r"reward_functions\[0\].function is not set"),
    (["reward.reward_functions=[{function: a.py:f, reward_type: batched}]"],
     r"reward_functions\[0\].reward_type=batched is not one of"),
    (["reward.reward_functions=[{function: a.py:f}]", "reward.reward_function_kwargs.k=1"],
     "reward.reward_function_kwargs is for reward.reward_function: give each entry"),
    (["reward.on_error=raise", "reward.strict=false"], "reward.on_error=raise contradicts reward.strict=false"),
    (["reward.on_error=zero", "reward.strict=true"], "reward.on_error=zero contradicts reward.strict=true"),
    (["reward.on_error=zero", "reward.fallback_score=-1"], "reward.fallback_score=-1.0 is never used with on_error"),
    (["reward.strict=true", "reward.fallback_score=-1"], "reward.fallback_score=-1.0 is never used with strict=true"),
    (["reward.fallback_score=.inf"], "reward.fallback_score=inf must be a finite number"),
])
def test_start_up_errors(args, message):
    with pytest.raises(ConfigError, match=message):
        load_config(args)


def test_readme_weighted_rewards_example_replaces_a_shipped_configs_function(tmp_path):
    """README's `reward.reward_functions=[...]`, as written, over a shipped config that holds reward.reward_function
    (examples/tasks/counting/tiny_cpu.yaml L38): the command line's list replaces the file's function, and a
    command-line function a file's list (issue 62 item 10: it was 'both set'); both on one command line stay an
    error, whose example entry has no stray brace (it read `weight: 1.0}}`)."""
    (example,) = re.findall(r"`(reward\.reward_functions=\[.*?\])`\n", open(os.path.join(REPO, "README.md")).read())
    cfg = load_config([f"config={REPO}/examples/tasks/counting/tiny_cpu.yaml", example])
    assert cfg.reward.reward_function is None
    assert cfg.reward.reward_functions == [{"function": "my_task.py:fmt", "weight": 0.2},
                                           {"function": "my_task.py:acc", "weight": 1.0}]
    (tmp_path / "c.yaml").write_text("reward:\n  reward_functions: [{function: a.py:f, weight: 0.5}]\n")
    cfg = load_config([f"config={tmp_path}/c.yaml", "reward.reward_function=b.py:g"])
    assert (cfg.reward.reward_function, cfg.reward.reward_functions) == ("b.py:g", [])
    with pytest.raises(ConfigError) as e:
        load_config(["reward.reward_function=a.py:f", "reward.reward_functions=[{function: b.py:g}]"])
    assert "({function: a.py:f, weight: 1.0} in reward_functions is the same reward;" in str(e.value)
    assert "}}" not in str(e.value)


def test_error_policy_of_strict_fallback_and_on_error():
    policy = lambda *args: load_config(list(args)).reward.error_policy()  # noqa: E731
    assert policy() == (False, 0.0) and policy("reward.fallback_score=-1") == (False, -1.0)
    assert policy("reward.strict=true") == policy("reward.on_error=raise") == (True, 0.0)
    assert policy("reward.on_error=zero") == policy("reward.strict=false") == (False, 0.0)


def test_kwargs_errors_name_the_entry(files):
    with pytest.raises(RewardError, match=r"reward.reward_functions\[1\].kwargs: .*other.py:format takes no "
                                          r"parameter 'scal'"):
        build_reward(load_config([f"reward.reward_functions=[{{function: {files}/format.py:format}}, "
                                  f"{{function: {files}/other.py:format, name: o, kwargs: {{scal: 2}}}}]"]))


@pytest.mark.parametrize("num_cpus", [1, 2])
def test_prompt_images_videos_and_fields_reach_every_form(tmp_path, num_cpus):
    """named, sequential and batch functions read the prompt, the PIL images (pixels, not just presence), video
    frames, image sizes and record fields; the dicts never carry the images (a worker pool pickles only what a
    function names)."""
    (tmp_path / "r.py").write_text(
        "def named(response, ground_truth, prompt, images, videos, image_sizes, kind):\n"
        "    assert prompt == '<image><image>How many? #0', prompt\n"
        "    return {'overall': images[0].getpixel((0, 0))[0] + images[1].getpixel((5, 5))[2] / 1000,\n"
        "            'frames': len(videos[0]) + videos[0][1].getpixel((0, 0))[1], 'w': image_sizes[1][0],\n"
        "            'kind': float(kind == 'count')}\n"
        "def sequential(reward_input: dict, images=()):\n"
        "    assert 'images' not in reward_input and 'videos' not in reward_input\n"
        "    return {'overall': images[0].getpixel((3, 1))[1],\n"
        "            'prompt': float(reward_input['prompt'].endswith('#0'))}\n"
        "def batch(reward_inputs, images=None):\n"
        "    assert all('images' not in r for r in reward_inputs) and len(images) == len(reward_inputs)\n"
        "    return [{'overall': ims[1].size[0] + r['response_length'], 'kind': float(r['kind'] == 'count'),\n"
        "             'prompt': float(r['prompt'] == '<image><image>How many? #0')}\n"
        "            for r, ims in zip(reward_inputs, images)]\n"
        "def plain(reward_inputs):\n"
        "    assert all('images' not in r and 'prompt' in r for r in reward_inputs)\n"
        "    return [1.0 for _ in reward_inputs]\n")
    video = Video(frames=[Image.new("RGB", (2, 2), (0, g, 0)) for g in (7, 9)], fps=2.0, indices=[0, 1], total_frames=2)
    traj = _traj("<answer>3</answer>", images=[RED, BLUE], videos=[video])
    assert traj.sample.prompt == "<image><image>How many? #0"
    for name, expected in [("named", {"overall": 200.25, "frames": 2 + 9, "w": 6, "kind": 1.0}),
                           ("sequential", {"overall": 10.0, "prompt": 1.0}),
                           ("batch", {"overall": 6 + 3, "kind": 1.0, "prompt": 1.0}), ("plain", {"overall": 1.0})]:
        fn = RewardFunction(f"{tmp_path}/r.py:{name}", num_cpus=num_cpus, strict=True)
        try:
            assert fn.score([traj])[1] == [expected], name
        finally:
            fn.close()


def _scoring(tmp_path, body, strict=False, fallback=0.0, **kw):
    (tmp_path / "f.py").write_text(body)
    fn = RewardFunction(f"{tmp_path}/f.py:f", strict=strict, fallback_score=fallback, **kw)
    return Scoring([("f", 1.0, fn)], named=False, strict=strict, fallback_score=fallback)


def test_strict_stops_and_not_strict_gives_the_fallback_counted(tmp_path):
    body = "def f(response, ground_truth):\n    return {'ok': 1.0, 'nan': float('nan')}[response]\n"
    with pytest.raises(RewardError, match=r"reward function .*f.py:f, sample 1: raised KeyError: 'bad' "
                                          r"\(reward.strict=false scores"):
        _scoring(tmp_path, body, strict=True).score([_traj("ok"), _traj("bad", 1)])
    reward = _scoring(tmp_path, body, fallback=-0.5)
    scores, _ = reward.score([_traj("ok"), _traj("bad", 1), _traj("nan", 2)])
    assert scores.tolist() == [1.0, -0.5, -0.5] and reward.errors == 2


def test_a_reward_failing_on_every_sample_stops_even_when_not_strict(tmp_path):
    reward = _scoring(tmp_path, "def f(response, ground_truth):\n    return 1 / 0\n")
    with pytest.raises(RewardError, match=r"reward f: all 2 samples of this call failed \(last: reward function "
                                          r".*f.py:f, sample 1: raised ZeroDivisionError: division by zero\)"):
        reward.score([_traj("a"), _traj("b", 1)])
    assert reward.score([_traj("a", 5)])[0].tolist() == [0.0]  # one sample alone: a failing sample, not a broken reward
    batch = _scoring(tmp_path, "def f(reward_inputs):\n    raise ValueError('no')\n")
    with pytest.raises(RewardError, match=r"all 3 samples of this call failed \(last: .*the batch \(samples 0..2\): "
                                          "raised ValueError: no"):
        batch.score([_traj("a"), _traj("b", 1), _traj("c", 2)])


def test_timeout_names_the_function_and_the_sample(tmp_path, files):
    (tmp_path / "slow.py").write_text("import time\ndef f(response, ground_truth):\n"
                                      "    time.sleep(5 if response == 'slow' else 0)\n    return 1.0\n")
    cfg = load_config([f"reward.reward_functions=[{{function: {files}/format.py:format}}, "
                       f"{{function: {tmp_path}/slow.py:f}}]", "reward.timeout=0.2", "reward.strict=true"])
    with pytest.raises(RewardError, match=r"reward function .*slow.py:f, sample 4: did not return within "
                                          r"reward.timeout=0.2s"):
        build_reward(cfg).score([_traj("fast", 3), _traj("slow", 4)])


class Judge:
    """A source of another kind (what a reward model plugs in as): fixed scores, one NaN."""

    def __init__(self, scores):
        self.scores, self.errors, self.last_error = scores, 0, None

    def score(self, trajectories, train=False):
        return torch.tensor(self.scores), [{"overall": s, "p": 1.0} for s in self.scores]

    def close(self):
        pass


def test_nan_never_reaches_the_advantage(tmp_path):
    """A non-finite source score, or a weighted sum that overflows float32, is a failure like any other: the
    fallback (counted) or, strict, one line naming the source and the sample."""
    reward = Scoring([("judge", 0.5, Judge([1.0, float("nan"), 3.0, 0.0]))], fallback_score=-1.0)
    scores, details = reward.score([_traj("a", i) for i in range(4)])
    assert scores.tolist() == [0.5, -0.5, 1.5, 0.0] and details[1] == {"judge": -1.0, "judge/p": 1.0, "overall": -0.5}
    assert reward.errors == 1
    adv = grpo(scores, torch.tensor([0, 0, 1, 1]), torch.ones(4, 2))
    assert torch.isfinite(adv).all()
    huge = Scoring([("a", 1e30, Judge([1e10, 1.0])), ("b", 1.0, Judge([0.0, 1.0]))])
    assert huge.score([_traj("a"), _traj("b", 1)])[0].tolist() == [0.0, pytest.approx(1e30)] and huge.errors == 1
    with pytest.raises(RewardError, match=r"reward judge, sample 1: nan is not a finite number"):
        Scoring([("judge", 1.0, Judge([1.0, float("nan")]))], strict=True).score([_traj("a"), _traj("b", 1)])
    with pytest.raises(RewardError, match=r"reward judge: all 2 samples of this call failed"):
        Scoring([("judge", 1.0, Judge([float("inf")] * 2))]).score([_traj("a"), _traj("b", 1)])


def test_tool_reward_and_overlong_penalty_apply_once_to_the_sum():
    reward = Scoring([("a", 0.5, Judge([1.0])), ("b", 2.0, Judge([1.0]))], overlong=(4, 2, 1.0))
    traj = _traj("x", turn_rewards=[0.25, 0.5])  # 3 response tokens: 1 past L_max - L_buf = 2 -> -0.5
    _, (d,) = reward.score([traj], train=True)
    assert (d["tool_reward"], d["overlong_penalty"], d["overall"]) == (0.75, -0.5, 0.5 + 2.0 + 0.75 - 0.5)
    assert reward.score([traj])[1][0]["overall"] == 0.5 + 2.0 + 0.75  # validation: no overlong penalty
