"""Checkpoints (rllava.train.checkpoint): exact resume, crash safety, any world size, HF export, bad input."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText, AutoTokenizer

from rllava.commands import export as X
from rllava.data.sampler import EpochSampler
from rllava.train import checkpoint as C
from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _args(model, data, out, reward, *extra):
    """16 prompts, 4 per step (an epoch is 4 steps), 2 samples each: small enough for several runs per test."""
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=16",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.val_batch_size=16",
            *keys_for(out), "trainer.logger=[jsonl]", f"reward.reward_function={reward}",
            "trainer.val_before_train=false", "trainer.val_freq=-1", *extra]


def _step_rows(out):
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]


def _steps(out):
    return [r["step"] for r in _step_rows(out)]


def _weights(path):
    return load_file(os.path.join(path, "model.safetensors"))


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_stop_and_resume_equals_straight_run_bitwise(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                     monkeypatch):
    """6 steps straight == 3 steps, stop, resume, 3 steps: the same prompts in the same order (3 epochs, each
    reshuffled; the stop falls mid-epoch) and bitwise the same weights. Linear LR decay, an adaptive KL-in-reward
    coefficient, a second mini-batch (old log-probs) and validation between steps all have to come back."""
    drawn = []
    next_batch = EpochSampler.next_batch
    monkeypatch.setattr(EpochSampler, "next_batch", lambda self: drawn.append(next_batch(self)) or drawn[-1])
    common = ("trainer.max_steps=6", "trainer.save_freq=3", "trainer.val_freq=3", "algorithm.use_kl_in_reward=true",
              "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=10", "data.max_samples=8")  # 2 steps/epoch
    straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
    rlvr.main(_args(tiny_model_dir, counting_dir, straight, distinct_reward, *common))
    straight_prompts, drawn[:] = list(drawn), []

    save = C.save_checkpoint

    def save_then_stop(run, step):  # as if the job hit its time limit right after the checkpoint of step 3
        path = save(run, step)
        if step == 3:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(C, "save_checkpoint", save_then_stop)
    with pytest.raises(SystemExit) as stop:  # Ctrl-C: exit status 130
        rlvr.main(_args(tiny_model_dir, counting_dir, stopped, distinct_reward, *common))
    assert stop.value.code == 130
    monkeypatch.setattr(C, "save_checkpoint", save)
    assert not os.path.exists(os.path.join(stopped, "final")) and _steps(stopped) == [1, 2, 3]
    rlvr.main(_args(tiny_model_dir, counting_dir, stopped, distinct_reward, *common))  # trainer.resume=auto

    assert len(straight_prompts) == 6 and drawn == straight_prompts
    epochs = [straight_prompts[i] + straight_prompts[i + 1] for i in (0, 2, 4)]  # resumed in the middle of the 2nd
    assert all(sorted(e) == list(range(8)) for e in epochs) and len({tuple(e) for e in epochs}) == 3  # reshuffled
    assert _steps(stopped) == [1, 2, 3, 4, 5, 6]
    a, b = _weights(os.path.join(straight, "final")), _weights(os.path.join(stopped, "final"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    before = _weights(tiny_model_dir)
    assert any(not torch.equal(a[k], before[k]) for k in a)  # it did train
    for x, y in zip(_step_rows(straight), _step_rows(stopped)):
        assert x["actor/reward_kl_coef"] == y["actor/reward_kl_coef"] and x["actor/lr"] == y["actor/lr"]
    elapsed = [r["time/elapsed_s"] for r in map(json.loads, open(os.path.join(stopped, "metrics.jsonl")))]
    assert len(elapsed) > 6 and elapsed == sorted(elapsed)  # the wall-clock goes on from step 3's after the resume


def test_resume_between_reference_resets_is_exact(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                 monkeypatch):
    """algorithm.ref_reset_freq=2, stopped after step 3 (the reference is then the policy of step 2, not the
    saved policy of step 3 nor the starting one) and resumed: every step's KL (loss and reward) and the final
    weights equal the straight run's bitwise, because the checkpoint keeps the reference's weights."""
    common = ("trainer.max_steps=5", "trainer.save_freq=3", "algorithm.use_kl_in_reward=true",
              "algorithm.use_kl_loss=true", "actor.kl_loss_coef=0.1", "algorithm.ref_reset_freq=2",
              "actor.ppo_mini_batch_size=4", "actor.optim.lr=3e-3", "data.max_samples=8")
    straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
    rlvr.main(_args(tiny_model_dir, counting_dir, straight, distinct_reward, *common))
    save = C.save_checkpoint

    def save_then_stop(run, step):
        path = save(run, step)
        if step == 3:
            raise KeyboardInterrupt
        return path

    monkeypatch.setattr(C, "save_checkpoint", save_then_stop)
    with pytest.raises(SystemExit):
        rlvr.main(_args(tiny_model_dir, counting_dir, stopped, distinct_reward, *common))
    monkeypatch.setattr(C, "save_checkpoint", save)
    assert os.path.isfile(os.path.join(stopped, "checkpoints", "global_step_3", "ref", ".metadata"))
    rlvr.main(_args(tiny_model_dir, counting_dir, stopped, distinct_reward, *common))  # resumes at step 3
    a, b = _step_rows(straight), _step_rows(stopped)
    assert [r["ref/last_reset_step"] for r in b] == [0, 2, 2, 4, 4]
    for key in ("actor/kl_loss", "actor/reward_kl"):
        assert [r[key] for r in a] == [r[key] for r in b], key
    assert a[3]["actor/kl_loss"] > 0  # step 4 runs against the policy of step 2, not the one it starts from
    wa, wb = _weights(os.path.join(straight, "final")), _weights(os.path.join(stopped, "final"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_difficulty_pools_resume_bitwise_and_another_sampler_is_one_line(tmp_path, tiny_model_dir, counting_dir,
                                                                        monkeypatch, straight_and_resumed, capsys):
    """data.sampler=difficulty_pools, stopped after step 3 of 6 and resumed: the same batches (its pass rates,
    streaks, set-aside schedule and draw count come back from trainer_state.json), the same sampler state at the end,
    bitwise the same weights. Resuming its checkpoint under data.sampler=epoch is one line naming both."""
    from rllava.algorithms.curriculum import DifficultyPools

    drawn = []
    next_batch = DifficultyPools.next_batch
    monkeypatch.setattr(DifficultyPools, "next_batch", lambda self: drawn.append(next_batch(self)) or drawn[-1])
    reward = tmp_path / "parity.py"  # right or wrong by the response's length: rates between 0 and 1
    reward.write_text("def compute_score(response, ground_truth):\n"
                      "    return {'overall': float(len(response) % 2), 'accuracy': float(len(response) % 2)}\n")
    args = _args(tiny_model_dir, counting_dir, str(tmp_path / "unused"), f"{reward}:compute_score",  # (outputs:
                 "trainer.max_steps=6", "trainer.save_freq=3", "data.max_samples=8",  # the fixture's keys win)
                 "data.sampler=difficulty_pools", "data.sampler_kwargs={set_aside_after: 1, readmit_after: 2}")
    straight, stopped = straight_and_resumed(3, args)
    assert len(drawn) == 6 + 3 + 3 and drawn[6:] == drawn[:6]
    state = [C.read_state(os.path.join(out, "checkpoints", "global_step_6")) for out in (straight, stopped)]
    assert state[0]["sampler"] == state[1]["sampler"] and state[0]["sampler_name"] == "difficulty_pools"
    assert state[0]["sampler"]["draws"] == 6 and any(state[0]["sampler"]["aside_until"])  # it did set prompts aside
    a, b = _weights(os.path.join(straight, "final")), _weights(os.path.join(stopped, "final"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    ckpt = os.path.join(stopped, "checkpoints", "global_step_3")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        rlvr.main([*_args(tiny_model_dir, counting_dir, str(tmp_path / "switched"), f"{reward}:compute_score",
                          "trainer.max_steps=6", "data.max_samples=8"), f"trainer.resume={ckpt}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "rllava: error" in line and "saved by a run with data.sampler="
            "difficulty_pools, this run has data.sampler=epoch; resume with data.sampler=difficulty_pools" in line], err
    assert "Traceback" not in err


KILLER = """
import os, signal, sys
from rllava.train import checkpoint as C
from rllava.train.pipeline import rlvr
save_engine = C.save_engine
def save_then_die(engine, path, parts):  # the actor's shards of step 2 are written, the rest is not
    save_engine(engine, path, parts)
    if "global_step_2" in path:
        os.kill(os.getpid(), signal.SIGKILL)
C.save_engine = save_then_die
rlvr.main(sys.argv[1:])
"""


@pytest.mark.slow  # ~11 s; fast: test_bad_inputs' test_runtime_a_kill_mid_save_then_the_same_command
def test_sigkill_mid_save_keeps_the_previous_checkpoint(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                       capsys):
    out = str(tmp_path / "run")
    args = _args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=3", "trainer.save_freq=1")
    res = subprocess.run([sys.executable, "-c", KILLER, *args], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    root = os.path.join(out, "checkpoints")
    assert sorted(os.listdir(root)) == ["global_step_1", "global_step_2.tmp", C.TRACKER_FILE]
    assert C.list_checkpoints(root) == [(1, os.path.join(root, "global_step_1"))]
    assert _steps(out) == [1, 2]  # step 2 ran and was logged before the kill

    rlvr.main(args)  # trainer.resume=auto picks global_step_1
    assert f"resumed from {root}/global_step_1 at step 1 of 3" in capsys.readouterr().out
    assert _steps(out) == [1, 2, 3]  # step 2's first log was dropped on resume, then logged again
    assert sorted(os.listdir(root)) == ["global_step_1", "global_step_2", "global_step_3", C.TRACKER_FILE]
    assert open(os.path.join(root, C.TRACKER_FILE)).read() == "3"


def test_save_limit_model_only_and_bad_input(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys):
    """save_limit keeps the newest; save_model_only writes weights alone (resume warns: not exact); a bad resume
    path or a checkpoint of another model is one line, before anything is written."""
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=3", "trainer.save_freq=1",
                    "trainer.save_limit=2", "trainer.save_model_only=true"))
    root = os.path.join(out, "checkpoints")
    assert [s for s, _ in C.list_checkpoints(root)] == [2, 3]
    ckpt = os.path.join(root, "global_step_3")
    saved = C.read_state(ckpt)
    assert saved["contents"] == ["model"] and saved["sampler"] == {"epoch": 0, "position": 3}
    assert not os.path.exists(os.path.join(ckpt, "rng"))
    keys = set(dcp.FileSystemReader(os.path.join(ckpt, "actor")).read_metadata().state_dict_metadata)
    assert keys and all(k.startswith("model.") for k in keys)

    resumed = str(tmp_path / "resumed")
    rlvr.main(_args(tiny_model_dir, counting_dir, resumed, distinct_reward, "trainer.max_steps=4",
                    f"trainer.load_checkpoint_path={root}"))
    assert _steps(resumed) == [4]

    for extra, message in [
        ([f"trainer.resume={tmp_path / 'nope'}"], f"trainer.resume={tmp_path / 'nope'}: no checkpoint there"),
        ([f"trainer.resume={ckpt}", "actor.model.use_peft=true", "actor.model.lora_r=4"],
         "was it written for another model?"),
    ]:
        bad = str(tmp_path / "bad")
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            rlvr.main(_args(tiny_model_dir, counting_dir, bad, distinct_reward, "trainer.max_steps=4", *extra))
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert [line for line in err.splitlines() if "rllava: error" in line and message in line], err
        assert "Traceback" not in err
    assert not os.path.exists(os.path.join(bad, "checkpoints"))


def _generates(path):
    """A save_pretrained directory loads and generates from an image prompt. The processor is the standard one
    (tests/model/test_loader.py loads it with transformers and torchvision), here through rllava's
    `load_processor`, as without torchvision `AutoProcessor` cannot build it."""
    from PIL import Image

    from rllava.model.processor import load_processor

    model, processor = AutoModelForImageTextToText.from_pretrained(path), load_processor(path)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.new("RGB", (56, 56), "red")], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]
    return processor


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_hf_export_every_save_and_after_the_fact(tmp_path, tiny_model_dir, counting_dir, distinct_reward, lora):
    """save_contents=[.., hf_model]: each checkpoint holds a save_pretrained copy (LoRA merged, the run's chat
    template included); `python -m rllava.commands.export` rebuilds the same from a checkpoint without one."""
    template = AutoTokenizer.from_pretrained(tiny_model_dir).chat_template + "{# rllava export test #}"
    out = str(tmp_path / "run")
    lora_args = ["actor.model.use_peft=true", "actor.model.lora_r=4", "actor.model.lora_alpha=16",
                 "actor.optim.lr=1e-2"] if lora else []
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=2", "trainer.save_freq=1",
                    "actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
                    f"data.override_chat_template={json.dumps(template)}", *lora_args))
    final = _weights(os.path.join(out, "final"))
    hf = os.path.join(out, "checkpoints", "global_step_2", "actor", "huggingface")
    assert _generates(hf).chat_template == template
    step2 = _weights(hf)
    assert step2.keys() == final.keys() and all(torch.equal(step2[k], final[k]) for k in final)
    assert os.path.isfile(os.path.join(hf, "adapter", "adapter_model.safetensors")) == lora

    exported = str(tmp_path / "exported")
    res = subprocess.run([sys.executable, "-m", "rllava.commands.export", os.path.join(out, "checkpoints"), exported],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr[-2000:]
    again = _weights(exported)
    assert again.keys() == final.keys() and all(torch.equal(again[k], final[k]) for k in final)
    assert _generates(exported).chat_template == template
    if lora:  # unmerged: the base weights, exactly the starting ones
        base = _weights(X.export(os.path.join(out, "checkpoints"), str(tmp_path / "base"), merge_lora=False))
        start = _weights(tiny_model_dir)
        assert base.keys() == start.keys() and all(torch.equal(base[k], start[k]) for k in start)
        assert any(not torch.equal(final[k], start[k]) for k in start)


def _torchrun(nproc, *args):
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    res = subprocess.run([sys.executable, *launcher, "-m", "rllava.train.pipeline.rlvr", *args], capture_output=True,
                         text=True, cwd=REPO, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return res


@pytest.mark.slow
def test_checkpoint_moves_between_world_sizes(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    """2 FSDP2 ranks save step 1 -> one process (single-device engine) resumes and saves step 2 -> 2 ranks
    resume and finish step 3; each resume continues the step count, the data order and the weights. The 2-rank
    runs save in the background (actor.checkpoint.async_save: DTensor shards staged, a gloo group of its own)."""
    out = str(tmp_path / "run")
    base = _args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.save_freq=1")
    _torchrun(2, *base, "trainer.max_steps=1", "actor.strategy=fsdp2", "actor.checkpoint.async_save=true")
    res = _torchrun(1, *base, "trainer.max_steps=2")
    assert "RNG states not restored (saved by 2 ranks, running on 1" in res.stderr
    _torchrun(2, *base, "trainer.max_steps=3", "actor.strategy=fsdp2", "actor.checkpoint.async_save=true")
    assert _steps(out) == [1, 2, 3]
    root = os.path.join(out, "checkpoints")
    assert [C.read_state(p)["world_size"] for _, p in C.list_checkpoints(root)] == [2, 1, 2]
    assert C.read_state(os.path.join(root, "global_step_3"))["sampler"] == {"epoch": 0, "position": 3}
    # the 1-rank save of step 2 is what the 2 ranks started from: step 3's weights moved on from it
    step2 = _weights(X.export(os.path.join(root, "global_step_2"), str(tmp_path / "s2")))
    final = _weights(os.path.join(out, "final"))
    assert sum(not torch.equal(step2[k], final[k]) for k in final) > len(final) // 2


def test_critic_is_checkpointed_and_warmup_counts_from_the_resumed_step(tmp_path, tiny_model_dir, counting_dir,
                                                                        distinct_reward, capsys):
    out = str(tmp_path / "run")
    args = _args(tiny_model_dir, counting_dir, out, distinct_reward, "algorithm.adv_estimator=gae",
                 f"critic.model.model_path={tiny_model_dir}", "trainer.critic_warmup=1", "trainer.save_freq=1")
    rlvr.main([*args, "trainer.max_steps=1"])
    ckpt = os.path.join(out, "checkpoints", "global_step_1")
    assert C.read_state(ckpt)["engines"] == ["actor", "critic"] and os.path.isdir(os.path.join(ckpt, "critic"))
    rlvr.main([*args, "trainer.max_steps=2"])
    rows = _step_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert "actor/pg_loss" not in rows[0] and "actor/pg_loss" in rows[1]  # warm-up was step 1, before the stop
    plain = str(tmp_path / "plain")  # a run with a critic cannot resume from a checkpoint without one
    rlvr.main(_args(tiny_model_dir, counting_dir, plain, distinct_reward, "trainer.max_steps=1", "trainer.save_freq=1"))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        rlvr.main(_args(tiny_model_dir, counting_dir, str(tmp_path / "c"), distinct_reward,
                        "algorithm.adv_estimator=gae", f"critic.model.model_path={tiny_model_dir}",
                        f"trainer.resume={plain}/checkpoints", "trainer.max_steps=2"))
    assert "global_step_1: holds no critic state (the run that wrote it had no critic)" in capsys.readouterr().err


def test_async_save_resumes_exactly_like_a_sync_save(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                     monkeypatch):
    """actor.checkpoint.async_save=true: the engines' state is written on the writer thread while the next steps
    train (here: only once steps 3 and 4 have run); stopped before the save of step 4 and resumed from step 2's,
    the run ends bitwise where the synchronous straight run does: the staged copy is the state at the save, not
    what training made of it meanwhile."""
    common = ("trainer.max_steps=4", "trainer.save_freq=2", "data.max_samples=8", "actor.optim.lr=3e-3")
    straight, stopped = str(tmp_path / "straight"), str(tmp_path / "stopped")
    rlvr.main(_args(tiny_model_dir, counting_dir, straight, distinct_reward, *common))
    threads, trained, write, save = [], threading.Event(), C.write_state, C.save_checkpoint

    def slow_write(state, path, group):
        threads.append(threading.current_thread().name)
        assert trained.wait(60)
        write(state, path, group)

    def stop_before_4(run, step):  # steps 3 and 4 have trained while step 2's save waits to be written
        if step == 4:
            trained.set()
            raise KeyboardInterrupt
        return save(run, step)

    monkeypatch.setattr(C, "write_state", slow_write)
    asynchronous = _args(tiny_model_dir, counting_dir, stopped, distinct_reward, *common,
                         "actor.checkpoint.async_save=true")
    monkeypatch.setattr(C, "save_checkpoint", stop_before_4)
    with pytest.raises(SystemExit):
        rlvr.main(asynchronous)
    monkeypatch.setattr(C, "save_checkpoint", save)
    root = os.path.join(stopped, "checkpoints")
    assert C.list_checkpoints(root) == [(2, os.path.join(root, "global_step_2"))]  # the exit waited for it
    rlvr.main(asynchronous)
    assert threads and all(t.startswith("rllava-checkpoint") for t in threads)
    assert [s for s, _ in C.list_checkpoints(root)] == [2, 4] and open(os.path.join(root, C.TRACKER_FILE)).read() == "4"
    a, b = _weights(os.path.join(straight, "final")), _weights(os.path.join(stopped, "final"))
    assert all(torch.equal(a[k], b[k]) for k in a)


ASYNC_KILLER = """
import os, signal, sys
from rllava.train import checkpoint as C
from rllava.train.pipeline import rlvr
write = C.write_state
def write_then_die(state, path, group):  # the writer thread dies with the process after step 2's actor state
    write(state, path, group)
    if "global_step_2" in path:
        os.kill(os.getpid(), signal.SIGKILL)
C.write_state = write_then_die
rlvr.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_sigkill_or_failure_in_a_background_write(tmp_path, tiny_model_dir, counting_dir, distinct_reward, capsys,
                                                  monkeypatch):
    """A SIGKILL while the background thread writes step 2 leaves step 1 whole (step 2 stays a `.tmp`) and the
    same command resumes from it; a failing background write stops the run with one line at the next wait."""
    out = str(tmp_path / "run")
    args = _args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=3", "trainer.save_freq=1",
                 "trainer.save_limit=1", "actor.checkpoint.async_save=true")
    res = subprocess.run([sys.executable, "-c", ASYNC_KILLER, *args], capture_output=True, text=True, cwd=REPO)
    assert res.returncode == -signal.SIGKILL, res.stderr[-2000:]
    root = os.path.join(out, "checkpoints")
    assert sorted(os.listdir(root)) == ["global_step_1", "global_step_2.tmp", C.TRACKER_FILE]
    rlvr.main(args)
    assert f"resumed from {root}/global_step_1 at step 1 of 3" in capsys.readouterr().out
    assert sorted(os.listdir(root)) == ["global_step_3", C.TRACKER_FILE] and _steps(out) == [1, 2, 3]

    def disk_full(state, path, group):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(C, "write_state", disk_full)
    with pytest.raises(SystemExit) as e:
        rlvr.main(_args(tiny_model_dir, counting_dir, str(tmp_path / "full"), distinct_reward, "trainer.max_steps=3",
                        "trainer.save_freq=1", "actor.checkpoint.async_save=true"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "rllava: error: the background checkpoint save failed (OSError"
            in line and "No space left on device" in line], err
    assert "Traceback" not in err and not C.list_checkpoints(str(tmp_path / "full" / "checkpoints"))
