"""The Python API: the RLVR run of `python -m rllava.train.pipeline.rlvr`, from a notebook or a script, with a
model and records built in Python.

    from rllava import RLVRPipeline

    pipeline = RLVRPipeline(model, "examples/custom/config.yaml", train_records, val_records, processor=processor)
    outputs_dir = pipeline.run()
    RLVRPipeline.from_config({"actor.model.model_path": DIR, "data.train_files": FILE, ...}).run()

`run()` is `rllava.train.pipeline.rlvr.train`: the same step, loop, checks, outputs and checkpoints as the
command line, with the model and records handed to `build_run` (`rllava.train.loop.Given`) instead of loaded
from `actor.model.model_path` and `data.train_files` / `data.val_files`.

- config: a YAML path, a dict (nested sections or dotted keys), a `PPOConfig`, argv-style args
  (`["config=FILE", "key=value"]`) or None (the defaults), checked as the command line's (`as_config`).
- model: a `transformers` model, trained in place, or None (`actor.model.model_path` is loaded), or a path
  (as `actor.model.model_path`). A model passed in wins over the config: `actor.model.model_path` becomes its
  `name_or_path` (a warning says so when the config named another), which config.yaml, checkpoints and the
  outputs dir's identity record and which vLLM / SGLang (synced before every rollout), the critic and, under
  FSDP2, the KL reference start from (a warning names the last two when they load). `actor.model.*` switches
  apply to it as to a loaded model (torch_dtype, attn_implementation, freezing, LoRA, gradient checkpointing).
  `processor=`: its processor or tokenizer; default: loaded from `actor.model.tokenizer_path`, else
  `model.name_or_path`.
- train_dataloader / val_dataloader: records with a data file's fields (`data.prompt_key`, `answer_key`,
  `image_key`: paths, bytes, base64 or PIL images), as a list or any iterable of dicts, a `datasets.Dataset`, a
  torch DataLoader over such records (its dataset is read; batches are `data.train_batch_size` prompts) or a
  `rllava.data.dataset.PromptDataset` (used as built). Checked as a file's records, errors naming
  "train_dataloader record N"; relative image paths resolve against data.train_image_dir / val_image_dir, else
  the working directory. Given records replace data.train_files / val_files (set to "", with a warning if the
  config named files). val_dataloader is optional and used when the config validates (trainer.val_freq,
  val_before_train).

Errors are the command line's: a `RllavaError` (ConfigError, DataError, ...) whose message is one line naming
the key, file or record.
"""

from __future__ import annotations

import logging
import os

import torch

from rllava import distributed as D
from rllava.config import ConfigError, PPOConfig, as_config
from rllava.config.schema import resolve_strategy
from rllava.model.loader import ModelLoadError
from rllava.model.processor import load_processor
from rllava.train.builders import validates
from rllava.train.loop import Given

log = logging.getLogger(__name__)


class RLVRPipeline:
    """`RLVRPipeline(model, config, train_dataloader, val_dataloader, processor=None).run() -> outputs_dir`."""

    def __init__(self, model=None, config=None, train_dataloader=None, val_dataloader=None, *, processor=None):
        self.cfg: PPOConfig = as_config(config)
        m = self.cfg.actor.model
        if isinstance(model, (str, os.PathLike)):
            m.model_path, model = os.fspath(model), None
        if model is None:
            if processor is not None:
                raise ConfigError("RLVRPipeline: processor= goes with a model passed in; with actor.model.model_path "
                                  "set actor.model.tokenizer_path to load another processor")
        else:
            if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
                raise ConfigError(f"RLVRPipeline: model must be a transformers model (or None, or a path), got a "
                                  f"{type(model).__name__}")
            path = getattr(model, "name_or_path", "") or None
            if m.model_path and m.model_path != path:
                log.warning("RLVRPipeline trains the model passed in (name_or_path=%r); actor.model.model_path=%r "
                            "of the config is not loaded", path, m.model_path)
            m.model_path = path
            processor = processor if processor is not None else self._load_processor(path)
            c, a = self.cfg, self.cfg.algorithm
            sharded = resolve_strategy(c.actor.strategy, None, c.actor.fsdp, c.trainer.device) in ("fsdp", "fsdp2")
            loaders = ([f"the KL reference (actor.strategy={c.actor.strategy})"] if not c.ref.model_path and (
                a.use_kl_loss or a.use_kl_in_reward) and sharded
                else []) + (["the critic"] if c.critic is not None and not c.critic.model.model_path else [])
            if loaders:
                log.warning("%s: loaded from actor.model.model_path=%r (the model's name_or_path), not from the "
                            "weights passed in", " and ".join(loaders), path)
        d = self.cfg.data
        for key, records, batch in (("train", train_dataloader, d.train_batch_size),
                                    ("val", val_dataloader, d.val_batch_size)):
            if records is None:
                continue
            if getattr(d, f"{key}_files"):
                log.warning("RLVRPipeline: the %s records passed in are used; data.%s_files=%r of the config is not "
                            "read", key, key, getattr(d, f"{key}_files"))
            setattr(d, f"{key}_files", "")
            size = getattr(records, "batch_size", None) if type(records).__name__ == "DataLoader" else None
            if size not in (None, batch):
                log.warning("RLVRPipeline: the %s DataLoader's batch_size=%d is not read: batches are "
                            "data.%s_batch_size=%d prompts", key, size, key, batch)
        if val_dataloader is not None and not validates(self.cfg):
            log.warning("RLVRPipeline: the val records passed in are not used: the config never validates (set "
                        "trainer.val_freq or trainer.val_before_train=true)")
        self.given = Given(model, processor, train_dataloader, val_dataloader)

    @classmethod
    def from_config(cls, config) -> "RLVRPipeline":
        """Model and data from the config (a YAML path, a dict or a PPOConfig), as the command line runs it."""
        return cls(None, config)

    def _load_processor(self, path: str | None):
        m = self.cfg.actor.model
        source = m.tokenizer_path or path
        if not source:
            raise ModelLoadError("RLVRPipeline: the model passed in has no name_or_path to load its processor from: "
                                 "pass processor= (its processor or tokenizer)")
        try:
            return load_processor(source, m.trust_remote_code)
        except (OSError, ValueError, ImportError) as e:
            raise ModelLoadError(f"RLVRPipeline: no processor/tokenizer at {source!r} ({type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}): pass processor=") from e

    def run(self) -> str:
        """Train as configured; returns the outputs directory (final/ holds the trained model)."""
        from rllava.train.pipeline.rlvr import train

        outputs_dir = train(self.cfg, self.given)
        D.close()  # as the command line after a run: the process group (FSDP2 as a world of one) is left
        return outputs_dir
