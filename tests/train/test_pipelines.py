"""The real CLI on a tiny Qwen2-VL for a few steps (the pipeline tier)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from rllava.train.pipeline import rlvr, sft
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _args(model, data, out, *extra):
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=16",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=8",
            "rollout.n=4", "trainer.max_steps=2", "trainer.val_freq=2", "data.val_batch_size=8",
            *keys_for(out), "trainer.logger=[jsonl]", *extra]


def _metrics(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def _weights(path):
    return load_file(os.path.join(path, "model.safetensors"))


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_rlvr_two_steps_change_parameters_and_write_metrics(tmp_path, tiny_model_dir, counting_dir):
    out = str(tmp_path / "run")
    # A random model never answers right, so reward something its samples do vary in: distinct characters.
    reward = tmp_path / "distinct.py"
    reward.write_text("def compute_score(response, ground_truth):\n"
                      "    return {'overall': len(set(response)) / 20, 'accuracy': 0.0}\n")
    # KL to the reference and two mini-batches: exercises the reference and old-log-prob passes too
    rlvr.main(_args(tiny_model_dir, counting_dir, out, f"reward.reward_function={reward}:compute_score",
                    "algorithm.use_kl_loss=true", "actor.kl_loss_coef=0.1",
                    "actor.ppo_mini_batch_size=2", "trainer.val_greedy=true", "trainer.val_generations_to_log=3"))
    rows = _metrics(out)
    steps = [r for r in rows if "reward/mean" in r]
    vals = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in steps] == [1, 2] and [r["step"] for r in vals] == [0, 2]
    for key in ["reward/mean", "reward/std", "reward/accuracy_mean", "response_length/mean", "actor/kl_loss",
                "actor/entropy", "actor/pg_clipfrac", "actor/grad_norm", "timing/step", "timing/rollout",
                "timing/ref", "timing/old_logprob", "perf/tokens_per_s", "actor/lr"]:
        assert key in steps[0], key
    assert "val_greedy/accuracy" in vals[0] and "val/pass@2" in vals[0] and "val_greedy/pass@1" not in vals[0]
    before, after = _weights(tiny_model_dir), _weights(os.path.join(out, "final"))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2
    assert len(open(os.path.join(out, "val_generations.jsonl")).readlines()) == 6
    assert os.path.exists(os.path.join(out, "config.yaml"))


def test_weighted_rewards_log_each_source_and_survive_a_nan(tmp_path, tiny_model_dir, counting_dir):
    """reward.reward_functions from the command line: r = 0.5 * distinct + 1.0 * flaky, each source logged on its
    own; `flaky` returns NaN on every 5th call, which scores reward.fallback_score=-1 and counts in reward/errors
    (non-strict, the default) instead of reaching the advantage."""
    out = str(tmp_path / "run")
    (tmp_path / "distinct.py").write_text("def distinct(response, ground_truth):\n"
                                          "    return {'overall': len(set(response)) / 20, 'accuracy': 0.0}\n")
    (tmp_path / "flaky.py").write_text("calls = 0\ndef flaky(response, ground_truth, prompt):\n    global calls\n"
                                       "    calls += 1\n    assert 'How many' in prompt, prompt\n"
                                       "    return {'overall': float('nan') if calls % 5 == 0 else 1.0, 'half': 0.5}\n")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, "reward.reward_function=null", "trainer.val_before_train=false",
                    f"reward.reward_functions=[{{function: {tmp_path}/distinct.py:distinct, weight: 0.5}}, "
                    f"{{function: {tmp_path}/flaky.py:flaky, weight: 1.0}}]", "reward.fallback_score=-1"))
    rows = _metrics(out)
    steps = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:  # 16 samples a step: calls 5, 10, 15 of each 16 fail
        assert row["reward/errors"] == 3.0 and row["reward/flaky_mean"] == (13 - 3) / 16
        # a failed sample has no parts (they count 0 in the means)
        assert row["reward/flaky/half_mean"] == 13 * 0.5 / 16 and row["reward/distinct/accuracy_mean"] == 0.0
        assert row["reward/mean"] == pytest.approx(0.5 * row["reward/distinct_mean"] + row["reward/flaky_mean"])
        assert all(v == v and abs(v) != float("inf") for v in row.values() if isinstance(v, float)), row
    val = [r for r in rows if "val/flaky" in r]
    assert [r["step"] for r in val] == [2] and {"val/distinct", "val/flaky/half", "val/accuracy"} <= set(val[0])


def test_sft_learns_the_format(tmp_path, tiny_model_dir, counting_dir):
    out = str(tmp_path / "sft")
    sft.main(_args(tiny_model_dir, counting_dir, out, "data.target_key=solution", "trainer.max_steps=60",
                   "trainer.val_freq=60", "actor.optim.lr=3e-3", "actor.optim.lr_scheduler_type=constant",
                   "rollout.val_override_config={temperature: 0, n: 1}"))
    rows = _metrics(out)
    losses = [r["actor/pg_loss"] for r in rows if "actor/pg_loss" in r]
    assert losses[-1] < 0.5 * losses[0]
    assert [r for r in rows if "val/format" in r][-1]["val/format"] == 1.0  # every greedy answer is <answer>N</answer>


def test_sft_needs_target_key(tmp_path, tiny_model_dir, counting_dir, capsys):
    with pytest.raises(SystemExit) as e:
        sft.main(_args(tiny_model_dir, counting_dir, str(tmp_path / "x")))
    assert e.value.code == 2
    assert "needs data.target_key" in capsys.readouterr().err


def test_sft_with_an_agent_program_is_a_start_up_error(tmp_path, tiny_model_dir, counting_dir, capsys):
    """A program's tools are its own: SFT cannot replay the expert's turns through them (before: an AttributeError
    at the first step, after the model loaded)."""
    program = tmp_path / "agent.py"
    program.write_text("def run(client, sample):\n    return 1.0\n")
    with pytest.raises(SystemExit) as e:
        sft.main(_args(tiny_model_dir, counting_dir, str(tmp_path / "x"), "data.target_key=answer",
                       f"rollout.agent.program={program}:run"))
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("rllava: error: rollout.agent.program: "
                                                                        "multi-turn SFT replays")


def test_cli_errors_are_one_line(tmp_path, tiny_model_dir, counting_dir):
    """The real command line: exit status 2 and the one line, no traceback (the other errors below in-process, the
    same `run_cli` without a Python start-up each)."""
    cmd = [sys.executable, "-m", "rllava.train.pipeline.rlvr",
           *_args(tiny_model_dir, counting_dir, str(tmp_path), "actor.optim.lrr=1")]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert "unknown config key 'actor.optim.lrr' (on the command line); did you mean 'actor.optim.lr'?" in res.stderr


@pytest.mark.parametrize("extra, message", [
    (["rollout.n=many"], "config key 'rollout.n' expects int"),
    (["algorithm.adv_estimator=grop"], "algorithm.adv_estimator='grop' is not registered"),
    (["reward.reward_function=nope.py:f"], "file 'nope.py' does not exist"),
    (["data.train_files=missing.jsonl"], "data.train_files=missing.jsonl: no such file or directory"),
    (["actor.model.model_path=/no/such/model"], "actor.model.model_path='/no/such/model': no such local directory"),
])
def test_start_up_errors_are_one_line(tmp_path, tiny_model_dir, counting_dir, capsys, extra, message):
    with pytest.raises(SystemExit) as e:
        rlvr.main(_args(tiny_model_dir, counting_dir, str(tmp_path), *extra))
    err = capsys.readouterr().err
    assert e.value.code == 2, err[-2000:]
    assert "Traceback" not in err and message in err
    assert "Loading weights" not in err  # found before the model loads: a typo costs a second, not the model's load


def test_a_run_prints_no_library_noise_and_warnings_in_one_line(tmp_path, tiny_model_dir, counting_dir):
    """No DeepSpeed accelerator guess, no datasets progress bars; an ignored key the user set is one line
    `rllava: warning: ...` (no Python file:line header)."""
    cmd = [sys.executable, "-m", "rllava.train.pipeline.rlvr", *_args(tiny_model_dir, counting_dir, str(tmp_path / "r"),
                                                                      "trainer.max_steps=1", "trainer.val_freq=-1",
                                                                      "rollout.vllm.enforce_eager=false")]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "rllava: warning: rollout.vllm.enforce_eager ignored: rollout.name=hf\n" in res.stderr
    for noise in ("Setting accelerator to CPU", "Generating train split", "UserWarning", "self.validate()",
                  "couldn't be hashed"):  # datasets' fingerprint of a closure (issue 62 item 11)
        assert noise not in res.stderr + res.stdout, noise


def test_under_torchrun_the_one_line_ends_the_failure_summary(tmp_path, tiny_model_dir, counting_dir):
    """torchrun prints its own traceback when a worker fails; the worker's one line is the root cause its
    summary ends with (the elastic error file), and the worker's exit status 2 is shown there."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "-m", "rllava.train.pipeline.rlvr",
           *_args(tiny_model_dir, counting_dir, str(tmp_path / "r"), "actor.model.model_path=/no/such/model")]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    lines = [line for line in res.stderr.splitlines() if line.strip() and not set(line.strip()) <= {"="}]
    assert res.returncode != 0 and "exitcode  : 2" in res.stderr, res.stderr[-3000:]
    assert lines[-1] == ("  traceback : rllava: error: actor.model.model_path='/no/such/model': no such local "
                         "directory (a hub id is written org/name, and no folder org/ here)"), res.stderr[-3000:]


def test_a_config_error_comes_before_torch_is_imported():
    """`python -m rllava.train.pipeline.<name>` checks the config before the pipeline imports torch and transformers
    (~10 s of CPU, a minute on a busy machine; issue 49), and other frameworks' names get rllava's key."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "rllava.train.pipeline.rlvr",
                          "actor.optim.learning_rate=1e-6"], capture_output=True, text=True, cwd=REPO)
    imported = {line.split("|")[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert res.returncode == 2 and "omegaconf" in imported and not imported & {"torch", "transformers", "numpy"}
    assert [line for line in res.stderr.splitlines() if not line.startswith("import time:")] == [
        "rllava: error: unknown config key 'actor.optim.learning_rate' (on the command line); did you mean "
        "'actor.optim.lr'?"]


def test_under_torchrun_a_start_up_error_is_said_once_per_launch():
    """Every rank meets the same config error: rank 0 prints it and torchrun's summary names it as the root cause;
    rank 1, waiting for rank 0 to fail first, is ended by torchrun instead of failing with the same line."""
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                          "rllava.train.pipeline.rlvr", "actor.optim.learning_rate=1e-6"],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode != 0 and res.stderr.count("unknown config key 'actor.optim.learning_rate'") == 2
    assert res.stderr.count("exitcode  : 2") == 1 and "rank      : 0" in res.stderr, res.stderr[-3000:]


@pytest.mark.parametrize("busy, threads", [(0, None), (1, "1"), (2, "1")])
def test_torch_threads_are_the_cores_left_idle(tmp_path, monkeypatch, busy, threads):
    """Without OMP_NUM_THREADS, as many torch threads as cores were idle while it looked (/proc/stat's ticks);
    torch's own choice when all were (issue 49). Here 2 cores, `busy` of them busy for the 100 ticks it looked."""
    from rllava.train import cli

    stat = tmp_path / "stat"

    def ticks(t):  # per CPU: user nice system idle iowait irq softirq steal
        stat.write_text("cpu  0 0 0 0 0 0 0 0\n" + "".join(
            f"cpu{i} {t if i < busy else 0} 0 0 {0 if i < busy else t} 0 0 0 0\n" for i in range(2)))

    ticks(0)
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(cli.time, "sleep", lambda seconds: ticks(100))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cli.cpu_threads(stat=str(stat))
    assert os.environ.get("OMP_NUM_THREADS") == threads


@pytest.mark.slow
def test_torchrun_single_process(tmp_path, tiny_model_dir, counting_dir):
    out = str(tmp_path / "tr")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "-m", "rllava.train.pipeline.rlvr",
           *_args(tiny_model_dir, counting_dir, out, "trainer.max_steps=1", "trainer.val_before_train=false")]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    assert [r["step"] for r in _metrics(out)] == [1, 1]
    assert re.search(r"^val: \d+ prompts x \d+ samples?, \d+ batch(es)? per rank$", res.stdout, re.M), res.stdout


@pytest.mark.parametrize("extra, expect", [
    (["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive"], ["actor/reward_kl", "timing/ref"]),
    (["algorithm.rollout_is=sequence"], ["actor/rollout_is_mean", "actor/rollout_is_truncated_frac"]),
    (["actor.tis_imp_ratio_cap=2.0", "actor.ppo_epochs=2"], ["actor/rollout_is_mean", "timing/old_logprob",
                                                      "rollout/logprob_gap_mean", "rollout/logprob_gap_max"]),
    (["algorithm.adv_estimator=remax"], ["reward/mean"]),
    (["algorithm.adv_estimator=rloo", "algorithm.policy_loss_fn=gspo"], ["reward/mean"]),
    (["actor.policy_loss.loss_mode=clip_cov", "actor.entropy_coeff=0.01"], ["actor/clip_cov_frac"]),
    (["actor.policy_loss.loss_mode=sapo", "actor.ppo_mini_batch_size=2"], ["actor/sapo_weight"]),
    (["algorithm.online_filtering=true", "trainer.max_try_make_batch=3"], ["batch/sampling_rounds"]),
    (["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4"], ["reward/overlong_penalty_mean"]),
    (["reward.repetition_penalty.enable=true", "reward.repetition_penalty.ngram_size=2"],
     ["reward/repetition_penalty_mean"]),
    (["actor.fsdp.enable_cpu_offload=true", "actor.fsdp.offload_optimizer=true", "actor.fsdp.offload_params=true",
      "actor.model.enable_gradient_checkpointing=true"], ["actor/grad_norm"]),
    (["trainer.max_steps=2", "actor.model.padding_free=true", "actor.model.dynamic_batching=true",
      "actor.ppo_max_token_len_per_gpu=300", "actor.log_prob_max_token_len_per_gpu=300", "actor.logprob_chunk_size=16",
      "ref.log_prob_max_token_len_per_gpu=300", "actor.ppo_mini_batch_size=2", "algorithm.use_kl_loss=true",
      "actor.kl_loss_coef=0.1"], ["actor/grad_norm", "actor/kl_loss", "timing/old_logprob", "timing/ref"]),
])
def test_rlvr_step_with_algorithm_options(tmp_path, tiny_model_dir, counting_dir, extra, expect):
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, "trainer.max_steps=1", "trainer.val_before_train=false",
                    "trainer.val_freq=-1", *extra))
    row = [r for r in _metrics(out) if "reward/mean" in r][0]
    for key in expect:
        assert key in row, key
    assert all(v == v for v in row.values()), row  # no NaN


def test_difficulty_pools_observe_each_training_group_once_and_no_validation_one(tmp_path, tiny_model_dir,
                                                                                 counting_dir, monkeypatch):
    """data.sampler=difficulty_pools beside DAPO's filtering: DAPO's extra rounds draw from the sampler, and every
    group scored in a round reaches `observe` once, as the train-set positions of the prompts drawn; validation
    (before training and at step 2) feeds it nothing; the pools' sizes are logged per step."""
    from rllava.algorithms.curriculum import DifficultyPools

    drawn, observed = [], []
    next_batch, observe = DifficultyPools.next_batch, DifficultyPools.observe
    monkeypatch.setattr(DifficultyPools, "next_batch", lambda self: drawn.append(next_batch(self)) or drawn[-1])
    monkeypatch.setattr(DifficultyPools, "observe", lambda self, groups: observed.append(groups) or observe(
        self, groups))
    reward = tmp_path / "parity.py"  # right or wrong by the response's length: groups with and without signal
    reward.write_text("def compute_score(response, ground_truth):\n"
                      "    return {'overall': float(len(response) % 2), 'accuracy': float(len(response) % 2)}\n")
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, f"reward.reward_function={reward}:compute_score",
                    "data.sampler=difficulty_pools", "algorithm.online_filtering=true", "algorithm.filter_low=0.6",
                    "trainer.max_try_make_batch=3", "trainer.val_before_train=true", "data.max_samples=12"))
    steps = [r for r in _metrics(out) if "reward/mean" in r]
    assert sum(r["batch/sampling_rounds"] for r in steps) == len(drawn) == len(observed) > 2  # extra rounds ran
    assert sum(r["batch/groups_sampled"] for r in steps) == sum(map(len, observed))
    for batch, groups in zip(drawn, observed):
        assert [i for i, _ in groups] == batch and all(len(values) == 4 for _, values in groups)
    assert steps[-1]["sampler/unseen"] == 12 - len({i for b in drawn for i in b})
    assert sum(steps[-1][f"sampler/{k}"] for k in ("easy", "medium", "hard", "set_aside")) == 12


def test_register_ppo_class_plugin(tmp_path, tiny_model_dir, counting_dir):
    """The seed README's plugin form: a PPO subclass registered by name, loaded from the user's own file."""
    plugin = tmp_path / "my_algo.py"
    calls = tmp_path / "calls.txt"
    plugin.write_text(
        "from rllava.algorithms.ppo import PPO\n"
        "from rllava.algorithms.registry import register_ppo\n\n"
        "@register_ppo('my_algo')\n"
        "class MyAlgo(PPO):\n"
        "    def compute_advantage(self, batch):\n"
        f"        open({str(calls)!r}, 'a').write('x')\n"
        "        return (batch.scores - batch.scores.mean())[:, None] * batch.loss_mask\n")
    out = str(tmp_path / "run")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, "trainer.max_steps=2", "trainer.val_before_train=false",
                    "trainer.val_freq=-1", f"algorithm.plugins=[{plugin}]", "algorithm.adv_estimator=my_algo"))
    assert calls.read_text() == "xx"


def test_ppo_gae_with_critic_and_warmup(tmp_path, tiny_model_dir, counting_dir, monkeypatch):
    """Also actor/critic.fsdp.offload_optimizer: each optimizer's Adam state comes to the device for its update
    stage only (the engine's update_phase, entered by Actor.update and Critic.update) and steps only there."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from rllava.engine.train import single

    events, move = [], single.move_optimizer_state
    monkeypatch.setattr(single, "move_optimizer_state", lambda opt, device: (events.append(("move", id(opt))),
                                                                            move(opt, device)))
    hook = register_optimizer_step_pre_hook(lambda opt, *a: events.append(("step", id(opt))))
    out = str(tmp_path / "run")
    reward = tmp_path / "distinct.py"
    reward.write_text("def compute_score(response, ground_truth):\n    return len(set(response)) / 20\n")
    try:
        rlvr.main(_args(tiny_model_dir, counting_dir, out, "algorithm.adv_estimator=gae", "algorithm.lam=0.95",
                        f"critic.model.model_path={tiny_model_dir}", "critic.optim.lr=1e-3", "trainer.critic_warmup=1",
                        f"reward.reward_function={reward}:compute_score", "trainer.val_before_train=false",
                        "trainer.val_freq=-1", "actor.fsdp.offload_optimizer=true", "critic.fsdp.offload_optimizer=true"))
    finally:
        hook.remove()
    steps = [r for r in _metrics(out) if "reward/mean" in r]
    assert "critic/vf_loss" in steps[0] and "actor/pg_loss" not in steps[0]  # warm-up: only the critic learns
    assert "critic/vf_loss" in steps[1] and "actor/pg_loss" in steps[1]
    assert "timing/values" in steps[0]
    per_optimizer = {}  # each optimizer's events: (in, step..., out) per update stage, on steps 2 + 1 stages
    for kind, opt in events:
        per_optimizer.setdefault(opt, []).append(kind)
    assert sorted(len([k for k in ks if k == "move"]) for ks in per_optimizer.values()) == [2, 4], per_optimizer
    for kinds in per_optimizer.values():
        stages = "".join("m" if k == "move" else "s" for k in kinds).split("mm")
        assert kinds[0] == kinds[-1] == "move" and all(set(stage.strip("m")) == {"s"} for stage in stages), kinds


def test_gae_without_a_critic_is_a_config_error(tmp_path, tiny_model_dir, counting_dir, capsys):
    with pytest.raises(SystemExit):
        rlvr.main(_args(tiny_model_dir, counting_dir, str(tmp_path), "algorithm.adv_estimator=gae"))
    assert "algorithm.adv_estimator=gae needs a critic: set critic.model.model_path" in capsys.readouterr().err


def test_lora_with_kl_to_the_adapter_free_base(tmp_path, tiny_model_dir, counting_dir):
    """LoRA + KL (a peer framework raises KeyError here): the reference is the base with adapters off, and only
    the adapted projections differ in the merged final weights."""
    out = str(tmp_path / "run")
    reward = tmp_path / "distinct.py"
    reward.write_text("def compute_score(response, ground_truth):\n    return len(set(response)) / 20\n")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, "actor.model.use_peft=true", "actor.model.lora_r=4",
                    "actor.model.lora_alpha=16", "actor.optim.lr=1e-2", "algorithm.use_kl_loss=true",
                    "actor.kl_loss_coef=0.1", f"reward.reward_function={reward}:compute_score",
                    "trainer.val_before_train=false", "trainer.val_freq=-1"))
    steps = [r for r in _metrics(out) if "reward/mean" in r]
    assert steps[0]["actor/kl_loss"] == 0.0 and steps[1]["actor/kl_loss"] > 0  # adapters moved away from the base
    before, after = _weights(tiny_model_dir), _weights(os.path.join(out, "final"))
    assert set(before) == set(after)
    changed = {k.split(".")[-2] for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert os.path.exists(os.path.join(out, "final", "adapter", "adapter_model.safetensors"))
