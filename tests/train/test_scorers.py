"""The passes between the reward and the advantage as scorers (issue 47): fixed-seed runs through every built-in
scorer give the metrics they gave before `learn` became a loop over scorers (tests/train/data/scorers.json, written
by the code before the change: `python tests/train/test_scorers.py --write DIR`), to another CPU's rounding
(tests/train/test_loss_terms.py `same_as_golden`).

    critic:   gae with a critic (values, its update), two epochs (old log-probs), a sampled KL in the reward
    full_kl:  the exact KL in the reward (the reference's full_kl) and in the loss, the reference reset every step
    teacher:  a sampled distillation loss (the teachers' pass) beside a KL loss"""

import json
import os
import sys

import pytest

from tests.train.test_loss_terms import REPO, same_as_golden, write_golden

GOLDEN = os.path.join(REPO, "tests", "train", "data", "scorers.json")
RUNS = {
    "critic": ["algorithm.adv_estimator=gae", "critic.model.model_path={model}", "actor.ppo_epochs=2",
               "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=low_var_kl"],
    "full_kl": ["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full", "algorithm.use_kl_loss=true",
                "actor.kl_loss_type=full", "algorithm.ref_reset_freq=1", "actor.ppo_mini_batch_size=2"],
    "teacher": ["algorithm.distill.teacher_path={model}", "algorithm.distill.loss=k1", "algorithm.use_kl_loss=true",
                "actor.kl_loss_type=low_var_kl"],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_the_scorers_give_the_metrics_learn_gave(name, tmp_path, tiny_model_dir, counting_dir):
    same_as_golden(GOLDEN, name, tiny_model_dir, counting_dir, str(tmp_path / name), RUNS)


PRM = '''from rllava.algorithms.kl import token_rewards_of
from rllava.algorithms.registry import register_scorer
from rllava.model.loader import load_frozen
from rllava.train.scorers import Scorer


@register_scorer("length_prm")
def length_prm(cfg, parts):
    """A process reward stand-in: +0.05 on the odd token ids the policy wrote, on top of what filled it before;
    its frozen model loaded as docs/custom_task.md shows (here the policy's checkpoint)."""
    prm = load_frozen(cfg.actor.model.model_path, parts.device, key="length_prm", engine=parts.engine)
    assert not prm.training and not any(p.requires_grad for p in prm.parameters())

    def score(batch):
        bonus = 0.05 * (batch.input_ids % 2) * batch.loss_mask
        return token_rewards_of(batch) + bonus, {"prm/bonus_sum": bonus.sum(-1).mean().item()}

    return Scorer("token_rewards", score, "prm")


@register_scorer("nowhere")
def nowhere(cfg, parts):
    return Scorer("prm_scores", lambda batch: None, "nowhere") if {bad} else None
'''


def test_a_scorer_registered_outside_the_package_fills_its_field(tmp_path, tiny_model_dir, counting_dir, capsys):
    """A new pass before the advantage is a registration in a file of `algorithm.plugins`: no edit to the
    pipeline. Its per-token rewards reach the advantage (GRPO sums them: the gradients differ from a run
    without it, from the same seed), its metrics and timer are logged; a field the Batch lacks is a start-up error."""
    from rllava.algorithms.registry import SCORERS
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    os.chdir(REPO)
    base = ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
            f"data.train_files={counting_dir}/train.jsonl", "data.val_files=null", "data.max_samples=8",
            "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "trainer.max_steps=2",
            "trainer.val_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]", "trainer.seed=0"]

    def steps(name: str, bad: bool = False, plugin: bool = True) -> list[dict]:
        path, out = tmp_path / f"prm_{name}.py", str(tmp_path / name)
        path.write_text(PRM.replace("{bad}", str(bad)))
        try:
            rlvr.main([*base, *keys_for(out), *([f"algorithm.plugins=[{path}]"] if plugin else [])])
        finally:  # this process's registrations go with the run (another test's run must not see them)
            SCORERS.pop("length_prm", None), SCORERS.pop("nowhere", None)
        return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]

    with_prm, without = steps("with"), steps("without", plugin=False)
    assert all(r["prm/bonus_sum"] > 0 and "timing/prm" in r for r in with_prm if "actor/pg_loss" in r)
    assert not any("prm/bonus_sum" in r for r in without)
    assert [r["actor/grad_norm"] for r in with_prm] != [r["actor/grad_norm"] for r in without]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        steps("bad", bad=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rllava: error: scorer 'nowhere' (") and "fills batch.prm_scores, which is not " \
        "a field of the Batch" in err[-1], err


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    write_golden(GOLDEN, sys.argv[2], RUNS)
