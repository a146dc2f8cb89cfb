"""Run by tests/engine/test_sharded_engines.py (plain python for 1 rank, torchrun for 2): actor.strategy=accelerate
with Accelerate's FSDP2 plugin, on CPU. Accelerate picks FSDP only in its multi-GPU branch (accelerate/state.py,
`AcceleratorState.__init__`: `distributed_type = DistributedType.FSDP` under `MULTI_GPU`), so after building the
engine from CONFIG (an `accelerate config` file: fsdp_version 2, TRANSFORMER_BASED_WRAP) the worker sets what that
branch sets: the state's distributed type FSDP and the FSDP plugin of the file. `accelerator.prepare` then runs
Accelerate's own FSDP2 preparation (`_prepare_fsdp2`, `fsdp2_prepare_model`: fully_shard per wrapped layer, then
the root, here rllava's LogprobForward).

    python accelerate_worker.py MODEL_DIR OUT_DIR CONFIG

Then the steps of an RLVR step, as the loop takes them, beside the same model unsharded (SingleDeviceEngine):
an HF rollout (greedy, through `generate_context`: the train engine's rollout_phase), the old log-probs (no grad),
one SGD step at lr 1 on the rollout's rows (every rank the same rows: FSDP's averaged gradient is their gradient),
a checkpoint (save_engine, into OUT_DIR/dcp) and a second rollout with the trained weights. Writes
OUT_DIR/result.pt (rank 0): both sides' rollouts (tokens, log-probs), old log-probs, grad norms and full weights;
the FSDP units.
"""

import os
import sys

import torch
from PIL import Image
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from rllava import distributed as D
from rllava.data.protocol import Sample, collate
from rllava.engine.inference.base import SamplingParams, generate_context
from rllava.engine.inference.hf import HFRolloutEngine
from rllava.engine.train.checkpoint import save_engine
from rllava.engine.train.single import SingleDeviceEngine
from rllava.model.forward import token_logprobs
from rllava.model.loader import load_model
from rllava.model.processor import get_tokenizer, load_processor
from rllava.roles.rollout import Rollout

GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)


def accelerate_fsdp2(config: str, device: torch.device):
    """AccelerateEngine from `config`, its state set as Accelerate's multi-GPU branch sets it (see the docstring)."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from rllava.engine.train.accelerate import AccelerateEngine

    engine = AccelerateEngine(device, max_grad_norm=1.0, config_file=config)
    engine.acc.state.distributed_type = DistributedType.FSDP
    engine.acc.state.fsdp_plugin = FullyShardedDataParallelPlugin()  # from the file's FSDP_* environment
    return engine


def samples():
    return [Sample(index=i, messages=[{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "How many" + " red" * i + "?"}]}],
        images=[Image.new("RGB", (56 + 28 * i, 56), (60 * i, 90, 200))], ground_truth=None) for i in range(3)]


def side(engine, model_dir: str, processor) -> dict:
    """The RLVR step of the docstring on `engine`; what it measured (every rank takes part)."""
    model = load_model(model_dir, dtype=torch.float32)
    engine.prepare(model, lambda p: torch.optim.SGD(p, lr=1.0), lambda o: None)
    tok = get_tokenizer(processor)
    hf = HFRolloutEngine(pad_token_id=tok.pad_token_id, stop_token_ids=[tok.eos_token_id], banned_token_ids=[],
                         micro_batch_size=8, device=engine.device)
    rollout = Rollout(hf, processor)

    def roll_out():
        with generate_context(hf, engine):
            return collate(rollout.generate(samples(), GREEDY), tok.pad_token_id)
    first = roll_out()
    with torch.no_grad():
        old, _ = token_logprobs(engine.model, first)
    # Accelerate leaves its root gathered after a forward (fsdp2_prepare_model: the root's reshard_after_forward
    # is torch's default, False); the units reshard (the plugin's fsdp_reshard_after_forward: true)
    layer = engine.model.model.language_model.layers[0].mlp.up_proj.weight
    out = {"sharded after a forward": (isinstance(engine.model.lm_head.weight, DTensor), isinstance(layer, DTensor))}
    with engine.update_phase():
        logp, _ = token_logprobs(engine.model, first)
        engine.backward(-(logp * first.loss_mask).sum() / first.loss_mask.sum())
        out["grad_norm"] = engine.optimizer_step()
    if not isinstance(engine, SingleDeviceEngine):
        save_engine(engine, os.path.join(OUT, "dcp"))
        out["units"] = sorted(n for n, m in engine.root.named_modules() if isinstance(m, FSDPModule))
    second = roll_out()
    return {**out, "old": old, "weights": engine.full_state_dict(),
            **{name: (b.input_ids, b.rollout_logprobs) for name, b in (("first", first), ("second", second))}}


def main(model_dir: str, config: str) -> None:
    device = D.init("cpu")
    D.group_of_one(device)  # 1 rank without torchrun: the process group FSDP needs
    processor = load_processor(model_dir)
    result = {"single": side(SingleDeviceEngine(device, max_grad_norm=1.0), model_dir, processor),
              "accelerate": side(accelerate_fsdp2(config, device), model_dir, processor)}
    if D.is_main():
        torch.save(result, os.path.join(OUT, "result.pt"))
    D.close()


if __name__ == "__main__":
    OUT = sys.argv[2]
    os.makedirs(OUT, exist_ok=True)
    main(sys.argv[1], sys.argv[3])
    D.exit_process(0)
