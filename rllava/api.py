"""The Python API: the RLVR run of `python -m rllava.train.pipeline.rlvr`, from a notebook or a script, with a model
and records built in Python (docs/custom_task.md, "Driving it from Python"; messages: docs/troubleshooting.md).

    from rllava import RLVRPipeline

    pipeline = RLVRPipeline(model, "examples/custom/config.yaml", train_records, val_records, processor=processor)
    outputs_dir = pipeline.run()
    RLVRPipeline.from_config({"actor.model.model_path": DIR, "data.train_files": FILE, ...}).run()

`run()` is `rllava.train.pipeline.rlvr.train` (the command line's step, loop, checks, outputs and checkpoints), with the
model and records handed to `build_run` (`rllava.train.loop.Given`) instead of loaded. A model passed in wins over the
config: `actor.model.model_path` becomes its `name_or_path`, which vLLM / SGLang, the critic and, under FSDP2, the KL
reference start from; `processor=` defaults to one loaded from `actor.model.tokenizer_path`, else that path. The config
is anything `as_config` takes (a YAML path, a dict, a `PPOConfig`, argv-style args, None). Records replace
data.train_files / val_files. Errors: the command line's one-line `RllavaError`.
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
        if model is None and processor is not None:
            raise ConfigError("RLVRPipeline: processor= goes with a model passed in; with actor.model.model_path "
                              "set actor.model.tokenizer_path to load another processor")
        if model is not None:
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
