"""Bad input, tried as a user would: each case runs the RLVR command line (in this process, `rlvr.main(argv)`)
with one thing wrong and expects ONE clear line `rllava: error: ...` naming what and where (exit status 2, no
traceback), or, where the input is merely unusual (a 1x1 image, numbers as answers), a run that goes through.

The cases are grouped as the issue lists them: config, model, reward spec, data, runtime."""

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys, monkeypatch):
    """`run(*overrides, data=None)` -> (exit status, stderr). A tiny valid run (2 steps) that each case breaks in
    one place; `data` replaces the training records (a list of dicts, or raw text for the jsonl file)."""
    monkeypatch.chdir(REPO)
    data_dir = tmp_path / "data"
    shutil.copytree(counting_dir, data_dir)

    def go(*overrides, data=None):
        data = go.rows if data is None else data
        text = data if isinstance(data, str) else "".join(json.dumps(r) + "\n" for r in data)
        (data_dir / "train.jsonl").write_text(text)
        config = next((o for o in overrides if o.startswith("config=")), "config=examples/tasks/counting/tiny_cpu.yaml")
        overrides = [o for o in overrides if not o.startswith("config=")]
        argv = [config, f"actor.model.model_path={tiny_model_dir}",
                f"data.train_files={data_dir}/train.jsonl", "data.val_files=", "data.max_samples=8",
                "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "trainer.max_steps=1",
                "trainer.val_before_train=false", "trainer.logger=[jsonl]", *keys_for(f"{tmp_path}/run"),
                "data.max_response_length=4", f"reward.reward_function={distinct_reward}", *overrides]
        capsys.readouterr()
        try:
            rlvr.main(argv)
            code = 0
        except SystemExit as e:
            code = e.code
        return code, capsys.readouterr().err

    go.data_dir = data_dir
    with open(counting_dir + "/train.jsonl") as f:
        go.rows = [json.loads(line) for line in f][:8]  # the valid records, before any case rewrites the file
    return go


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("rllava: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


def records(run, n=8):
    return json.loads(json.dumps(run.rows[:n]))  # a fresh copy to break


# ---------------------------------------------------------------- config
@pytest.mark.parametrize("override, expect", [
    ("actor.optim.lrr=1e-6", "actor.optim.lr"),                      # misspelled key: the closest valid one
    ("trainer.no_such_key=1", "trainer.no_such_key"),                # unknown key
    ("data.train_batch_size=many", "data.train_batch_size"),         # wrong type
    ("data.train_batch_size=-4", "data.train_batch_size=-4 must be > 0"),
    ("rollout.n=0", "rollout.n=0 must be > 0"),
    ("actor.optim.lr=inf", "actor.optim.lr=inf must be a finite number"),
    ("rollout.val_override_config.temperature=-1", "rollout.val_override_config.temperature=-1"),
    ("actor.optim.strategy=sgd", "actor.optim.strategy=sgd"),
    ("rollout.max_turns=4", "rollout.max_turns=4 is read only by agent rollouts"),  # never silently single-turn
])
def test_config(run, override, expect):
    code, err = run(override)
    assert code == 2 and expect in one_line(err)


def test_config_yaml_syntax_error_and_missing_file(run, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  prompt_key: [unclosed\n")
    code, err = run(f"config={bad}")
    assert code == 2 and "bad.yaml" in one_line(err)
    code, err = run(f"config={tmp_path}/missing.yaml")
    assert code == 2 and "missing.yaml' not found" in one_line(err)


# ---------------------------------------------------------------- model
def test_model_missing_and_not_a_model(run, tmp_path):
    code, err = run(f"actor.model.model_path={tmp_path}/nowhere")
    assert code == 2 and "actor.model.model_path" in one_line(err)
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "README.txt").write_text("hello")
    code, err = run(f"actor.model.model_path={tmp_path}/notamodel")
    assert code == 2 and "notamodel" in one_line(err)


# ---------------------------------------------------------------- reward spec
@pytest.mark.parametrize("spec, source, expect", [
    ("{d}/r.py", "def compute_score(response, ground_truth):\n    return 1.0\n", "expected 'path/to/file.py:function_name'"),
    ("{d}/absent.py:compute_score", None, "does not exist"),
    ("{d}/r.py:no_such_fn", "def compute_score(response, ground_truth):\n    return 1.0\n", "has no function 'no_such_fn'"),
    ("{d}/r.py:compute_score", "def compute_score(response, ground_truth)\n    return 1.0\n", "SyntaxError"),
])
def test_reward_spec(run, tmp_path, spec, source, expect):
    if source is not None:
        (tmp_path / "r.py").write_text(source)
    code, err = run(f"reward.reward_function={spec.format(d=tmp_path)}")
    assert code == 2 and expect in one_line(err)


# ---------------------------------------------------------------- data
def test_data_missing_empty_and_malformed(run, tmp_path):
    code, err = run(f"data.train_files={tmp_path}/none.jsonl")
    assert code == 2 and "none.jsonl" in one_line(err)
    code, err = run(data="")
    assert code == 2 and "no records" in one_line(err)
    code, err = run(data='{"problem": "<image>How many?", "answer": "1"\n')
    assert code == 2 and "line 1: not valid JSON" in one_line(err)


def test_data_missing_keys(run):
    rows = records(run)
    del rows[3]["answer"]
    code, err = run(data=rows)
    assert code == 2 and "record 3 has no 'answer'" in one_line(err)
    code, err = run("data.prompt_key=question")
    assert code == 2 and "question" in one_line(err)
    code, err = run("data.image_key=image")
    assert code == 2 and "data.image_key='image' matches no field" in one_line(err)


def test_data_images_missing_truncated_and_mismatched(run):
    rows = records(run)
    rows[2]["images"] = ["images/not_there.png"]
    code, err = run(data=rows)
    assert code == 2 and "not_there.png" in one_line(err)
    rows = records(run)
    path = run.data_dir / rows[1]["images"][0]
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # a truncated PNG
    code, err = run(data=rows)
    assert code == 2 and os.path.basename(path) in one_line(err)
    rows = records(run)[2:]
    rows[0]["problem"] = "<image><image>How many shapes?"  # two markers, one image
    code, err = run(data=rows)
    assert code == 2 and "2 <image> markers but the record has 1 image" in one_line(err)


def test_data_every_prompt_over_the_budget(run):
    code, err = run("data.max_prompt_length=4")
    assert code == 2 and "raise data.max_prompt_length" in one_line(err)


@pytest.mark.parametrize("mode", ["1x1", "L", "RGBA", "CMYK", "I;16"])
def test_data_unusual_images_train(run, mode):
    """Unusual but valid images go through: a 1x1 image is resized up to min_pixels; grayscale, transparent,
    CMYK and 16-bit images are converted to RGB."""
    rows = records(run)
    for i, row in enumerate(rows):
        src = Image.open(run.data_dir / row["images"][0])
        img = Image.new("RGB", (1, 1), "red") if mode == "1x1" else src.convert("RGBA" if mode == "RGBA" else "RGB")
        if mode in ("L", "CMYK"):
            img = img.convert(mode)
        elif mode == "I;16":  # 16-bit grayscale: the 8-bit values scaled to the full 16-bit range
            img = Image.fromarray(np.asarray(img.convert("L"), dtype=np.uint16) * 257)
        name = f"images/odd_{mode.replace(';', '')}_{i}.{'jpg' if mode == 'CMYK' else 'png'}"
        img.save(run.data_dir / name)
        row["images"] = [name]
    code, err = run(data=rows)
    assert code == 0, err[-2000:]


def test_data_non_string_answers_reach_the_reward_as_written(run, tmp_path):
    seen = tmp_path / "seen.jsonl"
    (tmp_path / "r.py").write_text(
        "import json\n"
        f"def compute_score(response, ground_truth):\n"
        f"    open({str(seen)!r}, 'a').write(json.dumps(ground_truth) + '\\n')\n"
        "    return 0.0\n")
    rows = records(run, 2)
    rows[0]["answer"], rows[1]["answer"] = 3, "007"
    code, err = run(f"reward.reward_function={tmp_path}/r.py:compute_score", "data.max_samples=2", data=rows)
    assert code == 0, err[-2000:]
    assert {json.loads(line) for line in open(seen)} == {3, "007"}


# ---------------------------------------------------------------- runtime
def test_runtime_unwritable_dir_and_an_earlier_runs_outputs(run, tmp_path):
    (tmp_path / "a_file").write_text("x")
    code, err = run(f"trainer.outputs_dir={tmp_path}/a_file/out")
    assert code == 2 and "is not writable" in one_line(err)
    assert run()[0] == 0
    config = (tmp_path / "run" / "config.yaml").read_text()
    code, err = run("actor.optim.lr=1e-4")  # another run into the same dir: stopped before writing anything,
    # naming the key that makes it another run (before: "already holds another run's outputs", no key named)
    assert code == 2 and "this command changes actor.optim.lr: 0.0003 -> 0.0001: choose another " \
                         "trainer.experiment_name" in one_line(err)
    assert (tmp_path / "run" / "config.yaml").read_text() == config
    assert run("actor.optim.lr=1e-4", "trainer.overwrite=true")[0] == 0


@pytest.mark.parametrize("body, expect", [
    ("raise KeyError('box')", "raised KeyError: 'box'"),
    ("return float('nan')", "expected a finite number"),
    ("import sys; sys.exit(0)", "called sys.exit(0)"),
    ("import time; time.sleep(30)", "did not return within reward.timeout=1"),
])
def test_runtime_reward_failures_name_the_function_and_sample(run, tmp_path, body, expect):
    (tmp_path / "r.py").write_text(f"def compute_score(response, ground_truth):\n    {body}\n")
    code, err = run(f"reward.reward_function={tmp_path}/r.py:compute_score", "reward.timeout=1")
    assert code == 2 and "compute_score" in one_line(err) and expect in one_line(err)
    assert not (tmp_path / "run" / "final").exists()


def test_runtime_a_reward_past_float32_names_the_file_and_the_value(run, tmp_path, caplog):
    """1e39 is a finite float but inf in float32, what the rewards train in (torch.finfo(torch.float32).max =
    3.4028e38): the sample's warning names the reward file and the value returned (before: "reward compute_score,
    sample I: inf is not a finite number", neither)."""
    (tmp_path / "r.py").write_text("calls = []\ndef compute_score(response, ground_truth):\n"
                                   "    calls.append(1)\n    return 1e39 if len(calls) == 1 else 0.0\n")
    code, err = run(f"reward.reward_function={tmp_path}/r.py:compute_score")
    assert code == 0, err[-2000:]
    warned = [r.getMessage() for r in caplog.records if "1e+39" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"reward function {tmp_path}/r.py:compute_score, sample "), warned
    assert warned[0].endswith(": returned overall=1e+39: expected a finite number (float32, |x| <= 3.4e38): scored 0 "
                              "(reward.strict=false)"), warned


@pytest.mark.slow  # ~10 s; fast: test_runtime's exit codes (an interrupt mid-step exits 130, the same line)
def test_runtime_sigint_mid_step_exits_130(tmp_path, tiny_model_dir, counting_dir):
    """Ctrl-C during a step (here: the reward interrupts its own process): exit 130, one line, no final/."""
    import signal
    import subprocess
    import sys

    (tmp_path / "r.py").write_text("import os, signal\n"
                                   "def compute_score(response, ground_truth):\n"
                                   "    os.kill(os.getpid(), signal.SIGINT)\n    return 0.0\n")
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
                          f"actor.model.model_path={tiny_model_dir}", f"data.train_files={counting_dir}/train.jsonl",
                          "data.val_files=", "data.max_samples=8", "data.train_batch_size=2", "actor.ppo_mini_batch_size=2",
                          "rollout.n=2", "trainer.max_steps=2", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
                          *keys_for(out), f"reward.reward_function={tmp_path}/r.py:compute_score"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal (a
    # suite started with `&` from a script hands its children SIGINT ignored, and Python then keeps it ignored)
    assert res.returncode == 130 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "rllava: interrupted" in res.stderr and not (out / "final").exists()


def test_runtime_a_kill_mid_save_then_the_same_command(run, tmp_path):
    """What a SIGKILL during a save leaves (a half-written final/ and checkpoint beside the complete ones) is
    removed by the next start of the same command, which resumes from the last complete checkpoint."""
    assert run("trainer.save_freq=1")[0] == 0
    out = tmp_path / "run"
    (out / ".final.tmp-killed").mkdir()
    (out / ".final.tmp-killed" / "model.safetensors").write_bytes(b"half")
    (out / "checkpoints" / "global_step_2.tmp").mkdir()
    code, err = run("trainer.save_freq=1", "trainer.max_steps=2")
    assert code == 0, err[-2000:]
    assert not (out / ".final.tmp-killed").exists() and not (out / "checkpoints" / "global_step_2.tmp").exists()
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl") if "reward/mean" in line]
    assert steps == [1, 2]  # resumed at step 2: every step once


def test_model_of_the_wrong_family_for_the_images(run, tmp_path):
    """A text-only model (or a VLM given a text-only tokenizer_path) with image records would silently train on
    the text alone: one line naming the key and the processor instead."""
    from rllava.model.tiny import build_tiny

    text_only = build_tiny("qwen2", str(tmp_path / "qwen2"), size="small")
    code, err = run(f"actor.model.model_path={text_only}")
    assert code == 2 and "takes no image input" in one_line(err)
    code, err = run(f"actor.model.tokenizer_path={text_only}")
    assert code == 2 and "data.image_key='images'" in one_line(err)
