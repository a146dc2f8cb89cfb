"""Keys no other test names: each reaches the object built from it (test_schema_walk.py's table points here)."""

import json
import os
import shutil

import pytest
import torch

from rllava.config import ConfigError, load_config
from rllava.train import builders as B
from rllava.train import checkpoint as C
from rllava.train.outputs import keys_for

CPU = torch.device("cpu")


def _quiet(args):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_config(args)


def test_data_field_keys_and_image_dirs_reach_the_dataset(tmp_path, counting_dir, tiny_model_dir):
    """data.prompt_key / answer_key / image_key name the record fields; train/val_image_dir root relative paths."""
    from rllava.model.processor import load_processor

    shutil.copytree(os.path.join(counting_dir, "images"), tmp_path / "pics" / "images")
    for split in ("train", "val"):
        rows = [json.loads(x) for x in open(os.path.join(counting_dir, f"{split}.jsonl"))][:4]
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({"question": r["problem"], "count": r["answer"] + "!", "pictures": r["images"]}) + "\n")
    cfg = _quiet([f"data.train_files={tmp_path}/train.jsonl", f"data.val_files={tmp_path}/val.jsonl",
                  "data.prompt_key=question", "data.answer_key=count", "data.image_key=pictures",
                  f"data.train_image_dir={tmp_path}/pics", f"data.val_image_dir={tmp_path}/pics"])
    train, val = B.build_datasets(cfg, load_processor(tiny_model_dir))
    for dataset in (train, val):
        s = dataset[0]
        assert s.ground_truth.endswith("!") and len(s.images) == 1  # the answer and image fields were read


def test_kl_controller_and_rollout_is_keys():
    cfg = _quiet(["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.5"])
    assert B.build_kl_controller(cfg).value == 0.5
    assert B._rollout_is(_quiet(["algorithm.rollout_is=token", "algorithm.rollout_is_cap=3.5"]), False) == {
        "rollout_is": "token", "rollout_is_cap": 3.5, "rollout_rs": None, "rollout_rs_threshold": None,
        "off_policy": False}
    assert B._rollout_is(_quiet(["rollout.partial_rollout=true"]), False)["off_policy"]  # mismatch metrics logged


def _engine(cfg, section="actor"):
    s = getattr(cfg, section)
    return B._engine(torch.nn.Linear(2, 2), s.optim, CPU, s.max_grad_norm, None, updates=10, key=f"{section}.optim",
                     strategy="single", fsdp=s.fsdp, deepspeed=s.deepspeed)


@pytest.mark.parametrize("section", ["actor", "critic"])
def test_optim_keys_reach_the_engine(section):
    base = ["critic.model.model_path=m"] if section == "critic" else []
    e = _engine(_quiet([*base, f"{section}.max_grad_norm=0.5", f"{section}.optim.weight_decay=0.3",
                        f"{section}.optim.lr_warmup_steps=4"]), section)
    assert e.max_grad_norm == 0.5 and e.optimizer.param_groups[0]["weight_decay"] == 0.3
    assert e.scheduler.get_last_lr()[0] == 0.0  # warming up from 0 over 4 steps
    ratio = _engine(_quiet([*base, f"{section}.optim.lr_warmup_ratio=0.5"]), section)  # 5 of the 10 updates
    for _ in range(4):
        ratio.optimizer.step()
        ratio.scheduler.step()
    assert ratio.scheduler.get_last_lr()[0] == pytest.approx(0.8 * ratio.optimizer.defaults["lr"])


LORA = ["use_peft=true", "lora_r=4", "lora_alpha=8", "lora_task_type=FEATURE_EXTRACTION", "lora_dropout=0.2",
        "lora_bias=all", "lora_modules_to_save=[lm_head]"]


@pytest.mark.parametrize("rslora", ["lora_use_rslora", "use_rslora"])
def test_lora_keys_reach_the_adapters(tiny_model_dir, rslora):
    from rllava.model.lora import apply_lora
    from rllava.model.loader import load_model

    m = _quiet([f"actor.model.{k}" for k in LORA + [f"{rslora}=true"]]).actor.model
    peft = apply_lora(load_model(tiny_model_dir, dtype=torch.float32), m).peft_config["default"]
    assert (peft.task_type, peft.lora_dropout, peft.bias, peft.use_rslora) == ("FEATURE_EXTRACTION", 0.2, "all", True)
    assert "lm_head" in peft.modules_to_save


def test_critic_keys_reach_the_value_model(tiny_model_dir, monkeypatch):
    """critic.model.* (LoRA, trust_remote_code, dynamic batching), critic batch sizes and critic.optim reach the
    critic that build_critic makes."""
    import transformers

    from rllava.algorithms.ppo import build_algorithm

    seen = []
    real = transformers.AutoConfig.from_pretrained
    monkeypatch.setattr("rllava.model.loader.AutoConfig.from_pretrained",
                        lambda path, **kw: seen.append(kw["trust_remote_code"]) or real(path, **kw))
    cfg = _quiet([f"actor.model.model_path={tiny_model_dir}", "algorithm.adv_estimator=gae",
                  "critic.model.trust_remote_code=true", "critic.log_prob_micro_batch_size=3",
                  "critic.model.dynamic_batching=true", "critic.forward_max_token_len_per_gpu=777",
                  "critic.max_grad_norm=0.25", "critic.optim.weight_decay=0.125",
                  *[f"critic.model.{k}" for k in LORA if "modules_to_save" not in k], "critic.model.use_rslora=true"])
    critic = B.build_critic(cfg, CPU, 2, build_algorithm(cfg.algorithm, cfg.actor))
    assert seen == [True]
    assert critic.values_batching.size == 3 and critic.values_batching.max_tokens == 777
    assert critic.engine.max_grad_norm == 0.25 and critic.engine.optimizer.param_groups[0]["weight_decay"] == 0.125
    peft = critic.model.lm.peft_config["default"] if hasattr(critic.model, "lm") else next(
        m.peft_config["default"] for m in critic.model.modules() if hasattr(m, "peft_config"))
    assert (peft.lora_dropout, peft.bias, peft.use_rslora, peft.task_type) == (0.2, "all", True, "FEATURE_EXTRACTION")


def test_critic_model_and_engine_keys_reach_the_critic(tiny_model_dir):
    """The value model reads critic.model.* as the policy reads actor.model.* (override_config, freezing, gradient
    checkpointing, attention, batching) and its engine critic.fsdp's offload switches and critic.ppo_* sizes."""
    from rllava.algorithms.ppo import build_algorithm

    cfg = _quiet([f"actor.model.model_path={tiny_model_dir}", "algorithm.adv_estimator=gae", "rollout.n=2",
                  "critic.model.override_config.initializer_range=0.5", "critic.model.freeze_vision_tower=true",
                  "critic.model.enable_gradient_checkpointing=true", "critic.model.attn_implementation=eager",
                  "critic.model.padding_free=true", "critic.model.dynamic_batching=true",
                  "critic.ppo_max_token_len_per_gpu=555", "critic.ppo_mini_batch_size=4", "critic.ppo_epochs=3",
                  "critic.fsdp.enable_cpu_offload=true", "critic.fsdp.offload_params=true",
                  "critic.fsdp.offload_optimizer=true", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4"])
    critic = B.build_critic(cfg, CPU, 2, build_algorithm(cfg.algorithm, cfg.actor))
    lm = critic.model.lm
    assert lm.config.initializer_range == 0.5 and lm.config._attn_implementation == "eager"
    assert lm.is_activation_checkpointing
    assert not any(p.requires_grad for n, p in lm.named_parameters() if "visual" in n)
    assert any(p.requires_grad for n, p in lm.named_parameters() if "visual" not in n)
    assert critic.micro_batching.max_tokens == 555 and critic.micro_batching.padding_free
    assert critic.mini_batch_size == 8 and critic.ppo_epochs == 3  # 4 prompts x rollout.n=2
    e = critic.engine
    assert e.cpu_optimizer and e.offload_params and e.offload_optimizer


def test_actor_and_ref_batch_sizes_and_trust_remote_code(tiny_model_dir, monkeypatch):
    import transformers

    from rllava.model.loader import build_policy

    seen = []
    real = transformers.AutoConfig.from_pretrained
    monkeypatch.setattr("rllava.model.loader.AutoConfig.from_pretrained",
                        lambda path, **kw: seen.append(kw["trust_remote_code"]) or real(path, **kw))
    cfg = _quiet([f"actor.model.model_path={tiny_model_dir}", "actor.model.trust_remote_code=true",
                  "actor.log_prob_micro_batch_size=5", "ref.log_prob_micro_batch_size=7"])
    model, _ = build_policy(cfg.actor.model, CPU)
    assert seen[0] is True  # the model's config (the processor's load follows)
    assert B.build_actor(cfg, model, CPU, 2).log_prob_batching.size == 5
    assert B.build_reference_role(cfg, model, CPU).batching.size == 7


def test_shared_prefix_reaches_actor_reference_and_critic(tiny_model_dir):
    """actor.model.shared_prefix: on by default under sdpa, off when false or (by default) under
    flash_attention_2, where asking for it is a start-up error; critic.model.shared_prefix likewise."""
    from rllava.algorithms.ppo import build_algorithm
    from rllava.model.loader import build_policy

    base = [f"actor.model.model_path={tiny_model_dir}", "algorithm.use_kl_loss=true", "actor.kl_loss_coef=0.1"]
    for keys, on in (([], True), (["actor.model.shared_prefix=false"], False)):
        cfg = _quiet(base + keys)
        model, _ = build_policy(cfg.actor.model, CPU)
        actor = B.build_actor(cfg, model, CPU, 2)
        assert actor.micro_batching.shared_prefix is on and actor.log_prob_batching.shared_prefix is on
        assert B.build_reference_role(cfg, model, CPU).batching.shared_prefix is on
    assert not _quiet(["actor.model.attn_implementation=flash_attention_2"]).actor.model.use_shared_prefix
    with pytest.raises(ConfigError, match="actor.model.shared_prefix=true needs"):
        load_config(["actor.model.attn_implementation=flash_attention_2", "actor.model.shared_prefix=true"])
    cfg = _quiet([f"actor.model.model_path={tiny_model_dir}", "algorithm.adv_estimator=gae",
                  "critic.model.shared_prefix=false"])
    assert not B.build_critic(cfg, CPU, 2, build_algorithm(cfg.algorithm, cfg.actor)).micro_batching.shared_prefix


def test_rollout_reads_skip_special_tokens(tiny_model_dir):
    from rllava.model.processor import load_processor

    processor = load_processor(tiny_model_dir)
    assert B.build_rollout(_quiet(["reward.skip_special_tokens=false"]), processor, CPU).skip_special_tokens is False
    assert B.build_rollout(_quiet([]), processor, CPU).skip_special_tokens is True


def test_trainer_keys_for_steps_names_and_checkpoints(tmp_path, monkeypatch):
    cfg = _quiet(["trainer.total_epochs=3", "trainer.experiment_name=exp7", "trainer.project_name=proj7",
                  f"trainer.save_checkpoint_path={tmp_path}/ck"])
    assert B.total_steps(cfg, type("S", (), {"__len__": lambda self: 4})()) == 12  # 3 epochs of 4 batches
    assert B.run_outputs_dir(cfg) == os.path.join("outputs", "proj7", "exp7")  # RLLaVA's layout
    assert B.run_outputs_dir(_quiet(["trainer.outputs_dir=~/runs", "trainer.experiment_name=a/b"])) == \
        os.path.expanduser("~/runs/rllava/a/b")
    assert _quiet(["algorithm.distill.teacher_path=~/t"]).algorithm.distill.teacher_path == os.path.expanduser("~/t")
    for bad in ("trainer.experiment_name=../up", "trainer.project_name=/abs", "trainer.experiment_name="):
        with pytest.raises(ConfigError, match=f"{bad.split('=')[0]}=.* names the run's folder under "
                                              "trainer.outputs_dir: give a relative name without '..'"):
            _quiet([bad])
    started = []
    monkeypatch.setattr("rllava.train.tracker.start_wandb", lambda *a: started.append(a[:2]))
    B.build_tracker(_quiet(["trainer.project_name=proj7", "trainer.logger=[wandb]"]), str(tmp_path))
    assert started == [("proj7", "agent")]  # wandb's project and run name
    assert C.checkpoint_root(cfg, "out") == f"{tmp_path}/ck"
    step = tmp_path / "ck" / "global_step_2"
    step.mkdir(parents=True)
    (step / C.STATE_FILE).write_text("{}")
    assert C.find_resume(cfg, "out") == str(step)  # resume=auto picks the newest checkpoint ...
    assert C.find_resume(_quiet([f"trainer.save_checkpoint_path={tmp_path}/ck", "trainer.find_last_checkpoint=false"]),
                         "out") is None  # ... unless find_last_checkpoint=false


def _run(tmp_path, model, data, *extra):
    from rllava.train.pipeline import rlvr

    out = tmp_path / "run"
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
               f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=4",
               "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "data.val_batch_size=4",
               "trainer.max_steps=1", "trainer.val_freq=-1", *keys_for(out), "trainer.logger=[jsonl]",
               *extra])
    return out


def test_val_only_validates_and_trains_nothing(tmp_path, tiny_model_dir, counting_dir, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = _run(tmp_path, tiny_model_dir, counting_dir, "trainer.val_only=true")
    rows = [json.loads(x) for x in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [0] and "val/accuracy" in rows[0] and not (out / "final").exists()


def test_hf_merge_lora_false_exports_the_base_weights(tmp_path, tiny_model_dir, counting_dir, monkeypatch,
                                                      distinct_reward):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    out = _run(tmp_path, tiny_model_dir, counting_dir, "trainer.val_before_train=false", "actor.model.use_peft=true",
               "actor.model.lora_r=4", "actor.model.lora_alpha=8", "actor.optim.lr=1e-2",
               f"reward.reward_function={distinct_reward}", "trainer.hf_merge_lora=false")
    from safetensors.torch import load_file

    base, final = (load_file(os.path.join(p, "model.safetensors")) for p in (tiny_model_dir, out / "final"))
    adapted = [k for k in final if "q_proj.weight" in k]
    assert adapted and all(torch.equal(final[k], base[k]) for k in adapted)  # merged (the default) would differ
    assert (out / "final" / "adapter").is_dir()


def test_ref_model_path_and_trainer_seed():
    from rllava.errors import RllavaError

    cfg = _quiet(["ref.model_path=/no/such/ref", "actor.model.model_path=/no/such/actor"])
    with pytest.raises(RllavaError, match="ref.model_path='/no/such/ref'"):  # the reference loads its own weights
        B.build_reference_role(cfg, torch.nn.Linear(2, 2), CPU)
    B.seed_sampling(_quiet(["trainer.seed=123"]))
    drawn = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(drawn, torch.rand(3))


def test_lengths_batch_sizes_and_tokenizer_path(tiny_model_dir, counting_dir):
    """data.max_prompt_length / filter_overlong_prompts decide which records stay; data.max_response_length is
    the sampling budget; rollout.micro_batch_size the HF engine's generate batch; actor.model.tokenizer_path the
    processor loaded."""
    from rllava.errors import RllavaError
    from rllava.model.loader import build_policy
    from rllava.model.processor import load_processor

    processor = load_processor(tiny_model_dir)
    data = [f"data.train_files={counting_dir}/train.jsonl", "data.prompt_key=problem", "data.max_samples=4",
            "data.max_prompt_length=5", "trainer.val_before_train=false"]
    with pytest.raises(RllavaError):  # every prompt is longer than 5 tokens: nothing left to train on
        B.build_datasets(_quiet(data), processor)
    kept, _ = B.build_datasets(_quiet(data + ["data.filter_overlong_prompts=false"]), processor)
    assert len(kept) == 4
    cfg = _quiet(["data.max_response_length=7", "rollout.micro_batch_size=3"])
    assert B.sampling_params(cfg).max_new_tokens == 7
    assert B.build_rollout(cfg, processor, CPU).engine.micro_batch_size == 3
    with pytest.raises(RllavaError, match="/no/such/tokenizer"):
        build_policy(_quiet([f"actor.model.model_path={tiny_model_dir}",
                             "actor.model.tokenizer_path=/no/such/tokenizer"]).actor.model, CPU)
