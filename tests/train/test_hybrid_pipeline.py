"""SFT+RL hybrids in the RLVR step (rllava.train.hybrid_step): where the expert tokens come from, the rollout that
continues them, HPT's switch, CHORD's demonstration rows, a 2-step run of each method, exact resume, bad keys."""

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

from rllava.algorithms.hybrid import chunk_bounds
from rllava.config import ConfigError, load_config
from rllava.data.dataset import PromptDataset
from rllava.data.protocol import collate
from rllava.engine.inference.base import Completion, SamplingParams
from rllava.model.processor import get_tokenizer, load_processor
from rllava.roles.rollout import Rollout
from rllava.train.hybrid_step import Hybrid, expert_rows_per_step
from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

METHODS = {  # the keys of examples/algorithms/<name>.sh, on a 4-step budget
    "luffy": ["actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random", "algorithm.min_prefix_ratio=1.0",
              "algorithm.n_prefix=1", "actor.off_policy_reshape=p_div_p_0.1", "actor.loss_remove_clip=true",
              "actor.loss_agg_mode=seq-mean-token-sum-norm", "algorithm.norm_adv_by_std_in_grpo=false"],
    "srft": ["actor.policy_loss.loss_mode=srft", "algorithm.prefix_strategy=random", "algorithm.min_prefix_ratio=1.0",
             "algorithm.n_prefix=1"],
    "uft": ["actor.policy_loss.loss_mode=uft", "algorithm.prefix_strategy=hint", "algorithm.hint_steps=3",
            "algorithm.max_prefix_ratio=0.95", "algorithm.min_prefix_ratio=0.05",
            "algorithm.prefix_share_across_samples=true", "actor.sft_loss_coef=0.001"],
    "hpt": ["actor.policy_loss.loss_mode=hpt", "algorithm.unify_strategy=switch", "algorithm.switch_gate=0"],
    "chord": ["algorithm.strategy=mix_chord", "algorithm.mu_warmup_steps=1", "algorithm.mu_decay_steps=2",
              "algorithm.mu_peak=0.9", "algorithm.mu_valley=0.05", "algorithm.expert_data_ratio=0.2"],
    "chord_phi": ["actor.policy_loss.loss_mode=chord", "algorithm.mu_warmup_steps=0", "algorithm.mu_decay_steps=0",
                  "algorithm.mu_peak=0.1", "algorithm.mu_valley=0.1", "algorithm.enable_phi_function=true"],
}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.fixture
def answer_reward(tmp_path):
    """1 for `<answer>N</answer>` with the right N (the counting records' `solution` earns it), else 0."""
    path = tmp_path / "answer.py"
    path.write_text("def compute_score(response, ground_truth):\n"
                    "    ok = f'<answer>{ground_truth}</answer>' in response\n"
                    "    return {'overall': float(ok), 'accuracy': float(ok)}\n")
    return f"{path}:compute_score"


def _args(model, data, out, reward, *extra):
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=16",
            "data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=4", "data.target_key=solution",
            *keys_for(out), "trainer.logger=[jsonl]", f"reward.reward_function={reward}",
            "trainer.val_before_train=false", "trainer.val_freq=-1", *extra]


def _rows(out):
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]


class RecordingEngine:
    """A rollout engine that answers every request with `n` completions of tokens 5, 6, 7 and records them."""

    shares_train_model = False

    def __init__(self):
        self.calls = []

    def generate(self, requests, sampling):
        self.calls.append((requests, sampling))
        return [[Completion([5, 6, 7][:sampling.max_new_tokens], [-1.0] * min(3, sampling.max_new_tokens), "length")
                 for _ in range(sampling.n)] for _ in requests]


@pytest.fixture(scope="module")
def setup(tiny_model_dir, counting_dir):
    processor = load_processor(tiny_model_dir)

    def make(*args):
        cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", "data.target_key=solution", "rollout.n=4",
                           "data.max_response_length=16", *args])
        data = PromptDataset(f"{counting_dir}/train.jsonl", cfg.data, processor, target_key="solution")
        return cfg, Hybrid(cfg, processor, data), [data[i] for i in range(2)], processor
    return make


def test_luffy_injects_the_expert_response_into_its_group(setup):
    """n_prefix=1, prefix ratio 1: the first of the 4 responses is the whole expert response (+ EOS), an
    off-policy segment nothing is sampled after; the other 3 are sampled in one request per prompt."""
    cfg, hybrid, samples, processor = setup(*METHODS["luffy"])
    tok = get_tokenizer(processor)
    prefixes = hybrid.prefixes(samples, step=1)
    expert = tok(samples[0].target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert prefixes[0] == [expert, None, None, None]
    engine = RecordingEngine()
    trajectories = Rollout(engine, processor).generate(samples, SamplingParams(n=4, max_new_tokens=16), prefixes)
    ((requests, sampling),) = engine.calls
    assert len(requests) == 2 and sampling.n == 3 and sampling.max_new_tokens == 16
    first = trajectories[0]
    assert [s.off_policy for s in first.segments] == [False, True] and first.segments[1].token_ids == expert
    assert first.response.startswith(samples[0].target) and first.finish_reason == "stop"
    batch = collate(trajectories, tok.pad_token_id)
    assert torch.equal(batch.off_policy_mask[0], batch.loss_mask[0]) and batch.off_policy_mask[1:4].sum() == 0
    assert batch.rollout_logprobs is not None  # the sampled rows keep their log-probs
    assert hybrid.metrics(batch, 1)["hybrid/off_policy_token_share"] == pytest.approx(
        2 * len(expert) / batch.loss_mask.sum().item())


def test_uft_hint_is_a_shared_chunked_prefix_that_the_policy_continues(setup):
    """prefix_strategy=hint: one hint per prompt (prefix_share_across_samples), k of 5 chunks of the solution
    (never its EOS), the policy continues after it within the rest of the budget; p(t) = 0 after hint_steps."""
    cfg, hybrid, samples, processor = setup(*METHODS["uft"], "algorithm.hint_chunks=5")
    tok = get_tokenizer(processor)
    prefixes = hybrid.prefixes(samples, step=1)
    for sample, ps in zip(samples, prefixes):
        solution = tok(sample.target, add_special_tokens=False)["input_ids"]
        assert all(p == ps[0] for p in ps) and ps[0] is not None  # p(1) = 0.95: a hint is all but certain
        assert len(ps[0]) in chunk_bounds(len(solution), 5) and ps[0] == solution[:len(ps[0])]
    engine = RecordingEngine()
    trajectories = Rollout(engine, processor).generate(samples, SamplingParams(n=4, max_new_tokens=16), prefixes)
    requests, sampling = engine.calls[0]
    assert sampling.n == 4 and requests[0].prompt_ids[-len(prefixes[0][0]):] == prefixes[0][0]
    assert sampling.max_new_tokens == 16 - len(prefixes[0][0])
    t = trajectories[0]
    assert [s.off_policy for s in t.segments] == [False, True, False] and t.segments[2].token_ids == [5, 6, 7]
    assert hybrid.prefixes(samples, step=4) == [[None] * 4] * 2  # hint_steps=3: no hint after
    assert hybrid.step_metrics["hybrid/hint_probability"] == 0.0


def test_hpt_switch_and_soft(setup):
    """Group 0 unsolved, group 1 solved once. switch (gate 0): group 0's rollouts leave the loss and its
    demonstration joins (sft_only, its own group, score 0); soft: every group gets its demonstration."""
    cfg, hybrid, samples, processor = setup(*METHODS["hpt"])
    engine = RecordingEngine()
    trajectories = Rollout(engine, processor).generate(samples, SamplingParams(n=4, max_new_tokens=16))
    scores = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    out, new_scores, details, dropped = hybrid.demonstrations(trajectories, scores, [{}] * 8)
    assert dropped == [0, 1, 2, 3] and len(out) == 9 and out[8].sft_only and out[8].sample.index == samples[0].index
    assert out[8].group_id == 2 and new_scores[8] == 0 and out[8].response == samples[0].target
    assert hybrid.step_metrics == {"hybrid/sft_groups": 0.5, "hybrid/rl_groups": 0.5}
    _, _, _, dropped = Hybrid(load_config([*_base(), *METHODS["hpt"], "algorithm.switch_gate=1"]), processor,
                              None).demonstrations(trajectories, scores, [{}] * 8)
    assert dropped == list(range(8))  # solved once <= gate 1: both groups switch
    soft = Hybrid(load_config([*_base(), "actor.policy_loss.loss_mode=hpt", "algorithm.unify_strategy=soft"]),
                  processor, None)
    out, _, _, dropped = soft.demonstrations(trajectories, scores, [{}] * 8)
    assert dropped == [] and [t.sft_only for t in out].count(True) == 2


def _base():
    return ["config=examples/tasks/counting/tiny_cpu.yaml", "data.target_key=solution", "rollout.n=4"]


def test_chord_demonstration_rows(setup):
    """expert_data_ratio 0.2 of all rows: 0.2 / 0.8 x 2 prompts x 4 = 2 demonstrations beside the 8 rollouts."""
    cfg, hybrid, samples, processor = setup(*METHODS["chord"], "data.train_batch_size=2",
                                            "actor.ppo_mini_batch_size=2")
    assert expert_rows_per_step(cfg) == 2
    trajectories = Rollout(RecordingEngine(), processor).generate(samples, SamplingParams(n=4, max_new_tokens=16))
    out, scores, _, dropped = hybrid.demonstrations(trajectories, torch.zeros(8), [{}] * 8)
    assert len(out) == 10 and all(t.sft_only for t in out[8:]) and dropped == []
    assert [t.group_id for t in out[8:]] == [2, 3] and hybrid.expert_sampler.state_dict()["position"] == 1
    # mu: warm-up 1 step to 0.9, cosine to 0.05 over 2 steps; the RL term gets 1 - mu
    assert [hybrid.coefficients(s)[1] for s in (1, 2, 3, 4, 5)] == pytest.approx([0.0, 0.9, 0.475, 0.05, 0.05])
    assert hybrid.coefficients(2) == pytest.approx((0.1, 0.9))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_two_steps_of_each_hybrid(tmp_path, tiny_model_dir, counting_dir, answer_reward, method):
    """Each method's keys run 2 steps end to end; its schedule and weights are logged each step."""
    out = str(tmp_path / method)
    rlvr.main(_args(tiny_model_dir, counting_dir, out, answer_reward, "trainer.max_steps=2", "trainer.samples_to_log=64",
                    *METHODS[method]))
    rows = _rows(out)
    assert [r["step"] for r in rows] == [1, 2] and os.path.isdir(os.path.join(out, "final"))
    expected = {"luffy": ["actor/off_pg_loss", "hybrid/prefix_tokens_mean"],
                "srft": ["actor/srft_on_coef", "actor/sft_weight", "actor/sft_nll"],
                "uft": ["hybrid/hint_probability", "hybrid/hint_chunks_mean", "actor/sft_nll"],
                "hpt": ["hybrid/sft_groups", "hybrid/rl_groups"],
                "chord": ["hybrid/mu", "hybrid/expert_rows", "actor/sft_nll"],
                "chord_phi": ["hybrid/mu", "actor/sft_weight"]}[method]
    for r in rows:
        assert all(k in r for k in expected + ["hybrid/off_policy_token_share", "hybrid/sft_coef"]), (method, r)
    assert rows[0]["hybrid/off_policy_token_share"] > 0
    if method == "luffy":  # samples.jsonl marks the rows that start with the expert's tokens
        samples = [json.loads(line) for line in open(os.path.join(out, "samples.jsonl"))]
        assert any(s.get("expert") == "prefix" for s in samples) and "expert" not in samples[0]  # the policy's first
    if method == "chord":
        assert [r["hybrid/mu"] for r in rows] == pytest.approx([0.0, 0.9])
    if method == "chord_phi":
        assert all(r["hybrid/mu"] == pytest.approx(0.1) and 0 < r["actor/sft_weight"] <= 0.25 for r in rows)
    if method == "hpt":  # a random tiny model solves nothing: every group trains on its demonstration
        assert rows[0]["hybrid/sft_groups"] == 1.0 and rows[0]["hybrid/off_policy_token_share"] == 1.0


def test_hpt_micro_batches_of_dropped_rollouts_still_step(tmp_path, tiny_model_dir, counting_dir, answer_reward):
    """Every group unsolved: all 8 rollouts leave the loss, so micro-batches of 2 rows hold no trained token at
    all. Each still runs its forward and backward (a zero loss: under FSDP every rank must), the demonstrations
    train, and the weights move; the RL metrics (entropy, pg_loss) come from micro-batches with RL tokens only."""
    out = str(tmp_path / "hpt")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, answer_reward, "trainer.max_steps=1", *METHODS["hpt"],
                    "actor.ppo_micro_batch_size=2"))
    (row,) = _rows(out)
    assert row["hybrid/sft_groups"] == 1.0 and row["actor/sft_nll"] > 0 and row["actor/grad_norm"] > 0
    assert "actor/entropy" not in row  # no RL token this step: not a 0 averaged into the others' metrics


def test_chord_resumes_exactly(tiny_model_dir, counting_dir, answer_reward, straight_and_resumed):
    """4 steps straight == 2 steps, stop, resume, 2 steps, bitwise: the demonstration sampler (a separate
    data.expert_files) and mu(t) come back with the checkpoint."""
    args = _args(tiny_model_dir, counting_dir, "unused", answer_reward, "trainer.max_steps=4", "trainer.save_freq=2",
                 *METHODS["chord"], "data.expert_batch_size=2", f"data.expert_files={counting_dir}/val.jsonl")
    straight, stopped = straight_and_resumed(2, args)
    a = load_file(os.path.join(straight, "final", "model.safetensors"))
    b = load_file(os.path.join(stopped, "final", "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    for key in ("hybrid/mu", "actor/sft_nll"):
        assert [r[key] for r in _rows(stopped)] == [r[key] for r in _rows(straight)]


def test_luffy_prefix_draws_resume_exactly(tiny_model_dir, counting_dir, answer_reward, straight_and_resumed):
    """Prefix ratios drawn in [0.3, 1] come from (trainer.seed, step, rank): a resumed run draws the same."""
    args = _args(tiny_model_dir, counting_dir, "unused", answer_reward, "trainer.max_steps=3", "trainer.save_freq=1",
                 *METHODS["luffy"], "algorithm.min_prefix_ratio=0.3", "algorithm.n_prefix=2")
    straight, stopped = straight_and_resumed(1, args)
    draws = [r["hybrid/prefix_tokens_mean"] for r in _rows(straight)]
    assert [r["hybrid/prefix_tokens_mean"] for r in _rows(stopped)] == draws and len(set(draws)) > 1


def test_srft_reads_the_success_threshold_and_luffy_names_both_on_policy_meanings():
    srft = ["actor.policy_loss.loss_mode=srft", "algorithm.prefix_strategy=random", "data.target_key=s"]
    assert load_config([*srft, "algorithm.success_reward_threshold=0.5"]).algorithm.success_reward_threshold == 0.5
    luffy = ["actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random", "data.target_key=s"]
    with pytest.warns(UserWarning, match=r"actor.on_policy_reshape=p_div_p_0.1 shapes the own ratio r = p / p_old as "
                                         r"LUFFY does .*; RLLaVA's meaning is actor.on_policy_reshape=rllava_p_div_p_0.1"):
        load_config([*luffy, "actor.on_policy_reshape=p_div_p_0.1"])
    assert load_config([*luffy, "actor.on_policy_reshape=rllava_logp"]).actor.on_policy_reshape == "rllava_logp"


@pytest.mark.parametrize("args, message", [
    (["actor.policy_loss.loss_mode=luffy", "data.target_key=solution"],
     "actor.policy_loss.loss_mode=luffy trains on expert prefixes: set algorithm.prefix_strategy=random"),
    (["actor.policy_loss.loss_mode=hpt", "data.target_key=solution"],
     "actor.policy_loss.loss_mode=hpt trains on demonstrations where a prompt is unsolved"),
    (["actor.policy_loss.loss_mode=uft", "algorithm.prefix_strategy=hint", "data.target_key=solution"],
     "algorithm.prefix_strategy=hint needs algorithm.hint_steps > 0"),
    (["actor.policy_loss.loss_mode=chord"], "actor.policy_loss.loss_mode=chord (an SFT+RL hybrid) needs expert"),
    (["algorithm.mu_peak=0.9"], "algorithm.mu_peak=0.9 is read only by CHORD"),
    (["actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random", "data.target_key=s",
      "actor.sft_loss_coef=0.5"], "actor.sft_loss_coef=0.5 is read only by the SFT term of HPT, UFT and SRFT"),
    (["algorithm.strategy=mix_chord", "actor.policy_loss.loss_mode=grpo"],
     "algorithm.strategy=mix_chord is CHORD: it contradicts actor.policy_loss.loss_mode=grpo"),
    (["actor.off_policy_normalize=true"], "actor.off_policy_normalize=true is declared by RLLaVA but read by none"),
    (["algorithm.hint_max_ratio=0.5"], "algorithm.hint_max_ratio=0.5 is not read in rllava; set "
                                       "algorithm.max_prefix_ratio instead"),
    (["algorithm.clip_range=0.3"], "algorithm.clip_range=0.3 is not read in rllava; set actor.clip_ratio instead"),
    (["actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random", "data.target_key=s",
      "actor.off_policy_reshape=p_div_p_x"], "actor.off_policy_reshape=p_div_p_x is not a shaping"),
    (["actor.policy_loss.loss_mode=srft", "algorithm.prefix_strategy=random", "data.target_key=s",
      "actor.srft_type=papr"], "actor.srft_type=papr is not one of: paper, exp, classic_rl, minus_old"),
    (["actor.policy_loss.loss_mode=srft", "algorithm.prefix_strategy=random", "data.target_key=s",
      "actor.clip_upper_bound=2"], "actor.clip_upper_bound=2.0 is read only by SRFT's ratio term"),
    (["algorithm.success_reward_threshold=0.5"], "algorithm.success_reward_threshold=0.5 is read only by HPT's "
                                                 "algorithm.unify_strategy=switch|soft and SRFT"),
    (["actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random", "data.target_key=s",
      "actor.on_policy_reshape=rllava_sqrt"], "actor.on_policy_reshape=rllava_sqrt is not a shaping"),
    (["actor.policy_loss.loss_mode=hpt", "algorithm.unify_strategy=switch", "data.target_key=s", "critic.strategy=auto"],
     "actor.policy_loss.loss_mode=hpt (an SFT+RL hybrid) runs without a critic"),
])
def test_bad_hybrid_configs_are_one_line_errors(args, message):
    with pytest.raises(ConfigError) as err:
        load_config(args)
    assert any(line.lstrip("- ").startswith(message) for line in str(err.value).splitlines()), str(err.value)


def test_a_record_without_an_expert_response_is_named(tmp_path, tiny_model_dir, counting_dir, answer_reward, capsys):
    rows = [json.loads(line) for line in open(f"{counting_dir}/train.jsonl")][:8]
    rows[3].pop("solution")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = _args(tiny_model_dir, counting_dir, str(tmp_path / "out"), answer_reward, "trainer.max_steps=1",
                 *METHODS["hpt"], f"data.train_files={tmp_path}/train.jsonl", f"data.train_image_dir={counting_dir}")
    with pytest.raises(SystemExit) as err:
        rlvr.main(args)
    err_text = capsys.readouterr().err
    (line,) = [x for x in err_text.splitlines() if x.startswith("rllava: error")]
    assert err.value.code == 2 and "record 3" in line and "solution" in line, line


def test_rllavas_expert_dataset_classes_are_read_with_their_meaning(tiny_model_dir):
    """RLLaVA's sft-rl scripts name a dataset class of its custom_datasets.py: rllava reads the class by name.
    RLHFDatasetWithTarget: the expert text is the record's field (a list: its first item; a chat message: its
    content); RLHFDatasetWithTargetClevr: that field + "\n" + the answer (as its __getitem__ builds it);
    max_target_length cuts the expert tokens; what rllava does not do is an error naming the key."""
    from rllava.data.protocol import Sample
    from rllava.model.processor import load_processor
    from rllava.train.hybrid_step import Hybrid

    base = ["actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random", f"actor.model.model_path={tiny_model_dir}"]
    spec = "data.dataset_class=examples/algorithms/sft-rl/custom_datasets.py:"
    processor = load_processor(tiny_model_dir)

    def sample(**fields):
        return Sample(index=0, messages=[{"role": "user", "content": "q"}], images=[], ground_truth="7",
                      target=fields.pop("target", None), extra=fields)

    plain = Hybrid(load_config([*base, spec + "RLHFDatasetWithTarget", "data.dataset_kwargs.target_key=thinking"]),
                   processor)
    assert plain.cfg.data.target_key == "thinking"
    assert [plain.expert_text(sample(target=t)) for t in ("a b", ["first", "second"], {"content": "c"})] == \
        ["a b", "first", "c"]
    clevr = Hybrid(load_config([*base, spec + "RLHFDatasetWithTargetClevr", "data.dataset_kwargs.target_key=thinking",
                                "data.dataset_kwargs.max_target_length=3", "data.max_response_length=16"]), processor)
    assert clevr.expert_text(sample(thinking="count them")) == "count them\n7" and clevr.max_len == 3
    assert len(clevr.expert_ids(sample(thinking="count them one by one"))) <= 3 + 1  # + EOS
    for extra, message in [
        (["data.dataset_kwargs.target_key=t", "data.dataset_kwargs.sample_target_ratio=0.5"],
         "data.dataset_kwargs.sample_target_ratio=0.5 is not available yet in rllava"),
        (["data.dataset_kwargs.targets=t"], "data.dataset_kwargs.targets: not a key of RLLaVA's RLHFDatasetWithTarget"),
        ([], "needs data.dataset_kwargs.target_key"),
        (["data.dataset_kwargs.target_key=t", "data.target_key=u"], "data.target_key=u and data.dataset_kwargs.target_key=t"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config([*base, spec + "RLHFDatasetWithTarget", *extra])
    with pytest.raises(ConfigError, match="rllava runs no dataset class of a file"):
        load_config([*base, "data.dataset_class=my.py:MyDataset"])
