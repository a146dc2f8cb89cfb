"""The Reference role: resets to the policy (algorithm.ref_reset_freq) on every engine, the full-vocabulary KL
(algorithm.kl_penalty=full, actor.kl_loss_type=full) on a tiny model, and the start-up errors of both."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForImageTextToText

from rllava.config import ConfigError, load_config
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.model.forward import model_inputs, token_logprobs
from rllava.model.loader import load_frozen
from rllava.roles.batching import MicroBatching, compute_logprobs
from rllava.roles.reference import Reference
from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _model(path):
    return AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)


def _batch(vocab: int):
    """Text-only rows of different lengths, two groups of two sharing a prompt (what shared_prefix runs once),
    then trained response tokens."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(20, vocab, (p,), generator=g).tolist() for p in (5, 12)]
    rows = [(0, 9), (0, 2), (1, 6), (1, 14)]
    return collate([Trajectory(Sample(k, [], [], None), k, [
        Segment(prompts[k], trained=False),
        Segment(torch.randint(20, vocab, (r,), generator=g).tolist(), trained=True)], {})
        for k, r in rows], pad_token_id=0)


@torch.no_grad()
def _nudge(model, seed):
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_reset_makes_the_reference_the_policy_every_k_steps(tiny_model_dir):
    """After the update of step k j the reference computes exactly the policy's log-probs; before it, and
    after the policy moves on, it does not (single-device engine)."""
    policy = _model(tiny_model_dir)
    batching = MicroBatching(3)
    ref = Reference(load_frozen(None, torch.device("cpu"), key="ref", copy_of=policy), batching, 1.0,
                    reset_freq=2)
    batch = _batch(policy.get_output_embeddings().weight.shape[0])

    def same():
        return torch.equal(ref.compute_logprobs(batch), compute_logprobs(policy, batch, batching, 1.0))

    assert same()  # at the start: the policy's own starting weights
    _nudge(policy, 1)  # the update of step 1
    assert ref.after_update(policy, 1) == {"ref/last_reset_step": 0.0} and not same()
    _nudge(policy, 2)  # step 2: a reset after its update
    assert ref.after_update(policy, 2) == {"ref/last_reset_step": 2.0} and same()
    reference_of_step_2 = ref.compute_logprobs(batch)
    _nudge(policy, 3)  # step 3 moves the policy, not the reference
    assert ref.after_update(policy, 3) == {"ref/last_reset_step": 2.0} and not same()
    assert torch.equal(ref.compute_logprobs(batch), reference_of_step_2)
    assert Reference(policy, batching, 1.0).after_update(policy, 2) == {}  # reset_freq 0: frozen, nothing logged


def _run(out, model, data, reward, *extra, strategy="single"):
    """A short RLVR run in its own process (FSDP2 as a world of one; DeepSpeed under torchrun), one mini-batch
    per step: the update starts from the policy that sampled, so KL(policy || reference) is 0 exactly when the
    reference is that policy."""
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"] if strategy == "deepspeed" else []
    cmd = [sys.executable, *launch, "-m", "rllava.train.pipeline.rlvr", "config=examples/tasks/counting/tiny_cpu.yaml",
           f"actor.model.model_path={model}", f"data.train_files={data}/train.jsonl", "data.max_samples=16",
           "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4", "trainer.val_before_train=false",
           "trainer.val_freq=-1", *keys_for(out), "trainer.logger=[jsonl]", "actor.optim.lr=3e-3",
           f"reward.reward_function={reward}", f"actor.strategy={strategy}", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]


@pytest.mark.parametrize("strategy", [
    # all slow (single ~20 s): the fast suite resets the reference in test_resume_between_reference_resets_is_exact
    pytest.param("single", marks=pytest.mark.slow), pytest.param("fsdp2", marks=pytest.mark.slow),
    pytest.param("deepspeed", marks=[pytest.mark.slow, pytest.mark.skipif(
        not __import__("importlib").util.find_spec("deepspeed"), reason="DeepSpeed not installed")])])
def test_reset_on_every_engine(tmp_path, tiny_model_dir, counting_dir, distinct_reward, strategy):
    """ref_reset_freq=2 over 4 steps: step 2 runs against the starting weights (KL > 0: step 1 moved the policy),
    step 3 against the policy of step 2 (KL = 0), step 4 against it still (KL > 0) - on one device, FSDP2 and
    DeepSpeed ZeRO-3. Resumed from the checkpoint of step 3, step 4 is the same (the reference is saved)."""
    extra = ["trainer.max_steps=4", "trainer.save_freq=3", "algorithm.use_kl_loss=true", "actor.kl_loss_coef=0.1",
             "algorithm.ref_reset_freq=2"]
    if strategy == "deepspeed":
        extra += ["actor.deepspeed.zero_stage=3", "actor.deepspeed.torch_dtype=fp32", "actor.deepspeed.enable_cpu_offload=false"]
    run = tmp_path / "run"
    rows = _run(run, tiny_model_dir, counting_dir, distinct_reward, *extra, strategy=strategy)
    assert [r["ref/last_reset_step"] for r in rows] == [0, 2, 2, 4]
    kl = [r["actor/kl_loss"] for r in rows]
    assert kl[0] < 1e-9 and kl[1] > 1e-6 and kl[2] < 1e-9 and kl[3] > 1e-6, kl
    resumed = _run(tmp_path / "resumed", tiny_model_dir, counting_dir, distinct_reward, *extra,
                   f"trainer.resume={run}/checkpoints/global_step_3", strategy=strategy)
    assert [r["step"] for r in resumed] == [4] and resumed[0]["actor/kl_loss"] == pytest.approx(kl[3], rel=1e-5)


def test_full_kl_gradient_matches_dense_logits_on_a_tiny_model(tiny_model_dir):
    """The training forward's full-vocabulary KL (chunked, the reference's hidden states from its own forward)
    equals sum_v p (log p - log q) on the models' full logits, in value and in every parameter's gradient."""
    policy, ref_model = _model(tiny_model_dir).train(), _model(tiny_model_dir)
    _nudge(ref_model, 0)
    batch = _batch(policy.get_output_embeddings().weight.shape[0])
    ref = Reference(ref_model, MicroBatching(4), 0.7)
    target = batch.loss_mask[:, 1:] > 0
    weights = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(3))

    def grads(kl):
        policy.zero_grad(set_to_none=True)
        (kl * weights * batch.loss_mask).sum().backward()
        return {n: p.grad.clone() for n, p in policy.named_parameters() if p.grad is not None}

    for layout in ({}, {"padding_free": True}, {"shared_prefix": True}):
        ref.batching = MicroBatching(4, **layout)
        _, _, kl = token_logprobs(policy, batch, temperature=0.7, chunk_size=5, ref_hidden=[ref.hidden(batch)],
                                  **layout)
        logp = torch.log_softmax(policy(**model_inputs(policy, batch)).logits[:, :-1].float() / 0.7, -1)
        with torch.no_grad():
            logq = torch.log_softmax(ref_model(**model_inputs(ref_model, batch)).logits[:, :-1].float() / 0.7, -1)
        dense = torch.zeros_like(kl)
        dense[:, 1:][target] = (logp.exp() * (logp - logq)).sum(-1)[target]
        torch.testing.assert_close(kl, dense, atol=1e-5, rtol=1e-4)
        assert (kl[batch.loss_mask > 0] > 0).all() and (kl[batch.loss_mask == 0] == 0).all()
        got, want = grads(kl), grads(dense)
        assert got.keys() == want.keys() and len(got) > 10
        for name in got:
            torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)
        assert all(p.grad is None for p in ref_model.parameters())


@pytest.mark.parametrize("extra", [[], pytest.param(["actor.model.use_peft=true", "actor.model.lora_r=4",
                                                      "actor.model.lora_alpha=8"], marks=pytest.mark.slow)],
                         ids=["full-weights", "lora"])
def test_full_kl_in_the_loss_and_in_the_reward(tmp_path, tiny_model_dir, counting_dir, distinct_reward, extra):
    """actor.kl_loss_type=full and algorithm.kl_penalty=full for 2 steps: both are 0 at step 1 (the reference is
    the policy that sampled) and positive at step 2; under LoRA the reference is the adapter-free base."""
    rows = _run(tmp_path / "run", tiny_model_dir, counting_dir, distinct_reward, "trainer.max_steps=2",
                "algorithm.use_kl_loss=true", "actor.kl_loss_coef=0.1", "actor.kl_loss_type=full",
                "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full", "actor.logprob_chunk_size=16", *extra)
    kl_loss, reward_kl = [r["actor/kl_loss"] for r in rows], [r["actor/reward_kl"] for r in rows]
    assert kl_loss[0] < 1e-6 and reward_kl[0] < 1e-6 and kl_loss[1] > 1e-5 and reward_kl[1] > 1e-5, rows


@pytest.mark.parametrize("args, message", [
    (["algorithm.ref_reset_freq=3"], "algorithm.ref_reset_freq=3 resets the reference policy, but this run has none"),
    (["algorithm.ref_reset_freq=3", "algorithm.use_kl_loss=true", "actor.kl_loss_coef=0"],
     "algorithm.ref_reset_freq=3 resets the reference policy, but this run has none"),
    (["algorithm.ref_reset_freq=-1"], "algorithm.ref_reset_freq=-1 must be >= 0"),
    (["algorithm.ref_reset_freq=2", "algorithm.use_kl_in_reward=true", "actor.model.use_peft=true"],
     "algorithm.ref_reset_freq=2 with actor.model.use_peft=true"),
    (["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full", "actor.strategy=fsdp2"],
     "algorithm.kl_penalty=full with actor.strategy=fsdp2 (the fsdp2 engine)"),
    (["algorithm.use_kl_loss=true", "actor.kl_loss_type=full", "actor.strategy=deepspeed"],
     "actor.kl_loss_type=full with actor.strategy=deepspeed (the deepspeed engine)"),
])
def test_start_up_errors(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(["config=examples/tasks/counting/tiny_cpu.yaml", *args])


def test_reset_into_a_reference_of_another_shape_is_a_start_up_error(tmp_path, tiny_model_dir):
    from rllava.model.tiny import build_tiny
    from rllava.train.builders import build_reference_role

    other = build_tiny("qwen2_vl", str(tmp_path / "other"), size="demo")
    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", "algorithm.use_kl_in_reward=true",
                       "algorithm.ref_reset_freq=2", f"ref.model_path={other}"])
    with pytest.raises(ConfigError, match=f"ref.model_path={other} has other weights"):
        build_reference_role(cfg, _model(tiny_model_dir), torch.device("cpu"))
