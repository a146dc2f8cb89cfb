"""The Python API (rllava.api.RLVRPipeline) on a tiny Qwen2-VL: the same run as the command line, with a model
and records passed in, configs in every form, checkpoints and resume, errors as one line, and a PPO subclass
registered in-process (a notebook's `@register_ppo`)."""

import json
import logging
import os

import pytest
import torch
from transformers import AutoModelForImageTextToText

from rllava import PPO, RLVRPipeline, register_ppo
from rllava.algorithms.registry import ALGORITHMS
from rllava.config import ConfigError, as_config
from rllava.data.dataset import PromptDataset
from rllava.data.records import DataError
from rllava.errors import RllavaError
from rllava.model.processor import load_processor
from rllava.train import builders as B
from rllava.train.pipeline import rlvr
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _args(model, data, out, reward, *extra):
    return ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
            f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", "data.max_samples=8",
            "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4", "data.max_response_length=8",
            "trainer.max_steps=2", "trainer.val_freq=2", "data.val_batch_size=8", *keys_for(out),
            "trainer.logger=[jsonl]", f"reward.reward_function={reward}", *extra]


def _records(data, split):
    """The data file's records as dicts in memory, their images as absolute paths."""
    rows = [json.loads(line) for line in open(os.path.join(data, f"{split}.jsonl"))]
    return [{**r, "images": [os.path.join(data, p) for p in r["images"]]} for r in rows]


def _steps(out):
    """metrics.jsonl without the clocks: what two identical runs must share exactly."""
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/", "time/"))} for r in rows]


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_a_model_and_records_passed_in_run_as_the_command_line(tmp_path, tiny_model_dir, counting_dir,
                                                               distinct_reward, caplog):
    cli, api, api_cfg = (str(tmp_path / n) for n in ("cli", "api", "api_cfg"))
    rlvr.main(_args(tiny_model_dir, counting_dir, cli, distinct_reward))
    # the model and its records built in Python; the config names another model path and data files
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    with caplog.at_level(logging.WARNING):
        pipeline = RLVRPipeline(model, _args("elsewhere", "nowhere", api, distinct_reward),
                                _records(counting_dir, "train")[:8], _records(counting_dir, "val")[:8])
    assert "actor.model.model_path='elsewhere' of the config is not loaded" in caplog.text
    assert "data.train_files='nowhere/train.jsonl' of the config is not read" in caplog.text
    assert pipeline.run() == api
    assert _steps(api) == _steps(cli)  # the same steps, metrics and validations, number for number
    saved = AutoModelForImageTextToText.from_pretrained(os.path.join(api, "final"))
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), model.state_dict().values()))
    written = as_config(os.path.join(api, "config.yaml"))  # the passed model's path and no data files
    assert written.actor.model.model_path == tiny_model_dir and written.data.train_files == ""
    # from_config: a YAML path, a dict and the dataclass give the command line's run too
    cfg = as_config(_args(tiny_model_dir, counting_dir, api_cfg, distinct_reward))
    assert RLVRPipeline.from_config(cfg).run() == api_cfg
    assert _steps(api_cfg) == _steps(cli)


def test_roles_that_load_the_model_path_say_so(tiny_model_dir, caplog):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    with caplog.at_level(logging.WARNING):
        RLVRPipeline(model, {"critic": {}, "algorithm.adv_estimator": "gae", "actor.strategy": "fsdp2"})
    assert (f"the KL reference (actor.strategy=fsdp2) and the critic: loaded from actor.model.model_path="
            f"'{tiny_model_dir}' (the model's name_or_path), not from the weights passed in") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # one device: the reference is a copy of the weights passed in
        RLVRPipeline(model, {"actor.strategy": "single"})
    assert "loaded from" not in caplog.text


def test_inputs_the_run_does_not_read_are_named(tiny_model_dir, caplog):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    records = [{"problem": "<image>How many?", "answer": "1", "images": []}] * 8
    with caplog.at_level(logging.WARNING):
        config = {"trainer.val_freq": -1, "trainer.val_before_train": False, "data.train_batch_size": 4,
                  "actor.ppo_mini_batch_size": 4}
        RLVRPipeline(model, config, torch.utils.data.DataLoader(records, batch_size=2), records)
    assert "the train DataLoader's batch_size=2 is not read: batches are data.train_batch_size=4 prompts" in caplog.text
    assert "the val records passed in are not used: the config never validates" in caplog.text


def test_the_actor_model_switches_apply_to_a_model_passed_in(tiny_model_dir, caplog):
    from rllava.model.loader import adopt_policy

    cpu = torch.device("cpu")
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    cfg = as_config({"actor.model.attn_implementation": "eager", "actor.model.freeze_vision_tower": True})
    with caplog.at_level(logging.WARNING):
        adopted = adopt_policy(model, cfg.actor.model, cpu)  # torch_dtype null: float32 on a CPU, as when loaded
    assert "actor.model.torch_dtype=None: the model passed in (bfloat16) is cast to float32" in caplog.text
    assert adopted.dtype == torch.float32 and adopted.config._attn_implementation == "eager"
    assert not any(p.requires_grad for n, p in adopted.named_parameters() if "visual" in n)
    cfg = as_config({"actor.model.torch_dtype": "bfloat16"})
    assert adopt_policy(AutoModelForImageTextToText.from_pretrained(tiny_model_dir), cfg.actor.model,
                        cpu).dtype == torch.bfloat16


def test_checkpoints_and_resume_with_a_model_passed_in(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    out = str(tmp_path / "run")
    records = _records(counting_dir, "train")[:8]

    def run(steps):
        model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
        cfg = _args(tiny_model_dir, counting_dir, out, distinct_reward, f"trainer.max_steps={steps}",
                    "trainer.save_freq=1", "trainer.val_before_train=false", "trainer.val_freq=-1")
        return RLVRPipeline(model, cfg, records, processor=load_processor(tiny_model_dir)).run()

    run(1)
    run(2)  # the same run, longer: resumes from global_step_1
    assert [r["step"] for r in _steps(out) if "reward/mean" in r] == [1, 2]
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["global_step_1", "global_step_2",
                                                                     "latest_checkpointed_iteration.txt"]
    AutoModelForImageTextToText.from_pretrained(os.path.join(out, "final"))
    load_processor(os.path.join(out, "final"))


def test_records_in_every_form(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    import datasets
    from PIL import Image

    cfg = as_config(_args(tiny_model_dir, counting_dir, str(tmp_path / "x"), distinct_reward))
    processor = load_processor(tiny_model_dir)
    rows = _records(counting_dir, "train")[:4]
    in_memory = [{**r, "images": [Image.open(r["images"][0])]} for r in rows]  # PIL images
    relative = [{**r, "images": [os.path.relpath(r["images"][0], counting_dir)]} for r in rows]
    cfg.data.train_image_dir = counting_dir  # relative paths resolve against it
    for given in (rows, iter(rows), datasets.Dataset.from_list(rows), in_memory, relative,
                  torch.utils.data.DataLoader(rows, batch_size=2)):
        ds = PromptDataset("train_dataloader", cfg.data, processor, records=given,
                           image_dir=cfg.data.train_image_dir)
        assert len(ds) == 4 and ds[0].images and ds[0].ground_truth == rows[0]["answer"]
        assert ds[0].where == "train_dataloader record 0"
    assert B.build_datasets(cfg, processor, given=(ds, None))[0] is ds  # an rllava dataset: used as built


def test_bad_records_name_the_record_as_a_file_does(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    cfg = as_config(_args(tiny_model_dir, counting_dir, str(tmp_path / "x"), distinct_reward))
    processor = load_processor(tiny_model_dir)
    rows = _records(counting_dir, "train")[:4]
    bad = [rows[0], {k: v for k, v in rows[1].items() if k != "answer"}, *rows[2:]]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in bad))

    def error(spec, **kw):
        with pytest.raises(DataError) as e:
            PromptDataset(spec, cfg.data, processor, **kw)
        return str(e.value)

    from_file, from_memory = error(str(path)), error("train_dataloader", records=bad)
    assert from_memory == from_file.replace(str(path), "train_dataloader")
    assert from_memory.startswith("train_dataloader record 1 has no 'answer' (data.answer_key")
    assert "train_dataloader record 2, images[0]" in error(
        "train_dataloader", records=[rows[0], rows[1], {**rows[2], "images": ["missing.png"]}, rows[3]])
    assert error("train_dataloader", records=["a prompt"]) == ("train_dataloader: item 0 is a str, expected a dict "
                                                               "(a record with the fields data.prompt_key, "
                                                               "data.answer_key, ...)")
    assert error("train_dataloader", records={"problem": ["a"]}).startswith("train_dataloader: expected records")
    assert error("train_dataloader", records=[]) == "train_dataloader: no records"


def test_pipeline_errors_are_one_line(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    args = _args(tiny_model_dir, counting_dir, str(tmp_path / "x"), distinct_reward)
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.max_stepz' \(in the config dict\); did you "
                                          r"mean 'trainer.max_steps'\?"):
        RLVRPipeline.from_config({"trainer": {"max_stepz": 2}})
    with pytest.raises(ConfigError, match="config file 'nope.yaml' not found"):
        RLVRPipeline.from_config("nope.yaml")
    with pytest.raises(ConfigError, match="model must be a transformers model"):
        RLVRPipeline(object(), args)
    with pytest.raises(ConfigError, match="processor= goes with a model passed in"):
        RLVRPipeline(None, args, processor=load_processor(tiny_model_dir))
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model.name_or_path = ""
    with pytest.raises(RllavaError, match="no name_or_path to load its processor from: pass processor="):
        RLVRPipeline(model, args)
    with pytest.raises(RllavaError, match="actor.model.override_config changes a model's config before"):
        RLVRPipeline(model, [*args, "actor.model.override_config={use_cache: false}"],
                     processor=load_processor(tiny_model_dir)).run()
    cfg = as_config(args)
    cfg.data.train_batch_size = 3  # changed after it was built: checked again
    with pytest.raises(ConfigError, match="data.train_batch_size=3 must be a multiple of actor.ppo_mini_batch_size=2"):
        RLVRPipeline.from_config(cfg)
    with pytest.raises(DataError, match="train_dataloader: records have no field 'answer'"):
        RLVRPipeline(tiny_model_dir, args, [{"problem": "<image>How many?", "images": []}]).run()


def test_a_ppo_subclass_registered_in_process(tmp_path, tiny_model_dir, counting_dir, distinct_reward):
    """The seed README's `@register_ppo` class, defined where the run starts (a notebook cell): no plugin file."""
    calls = []

    def define():
        @register_ppo("test_api_centered")
        class Centered(PPO):
            def compute_advantage(self, batch):
                means = torch.zeros(int(batch.group_ids.max()) + 1).index_add_(0, batch.group_ids, batch.scores)
                means /= torch.bincount(batch.group_ids)
                advantages = (batch.scores - means[batch.group_ids])[:, None] * batch.loss_mask
                calls.append(advantages)
                return advantages

        return Centered

    try:
        first = define()
        assert define() is not first and ALGORITHMS["test_api_centered"] is not first  # a cell run again replaces it
        out = str(tmp_path / "run")
        RLVRPipeline.from_config(_args(tiny_model_dir, counting_dir, out, distinct_reward, "trainer.max_steps=1",
                                       "trainer.val_before_train=false", "trainer.val_freq=-1",
                                       "algorithm.adv_estimator=test_api_centered")).run()
        assert len(calls) == 1 and calls[0].shape[0] == 8 and calls[0].abs().sum() > 0
        assert as_config(os.path.join(out, "config.yaml")).algorithm.adv_estimator == "test_api_centered"
        with pytest.raises(ValueError, match="'test_api_centered' is already registered by"):
            register_ppo("test_api_centered")(type("Centered", (PPO,), {}))  # another class under the same name
    finally:
        ALGORITHMS.pop("test_api_centered", None)
