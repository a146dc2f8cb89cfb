"""data.val_files' named sets (issue 60): each set read with its own keys and scored by its own reward where it gives
them, logged as val/<name>/... with mean@n / pass@n / best@n, its generations marked `set`; the single-file form
logs what it did before; bad set entries are one start-up line."""

import json
import os
import shutil

import pytest

from rllava.commands.compare import compare
from rllava.commands.plot import plot
from rllava.commands.sweep import split_values
from rllava.config import load_config
from rllava.train.evaluate import at_k
from rllava.train.outputs import keys_for
from rllava.train.pipeline import rlvr

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _args(model, data, out, *extra):
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", "data.max_samples=8", "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4", "rollout.n=2", "trainer.max_steps=2", "trainer.val_freq=2",
            "data.max_response_length=6", *keys_for(out), "trainer.logger=[jsonl]", *extra]


def _rows(path):
    return [json.loads(line) for line in open(path)]


@pytest.fixture
def two_sets(tmp_path, counting_dir):
    """The counting val set as it is (the data section's keys), and 4 of its records with renamed fields, their
    own format prompt and their own reward: `count` scored by distinct characters (a score), `odd` by an odd
    response length (an accuracy)."""
    (tmp_path / "distinct.py").write_text("def distinct(response, ground_truth):\n"
                                          "    return {'overall': len(set(response)) / 20}\n")
    (tmp_path / "odd.py").write_text("def odd(response, ground_truth):\n    assert ground_truth.endswith('!')\n"
                                     "    odd = float(len(response) % 2)\n"
                                     "    return {'overall': odd, 'accuracy': odd}\n")
    (tmp_path / "odd.jinja").write_text("{{ content }} (odd set)")
    shutil.copytree(os.path.join(counting_dir, "images"), tmp_path / "pics" / "images")
    with open(tmp_path / "odd.jsonl", "w") as f:
        for r in _rows(os.path.join(counting_dir, "val.jsonl"))[:4]:
            f.write(json.dumps({"question": r["problem"], "count": r["answer"] + "!", "pictures": r["images"]}) + "\n")
    return [f"reward.reward_function={tmp_path}/distinct.py:distinct",
            f"data.val_files={{count: {counting_dir}/val.jsonl, odd: {{path: {tmp_path}/odd.jsonl, "
            f"prompt_key: question, answer_key: count, image_key: pictures, image_dir: {tmp_path}/pics, "
            f"format_prompt: {tmp_path}/odd.jinja, "
            f"reward_function: '{tmp_path}/odd.py:odd'}}}}"]


def test_two_named_sets_log_their_own_metrics(tmp_path, tiny_model_dir, counting_dir, two_sets):
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, *two_sets, "trainer.val_generations_to_log=1000"))
    vals = [r for r in _rows(os.path.join(out, "metrics.jsonl")) if any(k.startswith("val/") for k in r)]
    generations = _rows(os.path.join(out, "val_generations.jsonl"))
    assert [r["step"] for r in vals] == [0, 2] and {g["set"] for g in generations} == {"count", "odd"}
    odd = [g for g in generations if g["set"] == "odd"]
    assert all(g["prompt"].endswith("(odd set)") and g["ground_truth"].endswith("!") for g in odd)  # its own keys
    assert len(odd) == 2 * 4 * 2 and len(generations) - len(odd) == 2 * 8 * 2  # steps x prompts x val n=2
    for row in vals:
        assert {k for k in row if k.startswith("val/")} == {
            "val/count/reward_mean", "val/count/score", "val/count/response_length", "val/count/mean@2",
            "val/count/pass@2", "val/count/best@2", "val/odd/reward_mean", "val/odd/accuracy",
            "val/odd/response_length", "val/odd/mean@2", "val/odd/pass@2", "val/odd/best@2"}
        assert {"val_greedy/count/score", "val_greedy/odd/accuracy"} <= set(row)  # tiny_cpu.yaml: greedy too
        for name, headline in (("count", "score"), ("odd", "accuracy")):
            mine = [g for g in generations if g["set"] == name and g["step"] == row["step"]]
            by_prompt = {}
            for g in mine:
                by_prompt.setdefault(g["index"], []).append(g["reward"])
            best = [max(v) for v in by_prompt.values()]
            assert row[f"val/{name}/{headline}"] == pytest.approx(sum(g["reward"] for g in mine) / len(mine))
            assert row[f"val/{name}/mean@2"] == pytest.approx(row[f"val/{name}/{headline}"])
            assert row[f"val/{name}/best@2"] == pytest.approx(sum(best) / len(best))
            assert row[f"val/{name}/pass@2"] == pytest.approx(sum(b >= 1 for b in best) / len(best))
    assert 0 < vals[-1]["val/odd/accuracy"] < 1 and vals[-1]["val/count/score"] > 0  # each set's own reward
    # compare's table and plot's panels read each set's metrics
    table = compare([out], str(tmp_path / "compare"))["table"]
    assert "val/odd/accuracy" in table and "val/count/best@2" in table
    assert {"val_odd_accuracy.png", "val_count_score.png"} <= {os.path.basename(p) for p in plot(out)}


def test_the_single_file_form_logs_what_it_did(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, f"data.val_files={counting_dir}/val.jsonl",
                    "trainer.val_only=true", "trainer.val_generations_to_log=2",
                    f"reward.reward_function={distinct_reward}"))
    row, = _rows(os.path.join(out, "metrics.jsonl"))
    assert {k for k in row if k.startswith("val")} == {  # tiny_cpu.yaml validates greedily too
        "val/reward_mean", "val/accuracy", "val/response_length", "val/pass@2", "val_greedy/reward_mean",
        "val_greedy/accuracy", "val_greedy/response_length"}
    assert all("set" not in g for g in _rows(os.path.join(out, "val_generations.jsonl")))


def test_mean_pass_best_at_k():
    # prompt 0: 1, 0 / prompt 1: 0, 0 / prompt 2: 0.5, 1 (a partly right and a fully right sample)
    got = at_k([0, 0, 1, 1, 2, 2], [1.0, 0.0, 0.0, 0.0, 0.5, 1.0], 2)
    assert got == pytest.approx({"mean@2": (0.5 + 0 + 0.75) / 3, "pass@2": 2 / 3, "best@2": 2 / 3})
    got = at_k([7, 7, 7, 3, 3, 3], [0.2, 0.4, 0.9, 0.1, 0.1, 0.1], 3)  # scores: no sample fully right
    assert got == pytest.approx({"mean@3": (0.5 + 0.1) / 2, "pass@3": 0.0, "best@3": (0.9 + 0.1) / 2})


def test_named_sets_on_the_command_line_and_in_yaml(tmp_path):
    sets = load_config(["data.val_files={a: x.jsonl, b: {path: y.parquet, prompt_key: q}}"]).data.val_sets()
    assert sets == {"a": {"path": "x.jsonl"}, "b": {"path": "y.parquet", "prompt_key": "q"}}
    assert load_config(["data.val_files.b.path=y.jsonl"]).data.val_sets() == {"b": {"path": "y.jsonl"}}
    (tmp_path / "c.yaml").write_text("data:\n  val_files:\n    a: x.jsonl\n    b: {path: y.jsonl}\n")
    assert load_config([f"config={tmp_path}/c.yaml"]).data.val_sets() == {"a": {"path": "x.jsonl"},
                                                                          "b": {"path": "y.jsonl"}}
    assert load_config([f"config={tmp_path}/c.yaml", "data.val_files=z.jsonl"]).data.val_sets() is None
    assert load_config(["data.val_files="]).data.val_files == ""  # RLLaVA scripts' empty value: no validation
    assert split_values("{a: x.jsonl, b: y.jsonl}") == ["{a: x.jsonl, b: y.jsonl}"]  # a sweep keeps it one value


@pytest.mark.parametrize("sets, message", [
    ("{a: {path: VAL, promt_key: q}}", "data.val_files.a.promt_key is not a set key (valid: path, format_prompt"),
    ("{a/b: VAL}", "data.val_files: the set name 'a/b' names its metrics (val/<name>/accuracy): use one without '/'"),
    ("{a: VAL, b: /no/such.jsonl}", "data.val_files.b.path=/no/such.jsonl: no such file or directory"),
    ("{a: {prompt_key: q}}", "data.val_files.a.path: give the set's records"),
    ("[VAL, VAL]", "data.val_files=["),
    ("{a: {path: VAL, reward_function: /no/such.py:f}}", "data.val_files.a.reward_function='/no/such.py:f': file"),
    ("{a: {path: VAL, format_prompt: /no/such.jinja}}", "data.val_files.a.format_prompt: template file"),
])
def test_bad_set_entries_are_one_line(sets, message, tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                      capsys):
    argv = _args(tiny_model_dir, counting_dir, str(tmp_path / "run"), f"reward.reward_function={distinct_reward}",
                 "data.val_files=" + sets.replace("VAL", f"{counting_dir}/val.jsonl"))
    with pytest.raises(SystemExit) as e:
        rlvr.main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rllava: error:")]
    assert e.value.code == 2 and len(lines) == 1 and message in lines[0], lines
