"""Asynchronous RL (rllava.train.async_rl): the schedule, the staleness metrics, regrouping a batch over trainers,
and whole runs under torchrun (1 trainer + 1 rollout process): staleness 0 is the synchronous run, a resumed run
is the uninterrupted one, vLLM's weight-update path gets each version, Ctrl-C leaves nothing behind."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from safetensors.torch import load_file

from rllava.config import ConfigError, load_config
from rllava.data.protocol import Sample, Segment, Trajectory
from rllava.train.async_rl import needed_versions, regroup, staleness_metrics, version_for
from rllava.train.outputs import keys_for
from rllava.train.pipeline.rlvr import Rollouts

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASYNC = ["trainer.async_training=true", "trainer.rollout_ranks=1"]


def _args(model, data, out, *extra):
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=16",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.val_batch_size=16",
            *keys_for(out), "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.val_freq=-1",
            "trainer.max_steps=4", *extra]


def _launch(nproc, args, env=None, **kw):
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    return [sys.executable, *launcher, "-m", "rllava.train.pipeline.rlvr", *args], \
        {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}


def _run(nproc, args, env=None):
    cmd, env = _launch(nproc, args, env)
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _rows(out):
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]


def _same(rows_a, rows_b, skip=("timing/", "perf/", "time/", "async/", "actor/mismatch_")):
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    for a, b in zip(rows_a, rows_b):
        keys = {k for k in a.keys() | b.keys() if not k.startswith(skip)}
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}, a["step"]


def test_schedule():
    """v(s) = max(0, s - 1 - k, last save before s); k = 0 is the synchronous order."""
    assert [version_for(s, 0, -1) for s in range(1, 6)] == [0, 1, 2, 3, 4]
    assert [version_for(s, 1, -1) for s in range(1, 6)] == [0, 0, 1, 2, 3]
    assert [version_for(s, 2, -1) for s in range(1, 7)] == [0, 0, 0, 1, 2, 3]
    # a save at step 2 and 4: batch 3 waits for update 2, batch 5 for update 4 (nothing in flight at a save)
    assert [version_for(s, 2, 2) for s in range(1, 7)] == [0, 0, 2, 2, 4, 4]
    assert needed_versions(0, 6, 2, 2) == [0, 2, 4]
    assert needed_versions(4, 6, 2, 2) == [4]


def _traj(group, versions, n=3):
    return Trajectory(Sample(0, [], [], ""), group, [Segment([1, 2], trained=False)] +
                      [Segment([5] * n, trained=True, version=v) for v in versions], {})


def test_staleness_metrics_count_tokens_by_lag():
    # step 5 trains on tokens sampled by versions 4 (lag 0), 3 (lag 1) and 2 (lag 2): 3 + 6 + 3 tokens
    m = staleness_metrics([_traj(0, [4, 3]), _traj(0, [3, 2])], step=5)
    assert m == {"async/staleness_mean": (0 * 3 + 1 * 6 + 2 * 3) / 12, "async/staleness_max": 2.0,
                 "async/staleness_share_0": 0.25, "async/staleness_share_1": 0.5, "async/staleness_share_2": 0.25}
    assert staleness_metrics([_traj(0, [None])], step=1) == {}  # a synchronous batch carries no versions


def test_regroup_splits_whole_groups_over_trainers():
    def part(groups, base):
        trajs = [_traj(g, [0]) for g in groups]
        return Rollouts(trajectories=trajs, scores=torch.tensor([base + i for i in range(len(trajs))], dtype=torch.float),
                        details=[{"i": base + i} for i in range(len(trajs))], dropped=[1],
                        baseline=torch.tensor([base + 0.5] * len(trajs)), metrics={"batch/sampling_rounds": base})

    a, b = part([0, 0, 1, 1], 0), part([0, 0, 1, 1], 10)  # two rollout ranks, 2 prompts x 2 samples each
    shares = regroup([a, b], 2)
    assert [[t.group_id for t in s.trajectories] for s in shares] == [[0, 0, 1, 1], [0, 0, 1, 1]]
    assert shares[0].scores.tolist() == [0, 1, 2, 3] and shares[1].scores.tolist() == [10, 11, 12, 13]
    assert shares[0].dropped == [1] and shares[1].dropped == [1]  # row 1 of each rank, where it went
    assert shares[1].baseline.tolist() == [10.5] * 4 and shares[0].metrics == {"batch/sampling_rounds": 5.0}
    one = regroup([a, b], 1)[0]
    assert [t.group_id for t in one.trajectories] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [d["i"] for d in one.details] == [0, 1, 2, 3, 10, 11, 12, 13]
    with pytest.raises(Exception, match="4 prompt groups cannot be split evenly over 3 trainers"):
        regroup([a, b], 3)


@pytest.mark.parametrize("keys, message", [
    (["trainer.async_training=true"], "trainer.async_training=true generates in processes of their own: set "
                                      "trainer.rollout_ranks"),
    (["trainer.rollout_ranks=1"], "trainer.rollout_ranks=1 is for trainer.async_training=true"),
    (["trainer.max_staleness=-1"], "trainer.max_staleness=-1 must be > 0 (or 0)"),
    ([*ASYNC, "actor.policy_loss.loss_mode=hpt", "data.target_key=solution"],
     "the SFT+RL hybrids run synchronously for now"),
])
def test_config_errors(keys, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(["config=examples/tasks/counting/tiny_cpu.yaml", *keys])


def test_without_torchrun_one_line(tmp_path, tiny_model_dir, counting_dir):
    cmd, env = _launch(1, _args(tiny_model_dir, counting_dir, str(tmp_path / "r"), *ASYNC))
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    assert res.returncode == 2 and res.stderr.strip().splitlines()[-1] == (
        "rllava: error: trainer.rollout_ranks=1 of 1 processes leaves none to train: launch with torchrun "
        "--nproc_per_node=<trainers + rollout_ranks>"), res.stderr[-2000:]


@pytest.mark.slow  # make test-slow (the fast suite's time budget)
def test_val_only_ends(tmp_path, tiny_model_dir, counting_dir):
    """trainer.val_only: the trainer validates, the rollout rank has nothing to sample; both end."""
    res = _run(2, _args(tiny_model_dir, counting_dir, str(tmp_path / "v"), *ASYNC, "trainer.val_only=true",
                        "trainer.val_before_train=true"))
    assert res.stdout.count("done in") == 1  # both ended (`_run`: torchrun's status 0); rank 0 says it


@pytest.mark.slow
def test_staleness_zero_is_the_synchronous_run(tmp_path, tiny_model_dir, counting_dir):
    """1 trainer + 1 rollout process at max_staleness=0: every metric of the synchronous run, step for step,
    and its final weights bit for bit (the async run logs the staleness and the sampler-trainer mismatch besides)."""
    sync, asyn = str(tmp_path / "sync"), str(tmp_path / "async")
    _run(1, _args(tiny_model_dir, counting_dir, sync))
    _run(2, _args(tiny_model_dir, counting_dir, asyn, *ASYNC, "trainer.max_staleness=0"))
    _same(_rows(sync), _rows(asyn))
    assert [r["async/staleness_max"] for r in _rows(asyn)] == [0, 0, 0, 0]
    a, b = load_file(f"{sync}/final/model.safetensors"), load_file(f"{asyn}/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # make test-slow (3 launches)
def test_resume_is_the_uninterrupted_run(tmp_path, tiny_model_dir, counting_dir):
    """max_staleness=1, a checkpoint at step 2: 4 steps straight, and 2 steps + a resumed run of 2, log the
    same metrics and end on the same weights (the rollout side's sampler and RNG come back)."""
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    keys = [*ASYNC, "trainer.max_staleness=1", "trainer.save_freq=2", "actor.optim.lr_scheduler_type=constant"]
    _run(2, _args(tiny_model_dir, counting_dir, straight, *keys))
    _run(2, _args(tiny_model_dir, counting_dir, split, *keys, "trainer.max_steps=2"))
    assert os.path.isfile(f"{split}/checkpoints/global_step_2/rng/rollout_rank_0.pt")
    _run(2, _args(tiny_model_dir, counting_dir, split, *keys))
    rows = _rows(straight)
    # lags: batch 1 by update 0, batch 2 by update 0 (one behind), batch 3 waits for the save at 2, batch 4 by 2
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 0, 1]
    assert all("actor/mismatch_kl" in r for r in rows)  # sampler vs trainer, logged uncorrected too
    _same(rows, _rows(split), skip=("timing/", "perf/", "time/"))
    a, b = load_file(f"{straight}/final/model.safetensors"), load_file(f"{split}/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # 3 processes each (make test-slow)
@pytest.mark.parametrize("trainers, rollout_ranks", [(2, 1), (1, 2)])
def test_several_trainers_or_rollout_ranks(tmp_path, tiny_model_dir, counting_dir, distinct_reward, trainers,
                                          rollout_ranks):
    """2 FSDP2 trainers fed by 1 rollout rank (each gets its half of the groups; the weights are gathered from
    the shards), or 1 trainer fed by 2 rollout ranks (their groups joined): the run trains every step."""
    out = str(tmp_path / "run")
    _run(trainers + rollout_ranks, _args(tiny_model_dir, counting_dir, out, "trainer.async_training=true",
                                         f"trainer.rollout_ranks={rollout_ranks}", "actor.strategy=fsdp2",
                                         f"reward.reward_function={distinct_reward}"))
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["async/staleness_max"] for r in rows] == [0, 1, 1, 1]
    assert all(r["actor/grad_norm"] > 0 for r in rows) and os.path.isfile(f"{out}/final/model.safetensors")


FAKE_ENGINE = """
import atexit, json, os, sys
sys.path.insert(0, {engine_tests!r})
import test_rollout_engines as fakes

_tokens = fakes._fake_tokens  # ordinary ids, not the tiny vocabulary's special ones
fakes._fake_tokens = lambda i, j, eos: (lambda ids, lps, f: ([t + 1000 if t != eos else t for t in ids], lps, f))(
    *_tokens(i, j, eos))
log = []
_mod = getattr(fakes, "fake_" + {name!r})(log)
globals().update({{k: v for k, v in vars(_mod).items() if not k.startswith("__")}})
if hasattr(_mod, "platforms"):  # vLLM's `vllm.platforms`, as `import` finds it
    sys.modules[__name__ + ".platforms"] = _mod.platforms


def _write():  # per weight load (vLLM: a wake-up of the weights; SGLang: a resume), the sum of what went in
    loads, sums = [], []
    for event in log:
        if event[0] in ("resume_memory_occupation", "wake_up") and event[0:2] != ("wake_up", ["kv_cache"]):
            sums = []
            loads.append(sums)
        elif event[0] in ("reload_weights", "update_weights_from_tensor"):
            sums += [float(t.double().sum()) for _, t in event[1]]
    with open(os.environ["FAKE_ENGINE_LOG"] + "." + os.environ["LOCAL_RANK"], "w") as f:
        json.dump([sum(s) for s in loads], f)


atexit.register(_write)
"""


@pytest.mark.parametrize("name", ["vllm", pytest.param("sglang", marks=pytest.mark.slow)])
def test_engine_on_the_rollout_rank_gets_each_version(tmp_path, tiny_model_dir, counting_dir, name):
    """rollout.name=vllm / sglang on the rollout rank (the fake engines): before each batch the weights that the
    schedule names go in through the engine's weight-update path: versions 0, 0, 1, 2 at max_staleness=1."""
    fake = tmp_path / "fake" / name
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(textwrap.dedent(FAKE_ENGINE.format(
        engine_tests=os.path.join(REPO, "tests", "engine"), name=name)))
    logfile, reward = str(tmp_path / "engine.json"), tmp_path / "last_char.py"
    reward.write_text("def compute_score(response, ground_truth):\n"  # the fake's samples differ in one token
                      "    return {'overall': ord(response[-1]) % 7 / 7 if response else 0.0, 'accuracy': 0.0}\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), REPO]), "FAKE_ENGINE_LOG": logfile}
    _run(2, _args(tiny_model_dir, counting_dir, str(tmp_path / "run"), *ASYNC, f"rollout.name={name}",
                  "trainer.max_staleness=1", f"reward.reward_function={reward}:compute_score"), env)
    sums = json.load(open(logfile + ".1"))  # the rollout rank: the launch's last process
    assert len(sums) == 4 and sums[0] == sums[1] and len({sums[1], sums[2], sums[3]}) == 3


def test_ctrl_c_stops_every_process(tmp_path, tiny_model_dir, counting_dir):
    out = str(tmp_path / "run")
    cmd, env = _launch(2, _args(tiny_model_dir, counting_dir, out, *ASYNC, "trainer.max_steps=1000"))
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    metrics = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + 300
    while not (os.path.exists(metrics) and _rows(out)) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends: every process of the group
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("a process hangs after Ctrl-C")
    time.sleep(1)
    with pytest.raises(ProcessLookupError):  # no process of the launch is left
        os.killpg(proc.pid, 0)


# ---- rollout.partial_rollout ----

class _Engine:
    """Writes token 7 up to the budget; a request whose prompt (+ response so far) is a multiple of 5 long stops
    with EOS after its first token."""

    shares_train_model = False

    def __init__(self, eos):
        self.eos, self.calls = eos, []

    def generate(self, requests, sampling):
        from rllava.engine.inference.base import Completion

        self.calls.append((len(requests), sampling.max_new_tokens))
        out = []
        for r in requests:
            stop = len(r.prompt_ids) % 5 == 0
            ids = [7, self.eos] if stop and sampling.max_new_tokens > 1 else [7] * sampling.max_new_tokens
            out.append([Completion(ids, [-1.0] * len(ids), "stop" if ids[-1] == self.eos else "length")
                        for _ in range(sampling.n)])
        return out


def test_partial_rollouts_pause_and_continue(tiny_model_dir, counting_dir):
    from rllava.data.dataset import PromptDataset
    from rllava.engine.inference.base import SamplingParams
    from rllava.model.processor import get_tokenizer, load_processor
    from rllava.roles.rollout import PartialRollouts, Rollout

    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"data.train_files={counting_dir}/train.jsonl"])
    processor = load_processor(tiny_model_dir)
    data = PromptDataset(f"{counting_dir}/train.jsonl", cfg.data, processor)
    engine = _Engine(get_tokenizer(processor).eos_token_id)
    pool = PartialRollouts(Rollout(engine, processor), data, chunk=3, max_new_tokens=7)
    drawn = iter(range(0, 64, 4))
    draw = lambda: [data[i + j] for i in [next(drawn)] for j in range(4)]  # noqa: E731
    batches = [pool.next_batch(draw, SamplingParams(n=2, max_new_tokens=7), 4, version=v) for v in range(3)]
    for v, batch in enumerate(batches):
        assert sorted({t.group_id for t in batch}) == [0, 1, 2, 3] and len(batch) == 8
        for t in batch:  # complete: EOS, or the whole response budget in chunks of at most 3
            assert t.finish_reason == "stop" or t.num_response_tokens == 7
            assert all(len(s.token_ids) <= 3 for s in t.segments[1:])
            assert all(s.version <= v for s in t.segments[1:])
    versions = [{s.version for s in t.segments[1:]} for t in batches[1] + batches[2]]
    assert any(len(vs) > 1 for vs in versions)  # a response paused in one step, finished under newer weights
    assert all(n <= 8 for n, _ in engine.calls)  # at most 4 groups x 2 being written at a time
    # the pool as data, and back: the same responses
    state = pool.state_dict()
    again = PartialRollouts(Rollout(engine, processor), data, chunk=3, max_new_tokens=7)
    again.load_state_dict(json.loads(json.dumps(state)))
    assert again.state_dict() == state and [s.index for s in again.waiting] == [s.index for s in pool.waiting]
    assert [[t.response for t in g] for g in again.groups] == [[t.response for t in g] for g in pool.groups]


@pytest.mark.slow  # make test-slow (3 runs each)
@pytest.mark.parametrize("nproc", [1, 2])
def test_partial_rollouts_resume_exactly(tmp_path, tiny_model_dir, counting_dir, nproc):
    """Responses paused at the checkpoint come back with it: 4 steps straight = 2 steps + a resumed 2, in a
    synchronous run (1 process) and an asynchronous one (2: the rollout rank's paused responses travel to
    trainer 0's checkpoint)."""
    keys = ["rollout.partial_rollout=true", "rollout.partial_rollout_tokens=3", "trainer.save_freq=2",
            "actor.optim.lr_scheduler_type=constant", *([*ASYNC, "trainer.max_staleness=1"] if nproc > 1 else [])]
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    _run(nproc, _args(tiny_model_dir, counting_dir, straight, *keys))
    _run(nproc, _args(tiny_model_dir, counting_dir, split, *keys, "trainer.max_steps=2"))
    _run(nproc, _args(tiny_model_dir, counting_dir, split, *keys))
    rows = _rows(straight)
    assert max(r["async/staleness_max"] for r in rows) >= 1  # paused responses went on under newer weights
    assert max(r["async/staleness_max"] for r in rows) <= 1 and all("async/dropped_stale" in r for r in rows)
    _same(rows, _rows(split), skip=("timing/", "perf/", "time/"))
    a, b = load_file(f"{straight}/final/model.safetensors"), load_file(f"{split}/final/model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
