"""Run by tests/engine/test_sharded_engines.py under `torchrun --nproc_per_node=W` (or plain python for W=1): one
Actor update (the real role: PPO clip + entropy bonus, dynamic packed micro-batches, the training forward
through `token_logprobs`) of a tiny Qwen2-VL on a fixed global batch of image prompts, each rank on its
contiguous share of the rows, with plain SGD so that the weights after the step expose the gradient.

    python actor_worker.py MODEL_DIR OUT_DIR STRATEGY [SP LAYOUT [ROWS]]      (STRATEGY: as fsdp_worker.py's)

With SP (Ulysses, `rllava.model.ulysses`): the model made trainable as the pipeline does (gradient checkpointing, its
decoder sequence-parallel over groups of SP ranks; SP=1: checkpointing alone), LAYOUT `packed` or `padded`. ROWS
(`ppo`, `luffy`, `hpt`): `six_rows` instead, in micro-batches of one row, with that SFT+RL hybrid's loss (luffy, hpt;
luffy with token-level rollout IS) or PPO's.

Writes OUT_DIR/result.pt (rank 0): the old log-probs, the update's metrics (averaged over the ranks), the loss (the
sum of the micro-batches' losses, averaged over the ranks) and the full weights after.
"""

import os
import sys
from dataclasses import replace

import torch
from PIL import Image

from rllava import distributed as D
from rllava.algorithms.ppo import build_algorithm
from rllava.config.schema import ActorConfig, AlgorithmConfig, ModelConfig
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.model import ulysses
from rllava.model.loader import load_model, make_trainable
from rllava.model.processor import get_tokenizer, load_processor
from rllava.roles.actor import Actor, ExpertLoss

from fsdp_worker import make_engine  # noqa: E402  (this script's own folder is on sys.path)

# (image size, prompt words, response tokens): 4 rows of different lengths, two per rank
ROWS = [((56, 56), 1, 7), ((84, 56), 4, 3), ((56, 112), 2, 12), ((56, 56), 0, 5)]


def trajectories(model_dir):
    """(ROWS' trajectories, the pad id, the generator that drew their responses)."""
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
    return trajectories, tok.pad_token_id, g


def global_batch(model_dir):
    rows, pad, g = trajectories(model_dir)
    batch = collate(rows, pad)
    batch.advantages = torch.randn(batch.loss_mask.shape, generator=g) * batch.loss_mask
    return batch


def six_rows(model_dir, mode, rank=None):
    """The rows of a 6-row batch that `rank` holds of two (None: all of them), collated as that rank's alone, so that
    off_policy_mask / sft_only / rollout_logprobs are None where it has none of them. Rank 0: rows 0, 1, 5 (a copy
    of 1), sampled, with the rollout's log-probs; rank 1: rows 2, 3, 4 (row 2's prompt, 11 given tokens), which hold
    every expert token of a hybrid's: luffy: all three are the expert's (prefix ratio 1); hpt: row 4 is the
    demonstration (sft_only) of row 2's group, switched to it (row 2 out of the loss); ppo: all sampled. Advantages:
    random per row (seeded by its number, so alike in every layout), 0 on a demonstration."""
    rows, pad, _ = trajectories(model_dir)
    rows.append(replace(rows[2], group_id=4, sft_only=mode == "hpt", segments=[
        rows[2].segments[0], Segment(list(range(30, 41)), trained=True)]))
    rows.append(replace(rows[1], group_id=5))
    for i, t in enumerate(rows):
        prompt, response = t.segments
        expert = mode == "luffy" and i in (2, 3, 4) or mode == "hpt" and i == 4
        t.segments = [prompt, replace(response, off_policy=True) if expert else
                      replace(response, logprobs=[-8.0 - 0.25 * k for k in range(len(response.token_ids))])]
    keep = [[0, 1, 5], [2, 3, 4]][rank] if rank is not None else [0, 1, 5, 2, 3, 4]
    batch = collate([rows[i] for i in keep], pad)
    batch.loss_mask[[k for k, i in enumerate(keep) if i == 2 and mode == "hpt"]] = 0
    demo = batch.sft_only if batch.sft_only is not None else torch.zeros(len(keep), dtype=torch.bool)
    noise = torch.stack([torch.randn(512, generator=torch.Generator().manual_seed(i))[:batch.input_ids.shape[1]]
                         for i in keep])
    batch.advantages = noise * batch.loss_mask * ~demo[:, None]
    return batch


def main(model_dir, out_dir, strategy, sp=None, layout="packed", rows=None):
    device = D.init("cpu")
    torch.manual_seed(0)
    engine = make_engine(strategy, device)
    model = load_model(model_dir, dtype=torch.float32)
    if sp is not None:
        ulysses.init(int(sp))
        model = make_trainable(model, ModelConfig(enable_gradient_checkpointing=True), device)
    engine.prepare(model, lambda p: torch.optim.SGD(p, lr=1.0), lambda o: None)
    if rows is None:
        batch = global_batch(model_dir)
        batch = batch.select(D.shard(list(range(len(batch))), "rows"))
    else:
        batch = six_rows(model_dir, rows, D.rank() if D.world_size() > 1 else None)
    share = len(batch) if rows is None else 6 // D.world_size()  # six_rows: one mini-batch of the 6
    hybrid = rows if rows in ("luffy", "hpt") else None
    actor = Actor(engine.model, engine, build_algorithm(AlgorithmConfig(), ActorConfig(), hybrid), ppo_epochs=1,
                  mini_batch_size=share, micro_batch_size=1, log_prob_micro_batch_size=1,
                  loss_agg_mode="token-mean", max_response_length=16, temperature=0.8, use_kl_loss=False,
                  kl_loss_coef=0.0, kl_loss_type="low_var_kl", entropy_coeff=0.01, padding_free=layout == "packed",
                  max_token_len=None if rows else 60, log_prob_max_token_len=60, logprob_chunk_size=4,
                  expert=ExpertLoss(hybrid) if hybrid else None, rollout_is="token" if hybrid == "luffy" else "none")
    old = actor.compute_logprobs(batch)
    batch.old_logprobs = old - 0.05 * batch.loss_mask  # off-policy enough for some clipping
    losses, backward = [], engine.backward
    engine.backward = lambda loss: backward(loss) or losses.append(float(loss))  # the micro-batches' shares
    metrics = D.mean_metrics(actor.update(batch))  # over the ranks, as the pipelines log them
    loss = D.all_sum([sum(losses)])[0] / D.world_size()  # the step's loss (the ranks' mean of their shares' sums)
    olds = [torch.zeros(0)] * D.world_size()
    if D.world_size() > 1:
        torch.distributed.all_gather_object(olds, old)
    else:
        olds = [old]
    weights = engine.full_state_dict()
    if D.is_main():
        os.makedirs(out_dir, exist_ok=True)
        torch.save({"old_logprobs": olds, "grad_norm": metrics["actor/grad_norm"], "metrics": metrics,
                    "loss": loss, "weights": weights},
                   os.path.join(out_dir, "result.pt"))
    D.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
    D.exit_process(0)  # as the pipelines end under torchrun: no race with gloo's threads at exit
