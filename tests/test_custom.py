"""examples/custom/ as docs/custom_task.md uses it: the config's own command builds the model and data, a user
copies the three files, changes the answer format in the prompt and the reward, and runs 2 RL steps through the
command line; and examples/custom/python_api.py runs end to end. So the tutorial cannot rot."""

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys

from rllava.config import as_config
from rllava.train.pipeline import rlvr

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUSTOM = os.path.join(REPO, "examples", "custom")


def _module(path):
    spec = importlib.util.spec_from_file_location(f"reward_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _edit(path, old, new):
    """A user's edit: replace `old` (which must be there: a changed template fails here) by `new`."""
    text = open(path).read()
    assert old in text, f"{path} no longer holds {old!r}: update docs/custom_task.md and this test"
    open(path, "w").write(text.replace(old, new))


def _build_command(config_text):
    """The config's one-line command that builds the model and the data: argv of each `python -m module ...`."""
    line = next(line for line in config_text.splitlines() if "python -m rllava.model.tiny" in line)
    commands = [shlex.split(part) for part in line.lstrip("# ").split("&&")]
    assert [c[:3] for c in commands] == [["python", "-m", "rllava.model.tiny"],
                                         ["python", "-m", "rllava.data.synthetic"]]
    return commands


def test_the_template_reward_scores_the_template_prompts_format():
    reward = _module(os.path.join(CUSTOM, "reward.py"))
    assert reward.compute_score("<answer>3</answer>", "3") == {"overall": 1.0, "format": 1.0, "accuracy": 1.0}
    assert reward.compute_score("I think <answer> 4 </answer>", 3) == {"overall": 0.1, "format": 1.0, "accuracy": 0.0}
    for garbage in ("", "3", "<answer>3", "</answer><answer>"):
        assert reward.compute_score(garbage, "3")["accuracy"] == 0.0
    assert "<answer>" in open(os.path.join(CUSTOM, "prompt.jinja")).read()


def test_a_user_changes_the_answer_format_and_runs_two_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config_text = open(os.path.join(CUSTOM, "config.yaml")).read()
    for argv in _build_command(config_text):  # the model and data, as the config's header builds them
        module = __import__(argv[2], fromlist=["main"])
        module.main(argv[3:])
    # the three files, copied and edited: the answer now goes on a line `ANSWER: x`
    task = tmp_path / "my_task"
    task.mkdir()
    for name in ("config.yaml", "reward.py", "prompt.jinja"):
        shutil.copy(os.path.join(CUSTOM, name), task / name)
    _edit(task / "prompt.jinja", "inside <answer> </answer> tags, e.g. <answer>3</answer>.",
          "on a last line of its own as ANSWER: <number>, e.g. ANSWER: 3")
    _edit(task / "reward.py", 'ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)',
          'ANSWER = re.compile(r"^ANSWER:(.*)$", re.MULTILINE)')
    _edit(task / "config.yaml", "./examples/custom/", "./my_task/")

    rlvr.main(["config=my_task/config.yaml", "trainer.max_steps=2"])

    out = tmp_path / "outputs" / "custom" / "run"
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]
    assert {"reward/format_mean", "reward/accuracy_mean"} <= set(rows[1]) and "val/format" in rows[0]
    prompts = [json.loads(line)["prompt"] for line in open(out / "samples.jsonl")]
    assert prompts and all("ANSWER: <number>" in p and "<answer>" not in p for p in prompts)
    generations = [json.loads(line) for line in open(out / "val_generations.jsonl")]
    assert {"response", "prompt", "ground_truth"} <= set(generations[0])
    assert {"overall", "format", "accuracy"} <= set(generations[0]["reward_parts"])
    cfg = as_config(str(out / "config.yaml"))
    assert cfg.reward.reward_function == "./my_task/reward.py:compute_score"
    assert cfg.data.format_prompt == "./my_task/prompt.jinja"
    assert os.path.isfile(out / "final" / "model.safetensors")
    reward = _module(str(task / "reward.py"))  # the edited reward reads the new format, not the old one
    assert reward.compute_score("Five shapes.\nANSWER: 5", "5")["overall"] == 1.0
    assert reward.compute_score("<answer>5</answer>", "5")["format"] == 0.0


def test_the_python_api_example_runs(tmp_path):
    out = tmp_path / "api"
    env = {**os.environ, "PYTHONPATH": REPO, "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, os.path.join(CUSTOM, "python_api.py"), "--out", str(out), "--steps", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"trained model: {out / 'custom' / 'run' / 'final'}" in done.stdout
    rows = [json.loads(line) for line in open(out / "custom" / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    cfg = as_config(str(out / "custom" / "run" / "config.yaml"))
    assert cfg.algorithm.adv_estimator == "centered" and cfg.actor.model.model_path == str(out / "model")
    assert os.path.isfile(out / "custom" / "run" / "final" / "model.safetensors")
