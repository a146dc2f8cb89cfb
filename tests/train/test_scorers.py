"""The passes between the reward and the advantage as scorers (issue 47): fixed-seed runs through every built-in
scorer give the metrics they gave before `learn` became a loop over scorers (tests/train/data/scorers.json, written
by the code before the change: `python tests/train/test_scorers.py --write DIR`), to 1e-6.

    critic:   gae with a critic (values, its update), two epochs (old log-probs), a sampled KL in the reward
    full_kl:  the exact KL in the reward (the reference's full_kl) and in the loss, the reference reset every step
    teacher:  a sampled distillation loss (the teachers' pass) beside a KL loss"""

import json
import os
import sys

import pytest

from tests.train.test_loss_terms import REPO, SKIP

GOLDEN = os.path.join(REPO, "tests", "train", "data", "scorers.json")
RUNS = {
    "critic": ["algorithm.adv_estimator=gae", "critic.model.model_path={model}", "actor.ppo_epochs=2",
               "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=low_var_kl"],
    "full_kl": ["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full", "algorithm.use_kl_loss=true",
                "actor.kl_loss_type=full", "algorithm.ref_reset_freq=1", "actor.ppo_mini_batch_size=2"],
    "teacher": ["algorithm.distill.teacher_path={model}", "algorithm.distill.loss=k1", "algorithm.use_kl_loss=true",
                "actor.kl_loss_type=low_var_kl"],
}


def run(name: str, model: str, data: str, out: str, extra: tuple[str, ...] = ()) -> list[dict]:
    """Run `name`'s keys for 2 steps on the tiny model and counting data; the metrics that are numbers of the
    algorithm (no timings)."""
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    os.chdir(REPO)
    keys = [k.format(model=model) for k in RUNS[name]]
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
               f"data.train_files={data}/train.jsonl", "data.val_files=null", "data.max_samples=16",
               "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=2",
               "rollout.n=4", "trainer.max_steps=2", "trainer.val_freq=-1", "trainer.val_before_train=false",
               "trainer.save_freq=-1", "trainer.seed=0", "data.seed=0", *keys_for(out), "trainer.logger=[jsonl]",
               "trainer.overwrite=true", *keys, *extra])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [{k: v for k, v in r.items() if isinstance(v, (int, float)) and not k.startswith(SKIP)} for r in rows]


@pytest.mark.parametrize("name", list(RUNS))
def test_the_scorers_give_the_metrics_learn_gave(name, tmp_path, tiny_model_dir, counting_dir):
    want = json.load(open(GOLDEN))[name]
    got = run(name, tiny_model_dir, counting_dir, str(tmp_path / name))
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for g, w in zip(got, want):
        for key in w:
            assert g[key] == pytest.approx(w[key], rel=1e-6, abs=1e-7), (name, key)


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:  # the golden file, from the code as it is
    from rllava.data.synthetic import make_counting
    from rllava.model.tiny import build_tiny

    root = os.path.abspath(sys.argv[2])  # the conftest's tiny model and counting set, made the same way
    model = build_tiny("qwen2_vl", os.path.join(root, "qwen2_vl"), size="small")
    make_counting(os.path.join(root, "counting"), n_train=64, n_val=16, seed=0)
    golden = {name: run(name, model, os.path.join(root, "counting"), os.path.join(root, name)) for name in RUNS}
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=0)
