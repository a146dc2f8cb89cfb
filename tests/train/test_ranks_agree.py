"""What every rank must hold alike, and equal to one process's on the same global batches (2 ranks, gloo,
`ranks_agree_worker.py`): the LR schedule, whose length is the optimizer steps each rank takes, and the adaptive
KL-in-reward coefficient, moved by the whole batch's KL (resumed too)."""

import json
import os
import subprocess
import sys

import pytest

from ranks_agree_worker import KL, STEPS, kl_rows  # noqa: E402  (this folder is on sys.path under pytest)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """{world size: each rank's result} of the worker on 1 process and under torchrun on 2."""
    out = {}
    for nproc in (1, 2):
        path = tmp_path_factory.mktemp(f"world{nproc}")
        launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone"] \
            if nproc > 1 else [sys.executable]
        res = subprocess.run([*launcher, os.path.join(HERE, "ranks_agree_worker.py"), tiny_model_dir, str(path)],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=400)
        assert res.returncode == 0, res.stderr[-3000:]
        out[nproc] = [json.load(open(path / f"rank_{r}.json")) for r in range(nproc)]
    return out


@pytest.mark.slow
def test_the_lr_schedule_ends_on_the_last_step_on_every_rank(runs):
    """Linear decay after a warmup of half the run; 3 steps of 8 rows in mini-batches of 4 prompts' rows (2 ranks:
    4 rows each, mini-batches of 2): 2 optimizer steps a step, T = 6 on every rank, warmup w = 3. After k updates
    transformers' linear schedule (optimization.py `_get_linear_schedule_with_warmup_lr_lambda`) is k / w, then
    (T - k) / (T - w): 2/3, 2/3, 0 of lr, the last step at the schedule's end. verl schedules the steps its scheduler
    takes on each rank (verl/workers/fsdp_workers.py@b178a3c L579-586, L921). Before, 2 ranks planned T = 12
    (w = 6): 1/3, 2/3, 1 of lr, the warmup ending on the last step."""
    want = [1e-3 * x for x in (2 / 3, 2 / 3, 0.0)]
    for result in [*runs[1], *runs[2]]:
        assert result["lr"] == pytest.approx(want, abs=1e-12)


def _verl_betas() -> list[float]:
    """beta after each step by verl's rule on the whole batch (verl/trainer/ppo/ray_trainer.py@b178a3c L100-104,
    core_algos.py `AdaptiveKLController.update` L163-173): beta *= 1 + clip(KL / target - 1, -0.2, 0.2) * n_steps /
    horizon, n_steps = the batch's rows (4), KL the token mean over all its rows (verl: the mean of each
    sequence's token mean)."""
    keys = dict(k.split("=") for k in KL)
    beta, target, horizon, betas = float(keys["algorithm.kl_ctrl.kl_coef"]), 0.25, 10, []
    assert float(keys["algorithm.kl_ctrl.target_kl"]) == target and int(keys["algorithm.kl_ctrl.horizon"]) == horizon
    for step in range(1, STEPS + 1):
        scores, mask, old, ref = kl_rows(step)
        kl = float(((old - ref) * mask).sum() / mask.sum())
        beta *= 1 + min(max(kl / target - 1, -0.2), 0.2) * len(scores) / horizon
        betas.append((kl, beta))
    return betas


@pytest.mark.slow
def test_the_adaptive_kl_coefficient_is_one_on_every_rank(runs):
    """Rank 0's token KL is ~0.01, rank 1's ~0.3 (target 0.25): each alone would move beta by the clip, one down
    and one up (and by 2 rows, not 4). Every rank holds verl's beta of the whole batch after each step, as one
    process does; actor/reward_kl is the batch's KL; a run resumed after step 2 from rank 0's saved state goes on
    with the same beta on every rank."""
    want = _verl_betas()
    assert -0.2 < want[0][0] / 0.25 - 1 < 0.2  # within the clip: the batch's KL, not a rank's, moves beta
    for result in [*runs[1], *runs[2]]:
        for key in ("kl", "kl_resumed"):
            assert [(s["reward_kl"], s["after"]) for s in result[key]] == [
                (pytest.approx(kl, rel=1e-6), pytest.approx(beta, rel=1e-6)) for kl, beta in want], key
