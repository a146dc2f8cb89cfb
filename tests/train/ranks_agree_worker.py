"""Run by tests/train/test_ranks_agree.py under `torchrun --nproc_per_node=2`, or plain python (one process on the
same global batches): what every rank must hold alike after a few steps, each rank on its contiguous share.

- The LR schedule: the Actor built as the pipeline builds it (builders.build_engine / build_actor, a tiny Qwen2-VL),
  `LR` keys (linear decay after warmup), STEPS updates of a global batch of train_batch_size x n = 8 rows.
- The adaptive KL-in-reward coefficient: builders.build_kl_controller (`KL` keys) on `kl_rows(step)`, the two
  ranks' KLs far apart; a resume after step RESUME_AFTER loads what the checkpoint keeps, rank 0's state_dict
  (train/checkpoint.py `save_checkpoint` writes rank 0's `stateful`; every rank loads it).

    python ranks_agree_worker.py MODEL_DIR OUT_DIR

Writes OUT_DIR/rank_R.json: this rank's LR after each step, and per step its beta before the step, the logged
actor/reward_kl, and beta after (straight, and resumed).
"""

import json
import os
import sys

import torch

from rllava import distributed as D
from rllava.config import load_config
from rllava.data.protocol import Sample, Segment, Trajectory, collate
from rllava.train import builders as B

STEPS, RESUME_AFTER = 3, 2
LR = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=2", "rollout.n=2", f"trainer.max_steps={STEPS}",
      "algorithm.use_kl_loss=false", "actor.optim.lr=0.001", "actor.optim.lr_scheduler_type=linear",
      "actor.optim.lr_warmup_ratio=0.5", "actor.ppo_micro_batch_size=2", "actor.log_prob_micro_batch_size=2",
      "data.max_response_length=8"]
KL = ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.2",
      "algorithm.kl_ctrl.target_kl=0.25", "algorithm.kl_ctrl.horizon=10", "algorithm.kl_penalty=kl"]


def rows(step: int):
    """The global RL batch of a step: 8 token rows (prompt 3 tokens, response 2-5), random advantages."""
    g = torch.Generator().manual_seed(step)
    batch = collate([Trajectory(Sample(i, [], [], None), i // 2, [
        Segment(torch.randint(20, 1000, (3,), generator=g).tolist(), False),
        Segment(torch.randint(20, 1000, (2 + i % 4,), generator=g).tolist(), True)], {}) for i in range(8)],
        pad_token_id=0)
    batch.advantages = torch.randn(batch.loss_mask.shape, generator=g) * batch.loss_mask
    return batch


def kl_rows(step: int):
    """(scores [4], mask [4, 4], old log-probs, ref log-probs) of a step's 4 rows (rows 0-1: rank 0's, 2-3: rank
    1's): rank 0's token KL (k1 = old - ref) is near 0.01, rank 1's near 0.3, 3 tokens and 7: alone each would
    move beta by the clip (-0.2, +0.2) of target_kl's error, together they are within it."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.float32)
    kl = torch.tensor([[0.01, 0.02, 0, 0], [0.0, 0, 0, 0], [0.3, 0.25, 0.35, 0.3], [0.28, 0.32, 0.3, 0]])
    old = -torch.rand(4, 4, generator=torch.Generator().manual_seed(step))
    return torch.tensor([1.0, 0.0, 1.0, 0.0]), mask, old, old - kl * (1 + 0.1 * step)


def mine(items):
    return D.shard(list(range(len(items))), "rows")


def lr_per_step(model_dir: str, device) -> list[float]:
    cfg = load_config([f"actor.model.model_path={model_dir}", *LR])
    model, _ = B.build_policy(cfg.actor.model, device)
    engine = B.build_engine(cfg, model, device, STEPS)
    actor = B.build_actor(cfg, model, device, STEPS, engine=engine)
    lrs = []
    for step in range(1, STEPS + 1):
        batch = rows(step)
        batch = batch.select(mine(batch))
        batch.old_logprobs = actor.compute_logprobs(batch)
        actor.update(batch)
        lrs.append(engine.scheduler.get_last_lr()[0])
    return lrs


def kl_steps(resume: bool) -> list[dict]:
    cfg = load_config(KL)
    ctrl, out = B.build_kl_controller(cfg), []
    for step in range(1, STEPS + 1):
        if resume and step == RESUME_AFTER + 1:  # rank 0's state, as state.json holds it, on every rank
            saved = json.loads(json.dumps(D.gather([ctrl.state_dict()])[0]))
            ctrl = B.build_kl_controller(cfg)
            ctrl.load_state_dict(saved)
        scores, mask, old, ref = (t[mine(t)] for t in kl_rows(step))
        before = ctrl.value
        _, metrics = ctrl.penalize(scores, mask, old, ref)
        out.append({"before": before, "reward_kl": metrics["actor/reward_kl"], "after": ctrl.value})
    return out


def main(model_dir, out_dir):
    device = D.init("cpu")
    result = {"lr": lr_per_step(model_dir, device), "kl": kl_steps(False), "kl_resumed": kl_steps(True)}
    os.makedirs(out_dir, exist_ok=True)
    json.dump(result, open(os.path.join(out_dir, f"rank_{D.rank()}.json"), "w"))
    D.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
    D.exit_process(0)  # as the pipelines end under torchrun: no race with gloo's threads at exit
