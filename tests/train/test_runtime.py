"""A run owns its outputs dir, exits with a status that means something, reads checkpoints as data and turns
bad disks, bad checkpoints and non-finite training into one line (rllava.train.{outputs,cli,loop,checkpoint})."""

import errno
import json
import os
import pickle
import signal
import subprocess
import sys

import pytest
import torch

from rllava.errors import RllavaError
from rllava.train import checkpoint as C
from rllava.train.cli import run_cli, user_message
from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _args(model, data, out, reward, *extra):
    """8 prompts, 4 per step, 2 samples each, no validation: the cheapest real run."""
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", "data.val_files=null", "data.max_samples=8",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2", "data.max_response_length=8",
            *keys_for(out), "trainer.logger=[jsonl]", f"reward.reward_function={reward}",
            "trainer.val_before_train=false", "trainer.val_freq=-1", "trainer.max_steps=1", *extra]


def _steps(out):
    return [r["step"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]


def _fails(args, capsys, message):
    """The run exits 2 with one `rllava: error:` line holding `message`, and no traceback."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        rlvr.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("rllava: error:")]
    assert len(lines) == 1 and message in lines[0], err
    return lines[0]


def _snapshot(out):
    return {os.path.relpath(os.path.join(d, f), out): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(out) for f in files}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_outputs_dir_belongs_to_one_run(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys):
    """A second run into a finished run's dir stops before writing anything (a start-up failure too: the
    finished run's files stay byte for byte); trainer.overwrite=true deletes them and starts over."""
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward))
    before = _snapshot(out)
    assert "config.yaml" in before and any(k.startswith("final") for k in before)

    _fails(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=2"), capsys,
           f"{out} holds this run, finished at step 1 (its model: {out}/final); to the new length it kept no "
           "checkpoint to go on from (trainer.save_freq keeps them): choose another trainer.experiment_name (or "
           "outputs_dir), or set trainer.overwrite=true to run it again")
    _fails(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.overwrite=true",
                 f"data.train_files={tmp_path}/missing.jsonl"), capsys, "missing.jsonl")
    assert _snapshot(out) == before  # neither start rewrote config.yaml or appended to metrics.jsonl

    os.makedirs(os.path.join(out, ".final.tmp-abc123"))  # what a kill during the final save leaves
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.overwrite=true",
                    "trainer.max_steps=2"))
    assert _steps(out) == [1, 2] and "max_steps: 2" in open(os.path.join(out, "config.yaml")).read()
    assert not [n for n in os.listdir(out) if n.startswith(".final.tmp-")]


def test_resume_continues_the_same_run_only(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys):
    """With checkpoints: the same run resumes (max_steps may grow); another model/data/reward is refused;
    resume=none is refused (it would mix two runs' checkpoints) unless overwrite, and then save_limit counts
    only the new run's checkpoints."""
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.save_freq=1"))
    _fails(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.save_freq=1", "trainer.max_steps=2",
                 "data.seed=7"), capsys, "holds a run this config does not continue (data.seed: 1 -> 7)")
    _fails(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.resume=none", "trainer.max_steps=2"),
           capsys, "to the new length trainer.resume=auto goes on from its checkpoint at step 1")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.save_freq=1", "trainer.max_steps=2"))
    assert _steps(out) == [1, 2]
    root = os.path.join(out, "checkpoints")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.resume=none", "trainer.overwrite=true",
                    "trainer.save_freq=1", "trainer.save_limit=1"))
    assert [s for s, _ in C.list_checkpoints(root)] == [1] and _steps(out) == [1]


def test_the_same_command_on_a_finished_run_says_so_and_exits_0(tmp_path, tiny_model_dir, counting_dir,
                                                                 distinct_reward, capsys):
    """The command of a finished run, run again (`python -m`, the real command line): exit 0 and one line saying it
    finished, at which step, where final/ is and what would go on, nothing rewritten (before: exit 2, "already holds
    another run's outputs ... choose another trainer.experiment_name"); a larger trainer.max_steps goes on from its
    checkpoint; a smaller one is another run, named."""
    out = str(tmp_path / "run")
    args = _args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.save_freq=1")
    rlvr.main(args)
    before = _snapshot(out)
    again = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.rlvr", *args], capture_output=True,
                           text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert again.returncode == 0 and again.stderr.count("rllava: error") == 0, again.stderr[-2000:]
    assert (f"{out} holds this run, finished at step 1 (its model: {out}/final): nothing left to do. "
            "trainer.overwrite=true starts it over; a larger trainer.max_steps or trainer.total_epochs goes on from "
            "its checkpoint at step 1") in again.stdout, again.stdout[-2000:]
    assert _snapshot(out) == before
    rlvr.main([*args, "trainer.max_steps=2"])
    assert _steps(out) == [1, 2]
    _fails(args, capsys, f"{out} holds this run, finished at step 2 (its model: {out}/final); this command changes "
                         "trainer.max_steps: 2 -> 1: choose another trainer.experiment_name")


def test_a_run_failing_before_its_first_step_has_not_begun(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                           capsys):
    """A reward raising at the validation before the first step leaves config.yaml and metrics.jsonl; the run
    with the reward fixed (another reward.reward_function, a key that names the run) starts there, one line
    saying so (before: refused, "holds a run this config does not continue"; docs/troubleshooting.md: nothing is
    written before a run really starts, and what a run that took no step wrote is not a run)."""
    out, broken = str(tmp_path / "run"), tmp_path / "broken.py"
    broken.write_text("def compute_score(response, ground_truth):\n    raise KeyError('box')\n")
    validated = ("trainer.val_before_train=true", f"data.val_files={counting_dir}/val.jsonl")
    _fails(_args(tiny_model_dir, counting_dir, out, f"{broken}:compute_score", *validated), capsys,
           "raised KeyError: 'box'")
    assert {"config.yaml", "metrics.jsonl"} <= set(os.listdir(out))
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, *validated))
    assert f"{out} holds a run stopped before its first step: starting over there" in capsys.readouterr().out
    assert _steps(out) == [1] and distinct_reward.split(":")[0] in open(os.path.join(out, "config.yaml")).read()


def test_unwritable_outputs_dir_is_one_line(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    _fails(_args(tiny_model_dir, counting_dir, str(blocker / "out"), distinct_reward), capsys,
           f"the run's folder (trainer.outputs_dir) {blocker}/out is not writable: Not a directory")


def test_disk_errors_are_one_line_naming_the_path(capsys, monkeypatch):
    """ENOSPC/EACCES while writing (directly or inside torch's checkpoint writer): one line naming the path;
    RLLAVA_DEBUG=1 adds the traceback; a bug keeps its traceback."""
    full = OSError(errno.ENOSPC, "No space left on device", "/data/run/final/model.safetensors")
    assert user_message(full) == ("No space left on device: /data/run/final/model.safetensors (free some space "
                                  "there or point trainer.outputs_dir elsewhere)")
    from torch.distributed.checkpoint.api import CheckpointException

    denied = OSError(errno.EACCES, "Permission denied", "/data/run/checkpoints")
    assert user_message(CheckpointException("write", {0: (denied, [])})).startswith(
        "Permission denied: /data/run/checkpoints")
    assert user_message(ValueError("a bug")) is None

    def train(cfg):
        raise full

    monkeypatch.setattr(sys, "argv", ["rllava"])
    for debug in ("0", "1"):
        monkeypatch.setenv("RLLAVA_DEBUG", debug)
        with pytest.raises(SystemExit) as e:
            run_cli(train, [])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "rllava: error: No space left on device: /data/run" in err
        assert ("Traceback" in err) == (debug == "1")


SIGINT_REWARD = """
import os, signal
calls = 0
def compute_score(response, ground_truth):
    global calls
    calls += 1
    if calls == 9:  # step 2's first sample: as if the user pressed Ctrl-C mid-step
        os.kill(os.getpid(), signal.SIGINT)
    return 0.0
"""


@pytest.mark.parametrize("body, code, message", [
    (SIGINT_REWARD, 130, "rllava: interrupted: no final/ written; no checkpoint was saved: the same command starts"),
    ("import sys\ndef compute_score(response, ground_truth):\n    sys.exit(0)\n", 2,
     "called sys.exit(0) (a reward must return a score, not end the process)"),
    ("import os\ndef compute_score(response, ground_truth):\n    os._exit(0)\n", 2, "called os._exit(0)"),
])
def test_exit_codes_mean_something(tmp_path, tiny_model_dir, counting_dir, body, code, message):
    """Ctrl-C mid-step exits 130 with one line; a reward that exits the process is an error naming it (it used
    to end the run with status 0); neither leaves a final/."""
    reward = tmp_path / "r.py"
    reward.write_text(body)
    out = str(tmp_path / "run")
    res = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.rlvr",
                          *_args(tiny_model_dir, counting_dir, out, f"{reward}:compute_score", "trainer.max_steps=3")],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal (a
    # suite started with `&` from a script hands its children SIGINT ignored, and Python then keeps it ignored)
    assert res.returncode == code, res.stderr[-2000:]
    assert message in res.stderr and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert code == 130 or f"r.py:compute_score, sample " in res.stderr  # names the function and the sample
    assert not os.path.exists(os.path.join(out, "final"))


ONCE_SIGINT_REWARD = """
import os, signal
calls = 0
def compute_score(response, ground_truth):
    global calls
    calls += 1
    marker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "interrupted")
    if calls == 9 and not os.path.exists(marker):  # step 2, the first time only: Ctrl-C mid-step
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGINT)
    return 0.0
"""


# both slow (~18 s each): the fast suite's resume is test_stop_and_resume_equals_straight_run_bitwise and
# test_bad_inputs' kill mid-save, then the same command
@pytest.mark.slow
@pytest.mark.parametrize("save_freq", [-1, 1])
def test_the_same_command_finishes_an_interrupted_run(tmp_path, tiny_model_dir, counting_dir, save_freq):
    """Ctrl-C at step 2 says truly what the same command does next; the same command then finishes the run:
    it resumes from the checkpoint, or, with none saved, starts the run again (one line says so). A run
    killed during its final save (a .final.tmp-* left) is finished by the same command too."""
    reward = tmp_path / "r.py"
    reward.write_text(ONCE_SIGINT_REWARD)
    out = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "rllava.train.pipeline.rlvr",
           *_args(tiny_model_dir, counting_dir, out, f"{reward}:compute_score", "trainer.max_steps=3",
                  f"trainer.save_freq={save_freq}")]

    def run():
        return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    first = run()
    assert first.returncode == 130, first.stderr[-2000:]
    expect = (f"the same command resumes from {out}/checkpoints/global_step_1 (step 1)" if save_freq == 1 else
              "no checkpoint was saved: the same command starts this run again")
    assert f"rllava: interrupted: no final/ written; {expect}" in first.stderr, first.stderr[-2000:]
    second = run()
    assert second.returncode == 0, second.stderr[-2000:]
    again = "holds this run, stopped before its first checkpoint: starting it again"
    assert (again in second.stdout) == (save_freq == -1), second.stdout[-2000:]
    assert _steps(out) == [1, 2, 3] and os.path.isdir(os.path.join(out, "final"))
    if save_freq == -1:  # killed during the final save: the final/ not there, its temporary directory left
        os.rename(os.path.join(out, "final"), os.path.join(out, ".final.tmp-abc123"))
        third = run()
        assert third.returncode == 0 and again in third.stdout, third.stderr[-2000:]
        assert os.path.isdir(os.path.join(out, "final")) and not [n for n in os.listdir(out) if ".tmp-" in n]


def test_sigterm_is_not_a_clean_exit(tmp_path, tiny_model_dir, counting_dir):
    reward = tmp_path / "r.py"
    reward.write_text("import os, signal\ndef compute_score(response, ground_truth):\n"
                      "    os.kill(os.getpid(), signal.SIGTERM)\n    return 0.0\n")
    res = subprocess.run([sys.executable, "-m", "rllava.train.pipeline.rlvr",
                          *_args(tiny_model_dir, counting_dir, str(tmp_path / "run"), f"{reward}:compute_score")],
                         capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == -signal.SIGTERM and not os.path.exists(tmp_path / "run" / "final")


class Evil:
    """Unpickling this would run code (a file appears): a checkpoint must refuse it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_is_data_not_code(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys):
    """rng/rank_0.pt, DCP's .metadata and its pickled values are loaded as data only: a pickled object is
    refused with one line and never runs; an empty trainer_state.json or a truncated shard is one line too."""
    src = str(tmp_path / "src")
    rlvr.main(_args(tiny_model_dir, counting_dir, src, distinct_reward, "trainer.save_freq=1"))
    ckpt = os.path.join(src, "checkpoints", "global_step_1")
    state = torch.load(os.path.join(ckpt, "rng", "rank_0.pt"), weights_only=True)  # tensors and numbers only
    assert state["torch"].dtype == torch.uint8 and state["numpy"]["keys"].shape == (624,)
    marker = tmp_path / "pwned"

    def resume_fails(message, name):
        _fails(_args(tiny_model_dir, counting_dir, str(tmp_path / name), distinct_reward, f"trainer.resume={ckpt}",
                     "trainer.max_steps=2"), capsys, message)
        assert not marker.exists()

    def corrupt(rel, data, message, name):
        path = os.path.join(ckpt, rel)
        original = open(path, "rb").read()
        with open(path, "wb") as f:
            f.write(data)
        resume_fails(message, name)
        with open(path, "wb") as f:
            f.write(original)

    evil = pickle.dumps(Evil(str(marker)))
    with open(tmp_path / "evil.pt", "wb") as f:
        torch.save({"python": Evil(str(marker))}, f)
    corrupt("rng/rank_0.pt", open(tmp_path / "evil.pt", "rb").read(), "rank_0.pt: refused", "a")
    corrupt("actor/.metadata", evil, "actor/.metadata: refused to load: io.open is not part of", "b")
    corrupt(C.STATE_FILE, b"", f"{C.STATE_FILE} is unreadable (JSONDecodeError", "c")
    corrupt(C.STATE_FILE, b"[1]", "lacks everything: not an rllava checkpoint", "d")
    shard = next(n for n in os.listdir(os.path.join(ckpt, "actor")) if n.endswith(".distcp"))
    corrupt(f"actor/{shard}", open(os.path.join(ckpt, "actor", shard), "rb").read()[:100],
            "the checkpoint cannot be read", "e")
    # the intact checkpoint still resumes
    rlvr.main(_args(tiny_model_dir, counting_dir, str(tmp_path / "ok"), distinct_reward, f"trainer.resume={ckpt}",
                    "trainer.max_steps=2"))
    assert _steps(str(tmp_path / "ok")) == [2]


def test_truncated_model_weights_are_one_line(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys):
    import shutil

    broken = str(tmp_path / "model")
    shutil.copytree(tiny_model_dir, broken)
    weights = os.path.join(broken, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    _fails(_args(broken, counting_dir, str(tmp_path / "run"), distinct_reward), capsys,
           f"actor.model.model_path='{broken}': the weights are truncated or corrupt")
    assert not os.path.exists(tmp_path / "run" / "config.yaml")


def test_non_finite_training_stops_naming_the_step(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys):
    """A huge learning rate (an infinite one is a config error): the first update makes the weights non-finite, and the next step says so in
    one line naming it (it used to die deep in sampling); nothing of that step or a final/ is saved."""
    out = str(tmp_path / "run")
    line = _fails(_args(tiny_model_dir, counting_dir, out, distinct_reward, "actor.optim.lr=1e30",
                        "trainer.max_steps=3", "trainer.save_freq=1"), capsys, "step 2: ")
    assert "finite" in line
    assert [s for s, _ in C.list_checkpoints(os.path.join(out, "checkpoints"))] == [1]
    assert not os.path.exists(os.path.join(out, "final"))


def test_check_finite_names_the_keys():
    from types import SimpleNamespace

    from rllava.train.loop import check_finite

    cfg = SimpleNamespace(actor=SimpleNamespace(strategy="single", deepspeed=SimpleNamespace(torch_dtype=None)))
    check_finite({"actor/pg_loss": 0.5, "actor/grad_norm": 1.0, "reward/mean": float("nan")}, 3, cfg)
    with pytest.raises(RllavaError, match=r"step 3: actor/pg_loss=nan, actor/grad_norm=inf is not finite"):
        check_finite({"actor/pg_loss": float("nan"), "actor/grad_norm": float("inf")}, 3, cfg)
