"""HF Accelerate as a train engine (`actor.strategy=accelerate`; `pip install "rllava[accelerate]"`): the policy
and its AdamW prepared by `accelerate.Accelerator`, with the plugin Accelerate's own configuration names, as in
any Accelerate script:

    accelerate launch --config_file fsdp2.yaml -m rllava.train.pipeline.rlvr config=... actor.strategy=accelerate
    torchrun --nproc_per_node 8 -m rllava.train.pipeline.rlvr ... actor.strategy=accelerate \
        trainer.accelerate_config=fsdp2.yaml        # the same file, read here instead of by `accelerate launch`

Accelerate picks FSDP (fsdp_version: 2) on GPUs only: on CPUs its multi-process type is DDP over gloo, which is
what the CPU tests run. As with DeepSpeed, the training forward runs through the prepared wrapper (DDP's and
FSDP's hooks), installed as the policy's forward method (`rllava.model.forward.FSDP_FORWARD_METHOD`). The state
dicts, the rollout's gathered weights and the clipped step are FSDP2Engine's (torch.distributed.checkpoint's
state_dict API serves a DDP-wrapped and an FSDP2 model alike), so checkpoints resume across engines.
"""

from __future__ import annotations

import os

import torch

from rllava.engine.train.deepspeed import LogprobForward
from rllava.engine.train.fsdp2 import FSDP2Engine
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
        if self.acc.state.distributed_type.value == "DEEPSPEED":
            raise ConfigError(f"{'trainer.accelerate_config' if config_file else 'accelerate launch'}'s config: "
                              "Accelerate's DeepSpeed plugin steps the optimizer inside backward; use "
                              "actor.strategy=deepspeed (rllava's ZeRO engine, the same keys)")
        self.device, self.max_grad_norm, self.skip_grad_norm = device, max_grad_norm, skip_grad_norm
        self.reshard_after_forward, self.offload_optimizer, self.cpu_optimizer = True, False, False  # update_phase
        self.model = self.optimizer = self.scheduler = None

    def prepare(self, model, make_optimizer, make_scheduler):
        policy = not hasattr(model, "value_head")
        optimizer = make_optimizer([p for p in model.parameters() if p.requires_grad])
        wrapped, prepared = self.acc.prepare(LogprobForward(model) if policy else model, optimizer)
        self.optimizer = prepared.optimizer  # the torch optimizer (FSDP2: over the sharded parameters)
        self.scheduler = make_scheduler(self.optimizer)
        if policy:
            setattr(model, FSDP_FORWARD_METHOD, wrapped.__call__)
        self.model = model if policy else wrapped
        return self.model

    def shard_frozen(self, model: torch.nn.Module, cpu_offload: bool = False) -> torch.nn.Module:
        """A frozen model (the reference, a teacher): every rank holds it whole, on the device."""
        return model.requires_grad_(False).to(self.device)
