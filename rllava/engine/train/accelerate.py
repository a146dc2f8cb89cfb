"""HF Accelerate as a train engine (`actor.strategy=accelerate`; `pip install "rllava[accelerate]"`): the policy
and its AdamW prepared by `accelerate.Accelerator`, with the plugin Accelerate's own configuration names, as in
any Accelerate script:

    accelerate launch --config_file fsdp2.yaml -m rllava.train.pipeline.rlvr config=... actor.strategy=accelerate
    torchrun --nproc_per_node 8 -m rllava.train.pipeline.rlvr ... actor.strategy=accelerate \
        trainer.accelerate_config=fsdp2.yaml        # the same file, read here instead of by `accelerate launch`

Accelerate picks FSDP (fsdp_version: 2) on GPUs under a launcher only: on CPUs its multi-process type is DDP over
gloo (the CPU tests run both, FSDP2 with the state its GPU branch sets). As with DeepSpeed, the training forward
runs through the prepared wrapper (DDP's and FSDP's hooks), installed as the policy's forward method
(`rllava.model.forward.FSDP_FORWARD_METHOD`); under FSDP2 that wrapper is the root, gathered with its units for
HF generate. The state dicts (by the inner model's names), the rollout's gathered weights and the clipped step
are FSDP2Engine's over the same parameters, so checkpoints resume across engines.
"""

from __future__ import annotations

import os

import torch
from torch.distributed.fsdp import FSDPModule

from rllava.engine.train.deepspeed import LogprobForward
from rllava.engine.train.fsdp2 import FSDP2Engine, shard_units
from rllava.errors import ConfigError
from rllava.model.forward import FSDP_FORWARD_METHOD


def accelerate_env(path: str) -> dict[str, str]:
    """The environment `accelerate launch --config_file path` gives its processes (ACCELERATE_USE_FSDP, FSDP_*,
    ACCELERATE_MIXED_PRECISION, ...), made by Accelerate's own launcher code."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    if not os.path.isfile(path):
        raise ConfigError(f"trainer.accelerate_config={path}: no such file (write one with `accelerate config`)")
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(["--config_file", path, "-"]))
    return {k: str(v) for k, v in prepare_multi_gpu_env(args).items() if k.startswith(("ACCELERATE_", "FSDP_"))}


class AccelerateEngine(FSDP2Engine):
    def __init__(self, device: torch.device, max_grad_norm: float, skip_grad_norm: float | None = None, *,
                 config_file: str | None = None):
        try:
            from accelerate import Accelerator
            from accelerate.utils import DistributedDataParallelKwargs
        except ImportError as e:
            raise ConfigError(f'actor.strategy=accelerate needs Accelerate: pip install "rllava[accelerate]" ({e})')
        if config_file:
            os.environ.update(accelerate_env(config_file))
        # find_unused_parameters: a step without images leaves the vision tower without gradients
        self.acc = Accelerator(cpu=device.type == "cpu",
                               kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
        source = f"{'trainer.accelerate_config' if config_file else 'accelerate launch'}'s config"
        kind = self.acc.state.distributed_type.value
        if kind == "DEEPSPEED":
            raise ConfigError(f"{source}: Accelerate's DeepSpeed plugin steps the optimizer inside backward; use "
                              "actor.strategy=deepspeed (rllava's ZeRO engine, the same keys)")
        if self.acc.mixed_precision == "fp16":  # its GradScaler runs in accelerator.backward, which rllava skips
            raise ConfigError(f"{source}: mixed_precision: fp16 needs Accelerate's loss scaling, which rllava's "
                              "backward does not run; use mixed_precision: bf16")
        if kind == "FSDP" and getattr(self.acc.state.fsdp_plugin, "fsdp_version", 1) != 2:
            raise ConfigError(f"{source}: fsdp_version 1 (Accelerate's default) is FSDP1, whose flat parameters "
                              "this engine does not drive; set fsdp_config.fsdp_version: 2")
        super().__init__(device, max_grad_norm, skip_grad_norm)  # no offload: Accelerate's config holds its keys

    def prepare(self, model, make_optimizer, make_scheduler):
        """The root Accelerate prepares (FSDP2: shards last, owning the weights no unit took: embeddings, head) is
        the policy's LogprobForward; the roles keep the inner model, `self.root` is the root (`rollout_phase`)."""
        policy = not hasattr(model, "value_head")
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad])
        module = LogprobForward(model) if policy else model
        module._no_split_modules = sorted({type(m).__name__ for m in shard_units(model)})  # read by its wrap policy
        self.root, prepared = self.acc.prepare(module, optimizer)
        if isinstance(self.root, FSDPModule):  # the root now (HF generate runs a unit first), as shard_model does
            self.root._get_fsdp_state()._lazy_init()
        self.optimizer = prepared.optimizer  # the torch optimizer (FSDP2: over the sharded parameters)
        self.scheduler = make_scheduler(self.optimizer)
        if policy:
            setattr(model, FSDP_FORWARD_METHOD, self.root.__call__)
        self.model = model if policy else self.root
        return self.model

    def reshards_after_forward(self, unit) -> bool:
        """Accelerate's setting (`fsdp2_prepare_model`): its plugin's for the wrapped units, False for the root."""
        return unit is not self.root and self.acc.state.fsdp_plugin.reshard_after_forward

    def shard_frozen(self, model: torch.nn.Module, cpu_offload: bool = False) -> torch.nn.Module:
        """A frozen model (the reference, a teacher): every rank holds it whole, on the device."""
        return model.requires_grad_(False).to(self.device)
