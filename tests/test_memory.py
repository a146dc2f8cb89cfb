"""rllava.memory: the planner's per-phase peaks against the real step's, the CLI, and a seed model by name."""

import pytest
import torch

from rllava import memory
from rllava.config import load_config

TINY_CPU = "examples/tasks/counting/tiny_cpu.yaml"


def _cfg(model_path: str, *overrides: str):
    return load_config([f"config={TINY_CPU}", f"actor.model.model_path={model_path}", *overrides])


def _real_policy(model_dir: str, cfg):
    """The tiny policy with real weights, as rllava builds it on CPU, and AdamW's states as a step leaves them."""
    from rllava.model.loader import load_model, make_trainable

    model = make_trainable(load_model(model_dir, dtype=torch.float32), cfg.actor.model, torch.device("cpu"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], foreach=True)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    model.zero_grad(set_to_none=True)
    return model, optimizer


def _batch(model, step, rows: int):
    """A rllava Batch of `rows` trajectories of the planner's shapes (one image each, the response trained)."""
    from rllava.data.protocol import Batch, Trajectory

    inputs = memory.model_inputs(model, step, rows, step.response)
    per = len(inputs["pixel_values"]) // rows
    trajectories = [Trajectory(sample=None, group_id=i, segments=[],
                               mm_inputs={"pixel_values": inputs["pixel_values"][i * per:(i + 1) * per],
                                          "image_grid_thw": inputs["image_grid_thw"][i:i + 1]})
                    for i in range(rows)]
    loss_mask = torch.zeros(inputs["input_ids"].shape)
    loss_mask[:, step.prompt:] = 1
    return Batch(trajectories=trajectories, input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                 loss_mask=loss_mask, group_ids=torch.arange(rows))


@pytest.mark.parametrize("checkpointing, micro", [(False, 64), (True, 64), (True, 16)])
def test_planned_peaks_match_rllavas_real_forward_within_10_percent(tiny_model_dir, checkpointing, micro):
    """Calibration: the plan (fake weights) against rllava's own training forward (rllava.model.forward.
    token_logprobs on a Batch) run for real on CPU, real weights and tensors of the same shapes, under torch's
    MemTracker in real mode: the old log-prob and update peaks within 10 %. micro=16: 4 micro-batches per
    mini-batch, the second one measured (beside the first one's gradients)."""
    from rllava.model.forward import token_logprobs

    cfg = _cfg(tiny_model_dir, f"actor.model.enable_gradient_checkpointing={str(checkpointing).lower()}",
               f"actor.ppo_micro_batch_size={micro}")
    planned = {r["phase"]: r["peak"] for r in memory.plan(cfg, device="cpu")}
    model, optimizer = _real_policy(tiny_model_dir, cfg)
    step = memory.step_of(cfg, model.config)
    old, micro_batch = _batch(model, step, step.logprob_rows), _batch(model, step, step.update_rows)

    def old_logprobs():
        with torch.no_grad():
            token_logprobs(model, old, chunk_size=step.chunk)

    def update():
        model.train()
        logprobs, _ = token_logprobs(model, micro_batch, chunk_size=step.chunk, with_entropy=True)
        (-logprobs.sum() / micro_batch.loss_mask.sum()).backward()

    real = {"old log-prob": memory.tracked(old_logprobs, model, optimizer)["peak"]}
    if step.accumulates:
        update()  # the first micro-batch, untracked: its gradients stay
    real["update"] = memory.tracked(update, model, optimizer)["peak"]
    for phase, peak in real.items():
        assert planned[phase] == pytest.approx(peak, rel=0.10), phase


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def tiny_vlm(request, tiny_model_dir, tmp_path_factory):
    """The tiny Qwen2-VL of conftest, and tiny Qwen2.5-VL (windowed vision attention) and Qwen3-VL (DeepStack)."""
    from rllava.model.tiny import build_tiny

    if request.param == "qwen2_vl":
        return tiny_model_dir
    return build_tiny(request.param, str(tmp_path_factory.mktemp("memory") / request.param), size="small")


def test_fake_and_real_runs_of_every_phase_agree(tiny_vlm):
    """The planner's phases run on fake and on real tensors give the same peaks (the fake mode loses nothing)."""
    cfg = _cfg(tiny_vlm, "actor.model.enable_gradient_checkpointing=true", "actor.ppo_micro_batch_size=16")
    planned = memory.plan(cfg, device="cpu")
    model, optimizer = _real_policy(tiny_vlm, cfg)
    step = memory.step_of(cfg, model.config)
    real = memory.run_phases(model, optimizer, step, memory.kv_cache_bytes(model.config, step, model.dtype))
    for p, r in zip(planned, real):
        assert p["peak"] == pytest.approx(r["peak"], rel=0.02), p["phase"]
    assert planned[2]["parameters"] == real[2]["parameters"]
    assert planned[3]["optimizer"] >= 2 * planned[3]["gradients"]  # Adam's two moments


def test_checkpointing_lowers_the_update_peak(tiny_model_dir):
    peaks = [{r["phase"]: r["peak"] for r in memory.plan(_cfg(tiny_model_dir, f"actor.model."
             f"enable_gradient_checkpointing={on}"), device="cpu")}["update"] for on in ("false", "true")]
    assert peaks[1] < 0.8 * peaks[0]


def test_kv_cache_is_counted_from_the_config(tiny_model_dir):
    cfg = _cfg(tiny_model_dir)
    config = memory.model_config(tiny_model_dir)
    step = memory.step_of(cfg, config)
    text = config.get_text_config()
    tokens = min(cfg.rollout.micro_batch_size, cfg.data.train_batch_size) * cfg.rollout.n * (
        cfg.data.max_prompt_length + cfg.data.max_response_length)
    head_dim = text.hidden_size // text.num_attention_heads
    assert memory.kv_cache_bytes(config, step, torch.bfloat16) == (
        2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * tokens * 2)
    assert step.grid == (8, 8)  # data.max_pixels 12544 = 112 x 112 px: 8 x 8 patches of 14 px, 16 tokens merged


def test_cli_prints_the_table(tiny_model_dir, capsys):
    memory.main([f"config={TINY_CPU}", f"actor.model.model_path={tiny_model_dir}", "--gpu-memory", "24GiB"])
    out = capsys.readouterr().out
    for word in ("phase", "parameters", "kv_cache", "rollout", "old log-prob", "update", "optimizer", "fits"):
        assert word in out
    assert "of 24.00 GiB: fits" in out


@pytest.mark.parametrize("argv, message", [
    (["--gpu-memory", "lots"], "--gpu-memory='lots'"),
    (["actor.model.model_path=nobody/nothing"], "not a model the planner knows"),
])
def test_cli_bad_input_is_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        memory.main([f"config={TINY_CPU}", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rllava: error:") and message in err and "\n" not in err


def test_parse_size():
    assert memory.parse_size("24GiB") == memory.parse_size("24G") == memory.parse_size("24GB") == 24 * memory.GiB
    assert memory.parse_size("512MiB") == 512 * 2 ** 20 and memory.parse_size("1000") == 1000


@pytest.mark.slow  # ~25 s on this CPU
def test_seed_model_by_name_plans_every_phase():
    """Qwen2.5-VL-3B from the seed table (no download): its bf16 parameters count 3.75 B (the published size)."""
    rows = memory.plan(_cfg("Qwen/Qwen2.5-VL-3B-Instruct"), 24 * memory.GiB)
    assert rows[0]["parameters"] / 2 == pytest.approx(3.75e9, rel=0.02)
    assert [r["phase"] for r in rows] == ["rollout", "old log-prob", "update", "optimizer"]
    assert all(r["fits"] == (r["peak"] <= 24 * memory.GiB) for r in rows)


@pytest.mark.parametrize("name, billions", [
    ("Qwen/Qwen2-VL-2B-Instruct", 2.21), ("Qwen/Qwen2-VL-7B-Instruct", 8.29), ("Qwen/Qwen2.5-VL-3B-Instruct", 3.75),
    ("Qwen/Qwen2.5-VL-7B-Instruct", 8.29), ("Qwen/Qwen3-VL-4B-Instruct", 4.44), ("Qwen/Qwen3-VL-8B-Instruct", 8.77),
])
def test_seed_models_have_their_published_sizes(name, billions):
    """Each seed's config, built without weights, has the parameter count its hub page publishes."""
    with memory.fake_mode():
        model, _ = memory.policy_from_config(_cfg(name))
        assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.006)


def test_a_run_that_does_not_fit_gets_changes_each_planned_again(tiny_model_dir, capsys, monkeypatch):
    """Just under the step's peak: each single change is re-planned; checkpointing (the update's activations) and
    a smaller update micro-batch fit; the CLI lists them, and what it does not count yet."""
    args = [f"config={TINY_CPU}", f"actor.model.model_path={tiny_model_dir}"]
    peak = max(r["peak"] for r in memory.plan(load_config(args), device="cpu"))
    tried = dict(memory.suggest(args, peak - 1, device="cpu"))
    assert list(tried) == memory.fixes(load_config(args)) and list(tried)[:2] == [
        "actor.model.enable_gradient_checkpointing=true", "actor.ppo_micro_batch_size=32"]
    assert tried["actor.model.enable_gradient_checkpointing=true"] < peak and tried["actor.ppo_micro_batch_size=32"] < peak
    assert tried["actor.log_prob_micro_batch_size=32"] == peak  # not the phase at the peak: no help
    again = max(r["peak"] for r in memory.plan(load_config([*args, "actor.ppo_micro_batch_size=32"]), device="cpu"))
    assert tried["actor.ppo_micro_batch_size=32"] == again  # re-planned, not guessed

    def fake_plan(cfg, gpu_bytes=None, device="cuda"):  # every change helps a little, none enough alone
        return [{"phase": "update", "peak": 100 - 10 * len(memory.fixes(cfg)) ** 0}]
    monkeypatch.setattr(memory, "plan", fake_plan)
    assert memory.suggest(args, 50)[-1] == (" ".join(memory.fixes(load_config(args))), 90)  # then all together
    monkeypatch.undo()
    monkeypatch.setattr(memory, "suggest", lambda overrides, gpu: [("actor.ppo_micro_batch_size=32", 10)])
    memory.main([*args, "--gpu-memory", "1MiB", "rollout.name=vllm"])
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "changes, each planned again:\n  actor.ppo_micro_batch_size=32: step peak " in out
    assert "note: not counted yet: rollout.name=vllm's own reservation (planned as the HF engine)" in out
    with pytest.raises(SystemExit):
        memory.main([*args, "actor.model.use_peft=true"])
    assert "does not plan LoRA yet" in capsys.readouterr().err


def test_a_kl_adds_the_frozen_reference_to_every_phase_and_a_pass_of_its_own(tiny_model_dir):
    """As rllava.train.builders.build_reference_role: a KL in the loss (non-zero coefficient) or in the reward
    builds a frozen copy of the starting weights; a frozen vision tower plans too (no gradient there)."""
    plain = {r["phase"]: r for r in memory.plan(_cfg(tiny_model_dir), device="cpu")}
    kl = {r["phase"]: r for r in memory.plan(_cfg(tiny_model_dir, "algorithm.use_kl_loss=true",
                                                  "actor.kl_loss_coef=0.1"), device="cpu")}
    assert list(kl) == ["rollout", "old log-prob", "ref log-prob", "update", "optimizer"]
    assert all(kl[p]["parameters"] == 2 * plain[p]["parameters"] for p in plain)
    assert "ref log-prob" not in {r["phase"] for r in memory.plan(_cfg(tiny_model_dir, "algorithm.use_kl_loss=true",
                                                                       "actor.kl_loss_coef=0"), device="cpu")}
    frozen = {r["phase"]: r for r in memory.plan(_cfg(tiny_model_dir, "actor.model.freeze_vision_tower=true"),
                                                 device="cpu")}
    assert frozen["optimizer"]["gradients"] < plain["optimizer"]["gradients"]
