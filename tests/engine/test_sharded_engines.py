"""The sharded train engines on CPU (gloo, 2 ranks): FSDP2 and DeepSpeed ZeRO-2/3 (when installed). One step
matches a single process on the same global batch; a checkpoint written by 2 ranks loads in 1, on any engine;
the RLVR pipeline runs end to end under torchrun."""

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText
from rllava.train.outputs import keys_for

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "fsdp_worker.py")


def _run(nproc, *args, worker=WORKER):
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"] \
        if nproc > 1 else [sys.executable]
    res = subprocess.run([*launcher, worker, *map(str, args)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


def _result(path):
    return torch.load(os.path.join(path, "result.pt"))


DEEPSPEED = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                               reason="DeepSpeed not installed (pip install 'rllava[deepspeed]')")
# fsdp_worker.py's strategies: deepspeed{stage}[-offload] (ZeRO-Offload runs DeepSpeedCPUAdam)
# the DeepSpeed 2-rank runs and the ZeRO-Offload resume take the longest (~45-90 s): make test-slow runs them (the
# fast suite's 30-minute CI budget).
# fsdp2's 2-rank step against one process is also the fast test_actor_update_on_two_ranks_matches_one_process (the
# Actor role, image rows, packed micro-batches): this lighter engine-level twin is slow too (~30 s with its fixture)
SHARDED = [pytest.param("fsdp2", marks=pytest.mark.slow),
           pytest.param("deepspeed2", marks=[DEEPSPEED, pytest.mark.slow]),
           pytest.param("deepspeed3", marks=[DEEPSPEED, pytest.mark.slow])]


@pytest.fixture(scope="module")
def single_step(tmp_path_factory, tiny_model_dir):
    out = tmp_path_factory.mktemp("single")
    _run(1, tiny_model_dir, out, "single")
    return _result(out)


@pytest.mark.parametrize("strategy", SHARDED)
def test_two_ranks_match_one_process(tmp_path, tiny_model_dir, single_step, strategy):
    _run(2, tiny_model_dir, tmp_path / "fsdp", strategy)
    single, fsdp = single_step, _result(tmp_path / "fsdp")
    assert abs(single["loss"] - fsdp["loss"]) < 1e-5
    assert abs(single["grad_norm"] - fsdp["grad_norm"]) < 1e-4
    assert single["weights"].keys() == fsdp["weights"].keys()
    # Adam's first step is ~lr * sign(grad): a gradient within float noise of 0 may move a weight by up to
    # ~1e-4 either way, so weights are compared to 1% of lr (loss and grad norm above catch scaling errors).
    for k, v in single["weights"].items():
        torch.testing.assert_close(fsdp["weights"][k], v, rtol=1e-4, atol=1e-4, msg=k)


@pytest.mark.slow  # ~25 s: two torchrun ranks
def test_offload_with_prefetch_and_kept_units_matches_one_process(tmp_path, tiny_model_dir, single_step):
    """FSDP2 with CPU offload (RLLaVA's offload_params), actor.fsdp.forward_prefetch and keep_gathered_units=2, under
    gradient checkpointing, on 2 gloo ranks: the step of one process; each unit but the last prefetches the next;
    after the forward the last 2 units (and those alone) are still gathered, so the backward and its recompute do
    not gather them again; after the update every unit is sharded."""
    _run(2, tiny_model_dir, tmp_path / "fsdp", "fsdp2-offload-prefetch")
    single, fsdp = single_step, _result(tmp_path / "fsdp")
    assert abs(single["loss"] - fsdp["loss"]) < 1e-5
    assert abs(single["grad_norm"] - fsdp["grad_norm"]) < 1e-4
    for k, v in single["weights"].items():
        torch.testing.assert_close(fsdp["weights"][k], v, rtol=1e-4, atol=2e-4, msg=k)
    units = len(fsdp["gathered"])
    assert units >= 4 and fsdp["prefetch"] == [1] * (units - 1) + [0]
    assert fsdp["gathered"] == [False] * (units - 2) + [True, True]
    assert not any(fsdp["after"])


@pytest.mark.parametrize("strategy, resumed_on", [
    pytest.param("fsdp2", ["single"], id="fsdp2-to-single"),
    pytest.param("fsdp2", ["single", "fsdp2"], marks=pytest.mark.slow),
    pytest.param("deepspeed3-offload", ["single", "deepspeed2"], marks=[DEEPSPEED, pytest.mark.slow]),
    # ~45 s, and on a machine that never built DeepSpeed's ops ~70 s more (the shared-memory collectives' JIT
    # compile): the fast suite's 2-rank resume is fsdp2-to-single
    pytest.param("fsdp2", ["deepspeed3"], marks=[DEEPSPEED, pytest.mark.slow], id="fsdp2-to-deepspeed"),
    pytest.param("accelerate", ["single", "accelerate", "fsdp2"], marks=pytest.mark.slow, id="accelerate")])
def test_checkpoint_from_two_ranks_resumes_in_one(tmp_path, tiny_model_dir, strategy, resumed_on):
    """Engine state is saved by parameter name (`checkpoint.py`): a 2-rank checkpoint resumes in one process
    or two, on the same engine or another one (DeepSpeedCPUAdam's state in torch's AdamW, and back; Accelerate's
    in FSDP2)."""
    ckpt = tmp_path / "dcp"
    _run(2, tiny_model_dir, tmp_path / "a", strategy, "save_dcp", ckpt)
    first = _result(tmp_path / "a")
    results = []
    for i, engine in enumerate(resumed_on):  # resume the state and take the same second step
        _run(1 if i == 0 else 2, tiny_model_dir, tmp_path / f"r{i}", engine, "load_dcp", ckpt)
        results.append(_result(tmp_path / f"r{i}"))
    for resumed in results[1:]:
        for k, v in resumed["weights"].items():
            torch.testing.assert_close(results[0]["weights"][k], v, rtol=1e-4, atol=1e-4, msg=k)
    # the optimizer state came along, whole (a loader that silently skips it would still step)
    assert first["saved_moments"] > 0
    for resumed in results:
        assert abs(resumed["loaded_moments"] - first["saved_moments"]) < 1e-6 * first["saved_moments"]
        assert resumed["loss"] < first["loss"]  # the resumed step starts from the trained weights


@pytest.mark.parametrize("strategy", ["fsdp2", pytest.param("deepspeed3", marks=[DEEPSPEED, pytest.mark.slow])])
def test_actor_update_on_two_ranks_matches_one_process(tmp_path, tiny_model_dir, strategy):
    """The Actor role itself on a sharded engine: the training forward through the engine's forward method,
    image rows, dynamic packed micro-batches (equalised in count over ranks) and global loss normalisers."""
    worker = os.path.join(HERE, "actor_worker.py")
    _run(1, tiny_model_dir, tmp_path / "single", "single", worker=worker)
    _run(2, tiny_model_dir, tmp_path / "fsdp", strategy, worker=worker)
    single, fsdp = _result(tmp_path / "single"), _result(tmp_path / "fsdp")
    (full,) = single["old_logprobs"]
    for r, part in enumerate(fsdp["old_logprobs"]):  # rank r held rows 2r, 2r+1 (padded to their own length)
        torch.testing.assert_close(part, full[2 * r:2 * r + 2, :part.shape[1]], atol=1e-5, rtol=1e-5)
        assert full[2 * r:2 * r + 2, part.shape[1]:].abs().sum() == 0
    assert abs(single["grad_norm"] - fsdp["grad_norm"]) < 1e-4 * single["grad_norm"]
    for k, v in single["weights"].items():  # SGD at lr 1: the weights after the step are before - gradient
        torch.testing.assert_close(fsdp["weights"][k], v, rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("strategy,layout", [  # ~30 s each: make test-slow (the fast suite's 20-minute budget)
    pytest.param("fsdp2", "packed", marks=pytest.mark.slow), pytest.param("fsdp2", "padded", marks=pytest.mark.slow),
    pytest.param("deepspeed3", "padded", marks=[DEEPSPEED, pytest.mark.slow])])
def test_ulysses_on_two_ranks_matches_one_process(tmp_path, tiny_model_dir, strategy, layout):
    """actor.model.ulysses_size=2 (rllava.model.ulysses): both ranks train on the 4 rows, each on half of every
    sequence (image tokens split between them), attention over the whole sequence through the all-to-all, gradient
    checkpointing's recompute included; the old log-probs, the gradient norm and the weights after an SGD step
    (lr 1: the gradient) equal one process's on the same rows, padded or packed (float32 noise)."""
    worker = os.path.join(HERE, "actor_worker.py")
    _run(1, tiny_model_dir, tmp_path / "single", "single", "1", layout, worker=worker)
    _run(2, tiny_model_dir, tmp_path / "sp", strategy, "2", layout, worker=worker)
    single, sp = _result(tmp_path / "single"), _result(tmp_path / "sp")
    (full,) = single["old_logprobs"]
    for r, part in enumerate(sp["old_logprobs"]):  # rank r's own rows 2r, 2r+1: computed over both ranks' rows
        torch.testing.assert_close(part, full[2 * r:2 * r + 2, :part.shape[1]], atol=1e-5, rtol=1e-5)
    assert abs(single["grad_norm"] - sp["grad_norm"]) < 1e-5 * single["grad_norm"]
    for k, v in single["weights"].items():
        torch.testing.assert_close(sp["weights"][k], v, rtol=1e-5, atol=1e-6, msg=k)


def _same(a: dict, b: dict, what: str, skip=()) -> None:
    """Metrics `a` and `b` alike: the same names, each value within float32 noise."""
    assert a.keys() == b.keys(), (what, sorted(a.keys() ^ b.keys()))
    for k in sorted(set(a) - set(skip)):
        assert abs(a[k] - b[k]) <= 1e-5 * max(1.0, abs(a[k])), (what, k, a[k], b[k])


@pytest.mark.slow  # ~100 s (luffy), ~160 s (hpt): one process, then two ranks
@pytest.mark.parametrize("hybrid", ["luffy", "hpt"])
def test_ulysses_trains_a_hybrid_whose_expert_rows_are_all_on_one_rank(tmp_path, tiny_model_dir, hybrid):
    """actor.model.ulysses_size=2 when rank 1 holds every expert row and rank 0 none, so that collate leaves
    off_policy_mask and sft_only None on rank 0 and (luffy: nothing of rank 1's sampled) rollout_logprobs None on
    rank 1 (tests/engine/actor_worker.py `six_rows`): the step's loss, the weights after it and every logged
    per-token metric (LUFFY's off-policy ones and its rollout IS, HPT's SFT NLL) are one process's on the same 6 rows,
    as verl's Ulysses group trains on every field of its ranks' rows (volcengine/verl@b178a3c
    verl/workers/sharding_manager/fsdp_ulysses.py L52-62, protocol.py L1242-1253: all-gathered, each rank's tensors
    all present); one process's numbers are the references' (LUFFY's mix_core_alg.py L59-155, HPT's mix_actor.py
    L135-165: tests/algorithms/test_parity_hybrids.py). Before, union took rank 0's None:
    HPT's SFT term vanished; LUFFY's run died in it (rank 0's rollout log-probs beside rank 1's None). HPT also on
    two data-parallel ranks (ulysses_size=1): before, rank 0 counted no SFT normalisers and the all-reduce hung."""
    worker = os.path.join(HERE, "actor_worker.py")
    _run(1, tiny_model_dir, tmp_path / "single", "single", "1", "padded", hybrid, worker=worker)
    single = _result(tmp_path / "single")
    assert {"hpt": "actor/sft_nll", "luffy": "actor/off_policy_prob"}[hybrid] in single["metrics"]
    for sp in ("2", "1") if hybrid == "hpt" else ("2",):
        _run(2, tiny_model_dir, tmp_path / sp, "fsdp2", sp, "padded", hybrid, worker=worker)
        got = _result(tmp_path / sp)
        assert abs(got["loss"] - single["loss"]) < 1e-5 * abs(single["loss"]), (sp, got["loss"], single["loss"])
        for k, v in single["weights"].items():  # SGD at lr 1: the weights after the step are before - gradient
            torch.testing.assert_close(got["weights"][k], v, rtol=1e-4, atol=1e-6, msg=k)
        if sp == "2":  # (a logged loss is a mean over each rank's micro-batches: see the next test)
            _same(single["metrics"], got["metrics"], hybrid, skip=["actor/pg_loss"])


@pytest.mark.slow  # ~130 s: two runs on two ranks
def test_ulysses_logs_the_actor_metrics_of_sp1(tmp_path, tiny_model_dir):
    """actor.model.ulysses_size=2 logs what the same two ranks log at size 1, actor/pg_loss too (0.026 here; the
    group's 6 micro-batches were each a share of a normaliser 2 x as large, where each rank ran 3: it was logged at
    1/2), as verl logs the same metrics with or without sequence parallelism (volcengine/verl@b178a3c
    verl/workers/actor/dp_actor.py L662, no factor of ulysses_sequence_parallel_size): PPO on `six_rows`, 3
    micro-batches of a row per rank. (test_ulysses_pipeline_takes_the_steps_of_sp1: the group's rows in one
    micro-batch, as each rank's were: x 1, not x 2.)"""
    worker = os.path.join(HERE, "actor_worker.py")
    runs = {}
    for sp in ("1", "2"):
        _run(2, tiny_model_dir, tmp_path / sp, "fsdp2", sp, "padded", "ppo", worker=worker)
        runs[sp] = _result(tmp_path / sp)["metrics"]
    assert abs(runs["1"]["actor/pg_loss"]) > 1e-2
    _same(runs["1"], runs["2"], "sp=2 against sp=1")


def _rlvr_on_ranks(nproc: int, out, model: str, reward: str, *extra: str) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=nproc -m rllava.train.pipeline.rlvr` on the tiny counting config: 4 prompts a
    step, 2 per mini-batch, 2 steps, KL in the loss, one metrics file; `extra` keys last."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m",
           "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
           f"actor.model.model_path={model}", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2",
           "trainer.max_steps=2", *keys_for(out), "trainer.logger=[jsonl]", "algorithm.use_kl_loss=true",
           "actor.kl_loss_coef=0.1", f"reward.reward_function={reward}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


# the two DeepSpeed pipelines and the hybrids' and reset's (~20 s each) run in make test-slow: the fast suite's budget
@pytest.mark.parametrize("nproc, strategy", [
    (2, ["actor.strategy=fsdp2", "actor.fsdp.use_orig_params=true", "actor.fsdp.offload_params=true"]),  # warnings
    pytest.param(2, ["actor.strategy=fsdp2", "algorithm.ref_reset_freq=1", "actor.ppo_mini_batch_size=4"],
                 marks=pytest.mark.slow, id="fsdp2-ref-reset"),
    pytest.param(2, ["actor.strategy=fsdp2", "algorithm.strategy=mix_chord", "data.target_key=solution",
                     "data.expert_batch_size=2", "algorithm.mu_warmup_steps=0"], marks=pytest.mark.slow,
                 id="fsdp2-chord"),
    pytest.param(2, ["actor.strategy=fsdp2", "actor.policy_loss.loss_mode=hpt", "algorithm.unify_strategy=switch",
                     "data.target_key=solution", "actor.ppo_micro_batch_size=2", "algorithm.switch_gate=1"],
                 marks=pytest.mark.slow, id="fsdp2-hpt"),
    pytest.param(2, ["actor.strategy=accelerate"], id="accelerate"),  # on CPUs Accelerate's DDP
    pytest.param(2, ["actor.strategy=deepspeed", "actor.deepspeed.zero_stage=3", "actor.deepspeed.torch_dtype=fp32"],
                 marks=[DEEPSPEED, pytest.mark.slow], id="deepspeed"),
    pytest.param(1, ["actor.strategy=deepspeed", "actor.deepspeed.zero_stage=2", "algorithm.adv_estimator=gae",
                     "critic.strategy=deepspeed", "critic.deepspeed.zero_stage=3"],
                 marks=[DEEPSPEED, pytest.mark.slow], id="deepspeed-one-process-ppo-critic")])
def test_rlvr_pipeline_on_two_ranks(tmp_path, tiny_model_dir, counting_dir, distinct_reward, nproc, strategy):
    """`torchrun --nproc_per_node=2 -m rllava.train.pipeline.rlvr actor.strategy=...` end to end on CPU (gloo):
    KL to a sharded reference, HF generate on gathered weights, validation sharded over the ranks and
    gathered, one metrics file, one `final/` that plain transformers loads. (And DeepSpeed in one process,
    with a DeepSpeed critic.)"""
    out = tmp_path / "run"
    res = _rlvr_on_ranks(nproc, out, tiny_model_dir, distinct_reward, f"data.train_files={counting_dir}/train.jsonl",
                         f"data.val_files={counting_dir}/val.jsonl", "data.max_samples=16", "rollout.n=4",
                         "trainer.val_freq=2", "data.val_batch_size=8", "trainer.val_generations_to_log=1000",
                         *strategy)
    assert res.returncode == 0, res.stderr[-3000:]
    if "actor.fsdp.offload_params=true" in strategy:  # rank 0 alone says each warning and the end (issue 49)
        said = [line for line in res.stderr.splitlines() if "_params" in line]
        assert [line.split(" has no effect")[0] for line in said] == [  # offload_params: FSDP2's CPU offload
            "rllava: warning: actor.fsdp.use_orig_params=true"]
        assert res.stdout.count("done in") == 1 and res.stderr.count("Loading weights: 100%") == 2  # actor, ref
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]  # rank 0 alone writes
    assert all(r["actor/kl_loss"] >= 0 and "actor/grad_norm" in r for r in rows if "reward/mean" in r)
    if "algorithm.strategy=mix_chord" in strategy:  # each rank trained on its share of the demonstrations
        assert all(r["hybrid/expert_rows"] == 1 and r["actor/sft_nll"] > 0 for r in rows if "reward/mean" in r)
    if "algorithm.ref_reset_freq=1" in strategy:  # each rank's reference shards are its policy shards of the last
        # step, and one mini-batch per step starts from the policy that sampled: KL 0 (without the reset: > 0)
        assert [(r["ref/last_reset_step"], r["actor/kl_loss"] < 1e-9) for r in rows if "reward/mean" in r] == [
            (1, True), (2, True)]
    if "critic.strategy=deepspeed" in strategy:  # the value head (zero at the start) has learnt something
        assert [r["critic/vpred_mean"] != 0 for r in rows if "reward/mean" in r] == [False, True]
    generations = [json.loads(line) for line in open(out / "val_generations.jsonl")]
    for step in (0, 2):  # every held-out prompt, x n samples, from the two ranks' shares
        indices = sorted(g["index"] for g in generations if g["step"] == step)
        assert indices == sorted(list(range(16)) * 2)
    before = load_file(os.path.join(tiny_model_dir, "model.safetensors"))
    after = load_file(out / "final" / "model.safetensors")
    assert before.keys() == after.keys() and sum(not torch.equal(before[k], after[k]) for k in before) > len(before) // 2
    AutoModelForImageTextToText.from_pretrained(out / "final")


@pytest.mark.parametrize("strategy", [["actor.strategy=fsdp2"],
                                      pytest.param(["actor.strategy=deepspeed", "actor.deepspeed.zero_stage=3",
                                                    "actor.deepspeed.torch_dtype=fp32"],
                                                   marks=[DEEPSPEED, pytest.mark.slow])],  # 75 s: make test-slow
                         ids=["fsdp2", "deepspeed3"])
def test_text_only_and_image_records_mixed_over_two_ranks(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                          strategy):
    """Math sets mix text-only and image records: rank 0's prompts hold images, rank 1's none (contiguous shares,
    no shuffle). Each rank must run the same collectives, the vision tower's included (a rank without an image
    runs it on the smallest input, times 0): without that, gloo stops at the first step with `Received data size
    doesn't match expected size` (NCCL hangs)."""
    records = [json.loads(line) for line in open(os.path.join(counting_dir, "train.jsonl"))][:16]
    with open(tmp_path / "mixed.jsonl", "w") as f:
        for i, r in enumerate(records):
            if i % 4 < 2:  # images: absolute paths
                r = {**r, "images": [os.path.join(counting_dir, x) for x in r["images"]]}
            else:  # text only
                r = {**r, "images": [], "problem": r["problem"].replace("<image>", "")}
            f.write(json.dumps(r) + "\n")
    out = tmp_path / "run"
    res = _rlvr_on_ranks(2, out, tiny_model_dir, distinct_reward, f"data.train_files={tmp_path}/mixed.jsonl",
                         "data.val_files=null", "data.shuffle=false", "rollout.n=2", "trainer.val_freq=-1",
                         "trainer.val_before_train=false", *strategy)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]


def test_deepspeed_not_installed_is_one_line_error(monkeypatch):
    from rllava.config.schema import DeepSpeedConfig
    from rllava.engine.train.deepspeed import DeepSpeedEngine
    from rllava.errors import ConfigError

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` raises ImportError
    with pytest.raises(ConfigError, match=r'^actor.strategy=deepspeed needs DeepSpeed: pip install "rllava\[deepspeed\]"'):
        DeepSpeedEngine(torch.device("cpu"), 1.0, deepspeed_config=DeepSpeedConfig())


@pytest.mark.slow  # ~40 s: four models built and run on two ranks
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_ulysses_equals_the_whole_sequence_on_every_vlm_family(tmp_path, attn):
    """Qwen2.5-VL (M-RoPE), Qwen3-VL (deepstack features at image positions split over the ranks), the modular
    VLM and a text-only LM: log-probs, entropy and gradients with ulysses_size=2 equal the whole sequence's in
    float64 (tests/engine/ulysses_worker.py), padded and packed, under sdpa and eager attention."""
    from rllava.model.tiny import build_tiny

    paths = [build_tiny(arch, str(tmp_path / arch), size="small") for arch in
             ("qwen2_5_vl", "qwen3_vl", "tinyllava", "qwen2")]
    _run(2, tmp_path / "out.json", attn, *paths, worker=os.path.join(HERE, "ulysses_worker.py"))
    results = json.load(open(tmp_path / "out.json"))
    assert len(results) == 8
    for name, r in results.items():
        # eager's embedding gradient moves by ~1e-8 of the largest (summation order over split rows; sdpa: 1e-15)
        assert r["same_params"] and r["logprob"] < 1e-12 and r["grad"] < (1e-6 if attn == "eager" else 1e-12), \
            (name, r)


@pytest.mark.slow  # ~30 s each: two 3-step runs on two ranks
@pytest.mark.parametrize("critic", [False, True])
def test_ulysses_pipeline_takes_the_steps_of_sp1(tmp_path, tiny_model_dir, counting_dir, distinct_reward, critic):
    """`torchrun --nproc_per_node=2 ... actor.model.ulysses_size=2`: 3 steps with the KL's reference and gradient
    checkpointing (or PPO's critic, critic.model.ulysses_size=2 too) give the metrics of the same two ranks at
    ulysses_size=1 (each rank samples the same prompts: only the training passes are split, by rows there, by
    sequence here)."""
    data = [f"data.train_files={counting_dir}/train.jsonl", "data.max_samples=12", "rollout.n=2",
            "trainer.val_before_train=false", "trainer.val_freq=-1", "trainer.max_steps=3",
            "actor.strategy=fsdp2", "actor.model.enable_gradient_checkpointing=true"]
    keys = ["reward/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "response_length/mean"]
    if critic:
        data += ["algorithm.adv_estimator=gae", f"critic.model.model_path={tiny_model_dir}", "critic.strategy=fsdp2",
                 "critic.optim.lr=1e-3"]
        keys += ["critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"]
    runs = {}
    for sp in (1, 2):
        res = _rlvr_on_ranks(2, tmp_path / f"sp{sp}", tiny_model_dir, distinct_reward, *data,
                             f"actor.model.ulysses_size={sp}", *([f"critic.model.ulysses_size={sp}"] * critic))
        assert res.returncode == 0, res.stderr[-3000:]
        runs[sp] = [json.loads(line) for line in open(tmp_path / f"sp{sp}" / "metrics.jsonl")]
    assert [r["step"] for r in runs[2]] == [1, 2, 3]
    for a, b in zip(runs[1], runs[2], strict=True):
        for key in keys + ([] if critic else ["actor/kl_loss"]):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (a["step"], key, a[key], b[key])


@pytest.mark.slow
def test_accelerate_matches_fsdp2_and_starts_under_accelerate_launch(tmp_path, tiny_model_dir, counting_dir,
                                                                     distinct_reward):
    """actor.strategy=accelerate (Accelerate's DDP on CPUs) takes the 3 steps FSDP2 takes on the same two ranks
    (metrics, and the final weights within 1e-4), and `accelerate launch -m rllava.train.pipeline.rlvr` starts it
    as torchrun does."""
    data = [f"data.train_files={counting_dir}/train.jsonl", "data.max_samples=8", "rollout.n=2",
            "trainer.val_before_train=false", "trainer.val_freq=-1"]
    runs = {}
    for strategy in ("fsdp2", "accelerate"):
        res = _rlvr_on_ranks(2, tmp_path / strategy, tiny_model_dir, distinct_reward, *data,
                             f"actor.strategy={strategy}", "trainer.max_steps=3", "data.max_samples=12")
        assert res.returncode == 0, res.stderr[-3000:]
        runs[strategy] = [json.loads(line) for line in open(tmp_path / strategy / "metrics.jsonl")]
    assert [r["step"] for r in runs["accelerate"]] == [1, 2, 3]
    for a, b in zip(runs["fsdp2"], runs["accelerate"], strict=True):
        for key in ("reward/mean", "actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "response_length/mean"):
            assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (key, a[key], b[key])
    weights = [load_file(tmp_path / s / "final" / "model.safetensors") for s in ("fsdp2", "accelerate")]
    for k, v in weights[0].items():
        torch.testing.assert_close(weights[1][k], v, rtol=1e-4, atol=1e-4, msg=k)
    out = tmp_path / "launched"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "rllava.train.pipeline.rlvr",
           "config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
           "trainer.max_steps=1", "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", *data, *keys_for(out),
           "trainer.logger=[jsonl]", f"reward.reward_function={distinct_reward}", "actor.strategy=accelerate"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert [json.loads(line)["step"] for line in open(out / "metrics.jsonl")] == [1]


def _accelerate_config(path, mixed_precision: str = "bf16"):
    """An `accelerate config` file for Accelerate's FSDP2 plugin, its layers wrapped by class (`_no_split_modules`)."""
    path.write_text(f"compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: '{mixed_precision}'"
                    "\nnum_processes: 2\nnum_machines: 1\nfsdp_config:\n  fsdp_version: 2\n"
                    "  fsdp_reshard_after_forward: true\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
    return path


def test_accelerate_config_file_becomes_accelerates_environment(tmp_path, monkeypatch):
    """trainer.accelerate_config: the file `accelerate config` writes, turned into the environment `accelerate
    launch --config_file` would give (Accelerate's own launcher code); a missing file is one line; Accelerate's
    DeepSpeed plugin is refused naming where its config came from (Accelerate picks it on GPUs only: stubbed)."""
    import accelerate

    from rllava.config import load_config
    from rllava.engine.train.accelerate import AccelerateEngine, accelerate_env
    from rllava.errors import ConfigError

    path = _accelerate_config(tmp_path / "fsdp2.yaml")
    env = accelerate_env(str(path))
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_VERSION"] == "2", env
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16", env
    with pytest.raises(ConfigError, match="trainer.accelerate_config=.*no such file"):
        accelerate_env(str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="trainer.accelerate_config is read by actor.strategy=accelerate only"):
        load_config([f"trainer.accelerate_config={path}"])  # a key that would do nothing is a start-up error
    with pytest.warns(UserWarning, match=r"actor.fsdp.offload_params, actor.fsdp.reshard_after_forward ignored: "
                                         "actor.strategy=accelerate"):  # Accelerate's config holds its FSDP keys
        load_config(["actor.strategy=accelerate", "actor.fsdp.offload_params=true",
                     "actor.fsdp.reshard_after_forward=false"])
    monkeypatch.setattr(accelerate, "Accelerator", lambda **kw: types.SimpleNamespace(state=types.SimpleNamespace(
        distributed_type=types.SimpleNamespace(value="DEEPSPEED"))))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # accelerate_env's variables stay in this test
    for config, source in ((None, "accelerate launch's"), (str(path), "trainer.accelerate_config's")):
        with pytest.raises(ConfigError, match=f"^{source} config: Accelerate's DeepSpeed plugin .* actor.strategy="
                                              "deepspeed"):
            AccelerateEngine(torch.device("cpu"), 1.0, config_file=config)


def test_accelerate_refuses_fp16_and_fsdp1(tmp_path, monkeypatch):
    """Accelerate's fp16 is autocast plus a GradScaler that scales the loss in `accelerator.backward` and unscales
    it before clipping and stepping (accelerate 1.15 accelerator.py L565-584, L2856-2857, L2946-2955); rllava runs
    its own backward and step, so fp16 would train unscaled fp16 gradients: refused in one line naming the setting
    and bf16 (before: accepted; on CPU Accelerate itself runs fp16 without autocast, silently fp32). FSDP1
    (`fsdp_version` absent: Accelerate's default, 1) is refused the same way: the FSDP2 engine's rollout and state
    dicts do not serve its flat parameters (Accelerate picks FSDP on GPUs only: stubbed, its plugin real)."""
    import accelerate
    from accelerate.state import AcceleratorState
    from accelerate.utils import FullyShardedDataParallelPlugin

    from rllava.engine.train.accelerate import AccelerateEngine
    from rllava.errors import ConfigError

    monkeypatch.setattr(os, "environ", dict(os.environ))
    try:
        with pytest.raises(ConfigError, match="^trainer.accelerate_config's config: mixed_precision: fp16 .* "
                                              "use mixed_precision: bf16$"):
            AccelerateEngine(torch.device("cpu"), 1.0,
                             config_file=str(_accelerate_config(tmp_path / "fp16.yaml", "fp16")))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)  # Accelerate's process-wide state: as it was
    fsdp1 = tmp_path / "fsdp1.yaml"
    fsdp1.write_text(_accelerate_config(tmp_path / "x.yaml").read_text().replace(  # (FSDP1's sync needs a GPU)
        "  fsdp_version: 2\n", "  fsdp_sync_module_states: false\n  fsdp_cpu_ram_efficient_loading: false\n"))
    monkeypatch.setattr(accelerate, "Accelerator", lambda **kw: types.SimpleNamespace(mixed_precision="bf16",
        state=types.SimpleNamespace(distributed_type=types.SimpleNamespace(value="FSDP"),
                                    fsdp_plugin=FullyShardedDataParallelPlugin())))
    with pytest.raises(ConfigError, match="^trainer.accelerate_config's config: fsdp_version 1 .* "
                                          "set fsdp_config.fsdp_version: 2$"):
        AccelerateEngine(torch.device("cpu"), 1.0, config_file=str(fsdp1))


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_accelerate_fsdp2_rolls_out_trains_and_saves_as_the_unsharded_model(tmp_path, tiny_model_dir, nproc):
    """actor.strategy=accelerate with Accelerate's FSDP2 plugin, prepared by Accelerate's own code on CPU
    (accelerate_worker.py), against the same model unsharded: HF generate's greedy tokens and their log-probs,
    before and after an SGD step; the old log-probs, the gradient norm and the trained weights; the checkpoint's.
    Before: the first rollout died in `aten.convolution got mixed torch.Tensor and DTensor`: rollout_phase
    gathered the units inside the inner model, not the root Accelerate shards (rllava's LogprobForward, which
    holds the patch embedding, the embeddings and the head). Accelerate's wrap policy reads the root's
    `_no_split_modules` (accelerate 1.15 utils/fsdp_utils.py L941-946, then fully_shard per match L853-855 and on
    the root L881-885): the decoder layers and vision blocks are units (before: none, one unit for the model).
    After the rollout the root stays gathered after a forward, as Accelerate sets it (L881-885), the units not."""
    from rllava.engine.train.checkpoint import load_weights

    _run(nproc, tiny_model_dir, tmp_path, _accelerate_config(tmp_path / "fsdp2.yaml", "no"),
         worker=os.path.join(HERE, "accelerate_worker.py"))
    result = _result(tmp_path)
    single, acc = result["single"], result["accelerate"]
    assert acc["units"] == ["", "model.model.language_model.layers.0", "model.model.language_model.layers.1",
                            "model.model.visual.blocks.0", "model.model.visual.blocks.1"]
    assert acc["sharded after a forward"] == (False, True)
    assert not torch.equal(single["first"][0], single["second"][0])  # the step changed a response
    for rollout in ("first", "second"):  # (tokens, their log-probs)
        assert torch.equal(acc[rollout][0], single[rollout][0]), rollout
        torch.testing.assert_close(acc[rollout][1], single[rollout][1], atol=1e-5, rtol=0)
    torch.testing.assert_close(acc["old"], single["old"], atol=1e-5, rtol=0)
    assert abs(acc["grad_norm"] - single["grad_norm"]) < 1e-4 * single["grad_norm"]
    saved = {k: torch.zeros_like(v) for k, v in single["weights"].items()}
    load_weights(saved, str(tmp_path / "dcp"))  # the inner model's names: a checkpoint of any engine
    for k, v in single["weights"].items():
        torch.testing.assert_close(acc["weights"][k], v, rtol=1e-5, atol=1e-6, msg=k)
        torch.testing.assert_close(saved[k], v, rtol=1e-5, atol=1e-6, msg=k)
