"""On-policy distillation (`algorithm.distill`) in the pipeline: the teacher sees the student's pixels, scores the
model's turns only, routes by a record field, is a model of its own under LoRA, offloads between passes, and the
start-up errors (another tokenizer, keys without a teacher, engines and losses that cannot meet)."""

import contextlib
import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForImageTextToText

from rllava.algorithms.ppo import build_algorithm
from rllava.algorithms.distill import full, k1
from rllava.config import ConfigError, load_config
from rllava.config.schema import ActorConfig, AlgorithmConfig
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.errors import RllavaError
from rllava.model.forward import model_inputs
from rllava.model.processor import load_processor
from rllava.roles.actor import Actor, Distillation
from rllava.roles.batching import MicroBatching, compute_logprobs
from rllava.roles.reference import Reference
from rllava.roles.teacher import DEFAULT, EngineTeacher, Teachers
from rllava.train import builders as B
from rllava.train.outputs import keys_for
from rllava.train.pipeline import rlvr

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """A wider tiny Qwen2-VL with the student's tokenizer (same seed): another size, one vocabulary."""
    from rllava.model.tiny import build_tiny

    return build_tiny("qwen2_vl", str(tmp_path_factory.mktemp("teacher") / "qwen2_vl"), size="demo", seed=0)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def _model(path):
    return AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32)


def _args(model, data, out, reward, *extra):
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", "data.max_samples=16", "data.train_batch_size=2",
            "actor.ppo_mini_batch_size=2", "rollout.n=4", "trainer.val_before_train=false", "trainer.val_freq=-1",
            "trainer.max_steps=1", *keys_for(out), "trainer.logger=[jsonl]", f"reward.reward_function={reward}", *extra]


def _rows(out):
    return [r for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "reward/mean" in r]


@pytest.mark.parametrize("loss", ["full", pytest.param("k1", marks=pytest.mark.slow)])
def test_a_teacher_that_is_the_student_sees_the_same_pixels(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                            teacher_dir, loss):
    """The student as its own teacher: the KL is 0 on image rows only if the teacher got the same pixels and
    tokens. A wider teacher: the KL is positive, and pure distillation (no reward) still moves the weights."""
    same, other = str(tmp_path / "same"), str(tmp_path / "other")
    keys = [f"algorithm.distill.loss={loss}", "algorithm.distill.use_reward=false"]
    rlvr.main(_args(tiny_model_dir, counting_dir, same, distinct_reward, f"algorithm.distill.teacher_path={tiny_model_dir}",
                    *keys))
    rlvr.main(_args(tiny_model_dir, counting_dir, other, distinct_reward, f"algorithm.distill.teacher_path={teacher_dir}",
                    *keys))
    (row,), (moved,) = _rows(same), _rows(other)
    assert abs(row["distill/reverse_kl"]) < 1e-5 and abs(row["actor/distill_loss"]) < 1e-5
    assert moved["distill/reverse_kl"] > 1e-3 and moved["actor/pg_loss"] == 0.0  # advantages zero: no reward term
    before, after = load_file(f"{tiny_model_dir}/model.safetensors"), load_file(f"{other}/final/model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_lora_student_distils_from_the_teacher_not_its_base(tmp_path, tiny_model_dir, counting_dir, distinct_reward,
                                                            teacher_dir):
    """Under LoRA the KL reference is the adapter-free base; a teacher is always its own model: at step 1 (adapters
    at zero: the student is its base) the KL to the teacher is positive, where the base would give 0."""
    out = str(tmp_path / "lora")
    rlvr.main(_args(tiny_model_dir, counting_dir, out, distinct_reward, f"algorithm.distill.teacher_path={teacher_dir}",
                    "actor.model.use_peft=true", "actor.model.lora_r=4", "actor.optim.lr=1e-2"))
    (row,) = _rows(out)
    assert row["distill/reverse_kl"] > 1e-3 and row["actor/grad_norm"] > 0


def _agent_batch(vocab: int):
    """Two text rows: prompt, a model turn, an observation (a tool's output: not trained), another model turn."""
    g = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(20, vocab, (n,), generator=g).tolist()  # noqa: E731
    return collate([Trajectory(Sample(k, [], [], None, extra={"kind": kind}), k, [
        Segment(ids(5), trained=False), Segment(ids(4), trained=True), Segment(ids(6), trained=False),
        Segment(ids(3 + k), trained=True)], {}) for k, kind in enumerate(["a", "b"])], pad_token_id=0)


class _Engine:
    device = torch.device("cpu")

    def __init__(self, model):
        self.model = model

    def backward(self, loss):
        loss.backward()

    def update_phase(self):
        return contextlib.nullcontext()

    def optimizer_step(self):
        self.model.zero_grad(set_to_none=True)
        return 0.0


def _actor(model, distill):
    actor = Actor(model, _Engine(model), build_algorithm(AlgorithmConfig(), ActorConfig()), ppo_epochs=1,
                  mini_batch_size=2, micro_batch_size=2, log_prob_micro_batch_size=2, loss_agg_mode="token-mean",
                  max_response_length=16, temperature=1.0, use_kl_loss=False, kl_loss_coef=0.0,
                  kl_loss_type="low_var_kl", entropy_coeff=0.0)
    actor.distill = distill
    return actor


def test_observation_tokens_get_no_kl(tiny_model_dir, teacher_dir):
    """The exact KL the Actor reports is the mean over the model's turns of the KL computed from both models' dense
    logits; the observation's positions (which carry a KL of their own) are left out. The sampled form's teacher
    log-probs are zero there."""
    student, teacher = _model(tiny_model_dir), _model(teacher_dir)
    batch = _agent_batch(2048)
    batch.advantages = torch.zeros(batch.loss_mask.shape)
    with torch.no_grad():
        dense = [torch.log_softmax(m(**model_inputs(m, batch)).logits.float(), -1)[:, :-1] for m in (student, teacher)]
    kl = torch.zeros(batch.loss_mask.shape)
    kl[:, 1:] = (dense[0].exp() * (dense[0] - dense[1])).sum(-1)  # position t: the KL of predicting token t
    response = batch.attention_mask.clone()
    response[:, :5] = 0  # every position after the prompt: turns and the observation
    trained, everything = (kl * batch.loss_mask).sum() / batch.loss_mask.sum(), (kl * response).sum() / response.sum()
    assert abs(trained - everything) > 2e-3 * trained  # the observation's KL would show (20x the tolerance below)
    teachers = Teachers({DEFAULT: Reference(teacher, MicroBatching(2), 1.0)})
    metrics = _actor(student, Distillation(full, 1.0, teachers)).update(batch)
    assert metrics["distill/reverse_kl"] == pytest.approx(trained.item(), rel=1e-4)
    teacher_lp = teachers.compute_logprobs(batch)
    assert torch.all(teacher_lp[batch.loss_mask == 0] == 0) and torch.all(teacher_lp[batch.loss_mask == 1] < 0)


def test_rows_go_to_the_teacher_their_field_names(tiny_model_dir, teacher_dir):
    student, teacher = _model(tiny_model_dir), _model(teacher_dir)
    batch = _agent_batch(2048)
    teachers = Teachers({"a": Reference(student, MicroBatching(2), 1.0), "b": Reference(teacher, MicroBatching(2), 1.0)},
                        route_field="kind")
    assert teachers.route(batch) == {"a": [0], "b": [1]}
    got = teachers.compute_logprobs(batch)
    for row, model in ((0, student), (1, teacher)):
        own = compute_logprobs(model, batch.select([row]), MicroBatching(1), 1.0)
        torch.testing.assert_close(got[row, :own.shape[1]], own[0])
    batch.trajectories[1].sample.extra["kind"] = "c"  # no teacher for it, and no teacher_path
    with pytest.raises(RllavaError, match=r"record 1: its kind='c' has no teacher in algorithm.distill.teachers \(a, b\)"):
        teachers.route(batch)
    # the exact KL runs one teacher per micro-batch: a mixed mini-batch is split by teacher first
    metrics = _actor(student, Distillation(full, 1.0, Teachers({"a": Reference(teacher, MicroBatching(2), 1.0), "c": Reference(
        teacher, MicroBatching(2), 1.0)}, route_field="kind"))).update(
        _with_advantages(batch))
    assert metrics["distill/reverse_kl"] > 0


def _with_advantages(batch):
    batch.advantages = torch.zeros(batch.loss_mask.shape)
    return batch


def test_offloaded_teachers_come_to_the_device_for_their_passes_only(tiny_model_dir, monkeypatch):
    model = _model(tiny_model_dir)
    moves = []
    monkeypatch.setattr(model, "to", lambda device: moves.append(str(device)) or model)
    teachers = Teachers({DEFAULT: Reference(model, MicroBatching(2), 1.0)}, device=torch.device("cpu"), offload=True)
    teachers.compute_logprobs(_agent_batch(2048))
    assert moves == ["cpu", "cpu"]  # in (this machine's device is the CPU), and out
    moves.clear()
    with Teachers({DEFAULT: Reference(model, MicroBatching(2), 1.0)}, device=torch.device("cpu")).resident():
        pass
    assert moves == []


class _FakeEngine:
    def __init__(self, extra=0):
        self.extra, self.requests = extra, []

    def score(self, requests):
        self.requests += requests
        return [[0.0] + [-0.5] * (len(r.prompt_ids) - 1 + self.extra) for r in requests]


def test_an_engine_teacher_scores_the_trained_tokens(tiny_model_dir):
    processor = load_processor(tiny_model_dir)
    batch = _agent_batch(2048)
    batch.trajectories = [Trajectory(t.sample, t.group_id, [t.segments[0], Segment(
        [x for s in t.segments[1:] for x in s.token_ids], trained=True)], {}) for t in batch.trajectories]
    batch = collate(batch.trajectories, pad_token_id=0)
    engine = _FakeEngine()
    lp = EngineTeacher(engine, processor).compute_logprobs(batch)
    assert torch.equal(lp, -0.5 * batch.loss_mask)
    assert [r.raw_prompt_ids for r in engine.requests] == [r.prompt_ids for r in engine.requests]  # text: no images
    with pytest.raises(RllavaError, match=r"scored 19 tokens of record 0 where the student's processor made 18"):
        EngineTeacher(_FakeEngine(extra=1), processor).compute_logprobs(batch)


def test_a_teacher_with_another_tokenizer_is_a_start_up_error(tmp_path, tiny_model_dir):
    from rllava.model.tiny import build_tiny

    other = build_tiny("qwen2_vl", str(tmp_path / "other"), size="small", seed=1)  # its tokenizer: another corpus
    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
                       f"algorithm.distill.teacher_path={other}"])
    with pytest.raises(ConfigError, match=rf"algorithm.distill.teacher_path={other}: its tokenizer \(.*2048 tokens\) "
                                          rf"differs from the student's, actor.model.model_path={tiny_model_dir} .*: "
                                          r"token '.*' is \d+ in the student's and \d+ in the teacher's"):
        B.build_distillation(cfg, load_processor(tiny_model_dir), _model(tiny_model_dir), torch.device("cpu"))


@pytest.mark.parametrize("keys, message", [
    (["algorithm.distill.coef=0.5"], r"algorithm.distill.coef=0.5 is read only with a teacher: set "
                                     r"algorithm.distill.teacher_path"),
    (["algorithm.distill.teacher_path=/t", "algorithm.distill.route_field=data_source"],
     r"algorithm.distill.teachers and algorithm.distill.route_field go together"),
    (["algorithm.distill.teacher_path=/t", "actor.strategy=fsdp2"],
     r"algorithm.distill.loss=full with actor.strategy=fsdp2 .* use algorithm.distill.loss=k1"),
    (["algorithm.distill.teacher_path=/t", "algorithm.distill.engine=vllm"],
     r"algorithm.distill.engine=vllm gives one teacher log-prob per token; algorithm.distill.loss=full"),
    (["algorithm.distill.teacher_path=/t", "algorithm.distill.engine=sglang", "algorithm.distill.loss=k1",
      "rollout.temperature=0.7"], r"teacher's log-probs at temperature 1, and the student's are at "
                                  r"rollout.temperature=0.7"),
    (["algorithm.distill.teacher_path=/t", "actor.policy_loss.loss_mode=chord", "data.target_key=solution"],
     r"algorithm.distill with actor.policy_loss.loss_mode=chord"),
])
def test_start_up_errors(keys, message):
    with pytest.raises(ConfigError, match=message):
        load_config(["config=examples/tasks/counting/tiny_cpu.yaml", *keys])


def test_k1_reads_the_teachers_log_probs_before_the_update():
    assert Distillation(k1, 1.0, None).needs("teacher_logprobs") and not Distillation(k1, 1.0, None).full
    assert Distillation(full, 1.0, None).full


def _grads(student, distill, batch):
    grads = []
    actor = _actor(student, distill)
    actor.engine.optimizer_step = lambda: grads.append({n: p.grad.clone() for n, p in student.named_parameters()
                                                        if p.grad is not None}) or student.zero_grad() or 0.0
    actor.update(_with_advantages(batch))
    return grads[0]


def test_coef_weights_the_teachers_term(tiny_model_dir, teacher_dir):
    """algorithm.distill.coef=c multiplies the distillation gradient by c (advantages zero: no other term)."""
    student, teacher = _model(tiny_model_dir), _model(teacher_dir)
    teachers = Teachers({DEFAULT: Reference(teacher, MicroBatching(2), 1.0)})
    one = _grads(student, Distillation(full, 1.0, teachers), _agent_batch(2048))
    three = _grads(student, Distillation(full, 3.0, teachers), _agent_batch(2048))
    assert len(one) > 10
    for name in one:
        torch.testing.assert_close(three[name], 3 * one[name], rtol=1e-4, atol=1e-7)


def test_the_builder_reads_routes_and_offload(tiny_model_dir, teacher_dir):
    """algorithm.distill.route_field + algorithm.distill.teachers: one teacher per value (others: teacher_path);
    algorithm.distill.offload=true: the teachers wait in host memory (here the device is the CPU: they are there)."""
    cfg = load_config(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
                       f"algorithm.distill.teacher_path={tiny_model_dir}", "algorithm.distill.route_field=kind",
                       f"algorithm.distill.teachers={{b: {teacher_dir}}}", "algorithm.distill.offload=true"])
    student = _model(tiny_model_dir)
    d = B.build_distillation(cfg, load_processor(tiny_model_dir), student, torch.device("cpu"))
    assert sorted(d.teachers.by_route) == [DEFAULT, "b"] and d.teachers.route_field == "kind" and d.teachers.offload
    assert d.teachers.by_route["b"].model.config.text_config.hidden_size != student.config.text_config.hidden_size
    assert d.teachers.route(_agent_batch(2048)) == {DEFAULT: [0], "b": [1]}  # "a" has no entry: teacher_path


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["full", "k1"])
def test_distillation_resumes_exactly(tiny_model_dir, counting_dir, distinct_reward, teacher_dir, straight_and_resumed,
                                      loss):
    """4 steps straight == 2 steps, stop, resume, 2 steps, bitwise: the teacher is frozen and loaded again from
    algorithm.distill.teacher_path; nothing of it is in the checkpoint, nothing needs to be."""
    args = _args(tiny_model_dir, counting_dir, "unused", distinct_reward, "trainer.max_steps=4", "trainer.save_freq=2",
                 f"algorithm.distill.teacher_path={teacher_dir}", f"algorithm.distill.loss={loss}")
    straight, stopped = straight_and_resumed(2, args)
    a = load_file(os.path.join(straight, "final", "model.safetensors"))
    b = load_file(os.path.join(stopped, "final", "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["distill/reverse_kl"] for r in _rows(stopped)] == [r["distill/reverse_kl"] for r in _rows(straight)]


@pytest.mark.slow
def test_a_teacher_that_is_the_student_sees_the_same_video_frames(tmp_path, tiny_model_dir, counting_videos_dir,
                                                                  distinct_reward):
    """Video rows: the teacher's forward gets the same frames and grid (a KL of exactly 0 to itself)."""
    out = str(tmp_path / "video")
    rlvr.main(_args(tiny_model_dir, counting_videos_dir, out, distinct_reward, "data.video_key=videos",
                    "data.video_fps=2", "data.video_max_frames=4", "data.video_max_pixels=3136",
                    f"algorithm.distill.teacher_path={tiny_model_dir}"))
    (row,) = _rows(out)
    assert abs(row["distill/reverse_kl"]) < 1e-5 and row["response_length/mean"] > 0
