"""Run by tests/engine/test_sharded_engines.py under `torchrun --nproc_per_node=W` (or plain python for W=1): one
Actor update (the real role: PPO clip + entropy bonus, dynamic packed micro-batches, the training forward
through `token_logprobs`) of a tiny Qwen2-VL on a fixed global batch of image prompts, each rank on its
contiguous share of the rows, with plain SGD so that the weights after the step expose the gradient.

    python actor_worker.py MODEL_DIR OUT_DIR STRATEGY [SP LAYOUT]      (STRATEGY: as fsdp_worker.py's)

With SP (Ulysses, `rllava.model.ulysses`): the model made trainable as the pipeline does (gradient checkpointing, its
decoder sequence-parallel over groups of SP ranks; SP=1: checkpointing alone), LAYOUT `packed` or `padded`.

Writes OUT_DIR/result.pt (rank 0): the global token count, the old log-probs and the full weights after.
"""

import os
import sys

import torch
from PIL import Image

from rllava import distributed as D
from rllava.algorithms.ppo import build_algorithm
from rllava.config.schema import ActorConfig, AlgorithmConfig, ModelConfig
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.model import ulysses
from rllava.model.loader import load_model, make_trainable
from rllava.model.processor import get_tokenizer, load_processor
from rllava.roles.actor import Actor

from fsdp_worker import make_engine  # noqa: E402  (this script's own folder is on sys.path)

# (image size, prompt words, response tokens): 4 rows of different lengths, two per rank
ROWS = [((56, 56), 1, 7), ((84, 56), 4, 3), ((56, 112), 2, 12), ((56, 56), 0, 5)]


def global_batch(model_dir):
    proc = load_processor(model_dir)
    tok = get_tokenizer(proc)
    g = torch.Generator().manual_seed(0)
    trajectories = []
    for i, (size, words, n) in enumerate(ROWS):
        content = [{"type": "image"}, {"type": "text", "text": "How many" + " red" * words}]
        text = proc.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=False)
        enc = proc(text=[text], images=[Image.new("RGB", size, (40 * i, 90, 200))], return_tensors="pt")
        mm = {k: v for k, v in enc.items() if k in ("pixel_values", "image_grid_thw")}
        response = torch.randint(20, len(tok), (n,), generator=g).tolist()
        trajectories.append(Trajectory(sample=Sample(i, [], [], None), group_id=i, mm_inputs=mm, segments=[
            Segment(enc["input_ids"][0].tolist(), trained=False), Segment(response, trained=True)]))
    batch = collate(trajectories, tok.pad_token_id)
    batch.advantages = torch.randn(batch.loss_mask.shape, generator=g) * batch.loss_mask
    return batch


def main(model_dir, out_dir, strategy, sp=None, layout="packed"):
    device = D.init("cpu")
    torch.manual_seed(0)
    engine = make_engine(strategy, device)
    model = load_model(model_dir, dtype=torch.float32)
    if sp is not None:
        ulysses.init(int(sp))
        model = make_trainable(model, ModelConfig(enable_gradient_checkpointing=True), device)
    engine.prepare(model, lambda p: torch.optim.SGD(p, lr=1.0), lambda o: None)
    batch = global_batch(model_dir)
    batch = batch.select(D.shard(list(range(len(batch))), "rows"))
    share = len(batch)
    actor = Actor(engine.model, engine, build_algorithm(AlgorithmConfig(), ActorConfig()), ppo_epochs=1,
                  mini_batch_size=share, micro_batch_size=1, log_prob_micro_batch_size=1,
                  loss_agg_mode="token-mean", max_response_length=16, temperature=0.8, use_kl_loss=False,
                  kl_loss_coef=0.0, kl_loss_type="low_var_kl", entropy_coeff=0.01, padding_free=layout == "packed",
                  max_token_len=60, log_prob_max_token_len=60, logprob_chunk_size=4)
    old = actor.compute_logprobs(batch)
    batch.old_logprobs = old - 0.05 * batch.loss_mask  # off-policy enough for some clipping
    metrics = actor.update(batch)
    olds = [torch.zeros(0)] * D.world_size()
    if D.world_size() > 1:
        torch.distributed.all_gather_object(olds, old)
    else:
        olds = [old]
    weights = engine.full_state_dict()
    if D.is_main():
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"old_logprobs": olds, "grad_norm": metrics["actor/grad_norm"], "weights": weights},
                   os.path.join(out_dir, "result.pt"))
    D.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
    D.exit_process(0)  # as the pipelines end under torchrun: no race with gloo's threads at exit
