"""The update's loss as a list of terms (issue 47): fixed-seed runs of every term together give the metrics they
gave before the terms were split out of `Actor._backward` (tests/train/data/loss_terms.json, written by the code
before the change: `python tests/train/test_loss_terms.py --write DIR`), to another CPU's rounding (`same_as_golden`).

    hybrid: SRFT (the policy loss on own and expert tokens, the SFT term), KL low_var_kl, entropy, rollout_is
    exact:  the exact KL to the reference (kl_loss_type=full) and distillation's exact KL (loss=full)
    k1:     distillation's k1 with a low_var_kl KL term and rollout_rs rejection"""

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN = os.path.join(REPO, "tests", "train", "data", "loss_terms.json")
RUNS = {
    "hybrid": ["actor.policy_loss.loss_mode=srft", "algorithm.prefix_strategy=random", "algorithm.min_prefix_ratio=1.0",
               "algorithm.n_prefix=1", "data.target_key=solution", "algorithm.use_kl_loss=true",
               "actor.kl_loss_type=low_var_kl", "actor.entropy_coeff=0.01", "algorithm.rollout_is=token"],
    "exact": ["algorithm.use_kl_loss=true", "actor.kl_loss_type=full", "algorithm.distill.teacher_path={model}",
              "algorithm.distill.loss=full", "algorithm.distill.coef=0.5"],
    "k1": ["algorithm.distill.teacher_path={model}", "algorithm.distill.loss=k1", "algorithm.use_kl_loss=true",
           "actor.kl_loss_type=low_var_kl", "algorithm.rollout_rs=token_k1", "algorithm.rollout_rs_threshold=0.5_2.0",
           "actor.ppo_mini_batch_size=2"],
}
SKIP = ("timing/", "perf/", "time", "step_time")


def run(name: str, model: str, data: str, out: str, runs: dict = RUNS) -> list[dict]:
    """Run `runs[name]`'s keys for 2 steps on the tiny model and counting data; the metrics that are numbers of the
    algorithm (no timings)."""
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    os.chdir(REPO)
    keys = [k.format(model=model) for k in runs[name]]
    rlvr.main(["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={model}",
               f"data.train_files={data}/train.jsonl", "data.val_files=null", "data.max_samples=16",
               "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=2",
               "rollout.n=4", "trainer.max_steps=2", "trainer.val_freq=-1", "trainer.val_before_train=false",
               "trainer.save_freq=-1", "trainer.seed=0", "data.seed=0", *keys_for(out), "trainer.logger=[jsonl]",
               "trainer.overwrite=true", *keys])
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    return [{k: v for k, v in r.items() if isinstance(v, (int, float)) and not k.startswith(SKIP)} for r in rows]


NOISE_GRAD = 1e-4  # a gradient norm this small (student = teacher, policy = reference) is float rounding
# a metric this small is the rounding of two equal quantities (the first update's ppo_kl: the old log-probs' pass
# against the update's, of the same weights; 1.5e-5 on one Intel core, 3.1e-6 on another)
NOISE_VALUE = 1e-4


def same_as_golden(golden: str, name: str, model: str, data: str, out: str, runs: dict = RUNS) -> None:
    """`run` gives the metrics of `golden`'s entry `name` (every key, every step), to 1e-5 relative or 5e-6 absolute:
    the rounding of another CPU's kernels (a log-prob gap of 2.8e-3 moves by 5e-7 between an Intel and an AMD core).

    Up to the first update whose gradient is rounding alone (0 < grad_norm < NOISE_GRAD in the golden: the k1 and
    teacher runs' first step, 3e-7 to 5e-6): Adam's normalised step makes any gradient, noise too, a step of size lr,
    so the steps after it train on the machine's rounding (their values part by 5-100 % between two CPUs) and only
    their metric names are compared."""
    want = json.load(open(golden))[name]
    got = run(name, model, data, out, runs)
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for g, w in zip(got, want):
        for key in w:
            if isinstance(w[key], float) and 0 < abs(w[key]) < NOISE_VALUE:  # rounding-level: rounding-level here too
                assert abs(g[key]) < NOISE_VALUE, (name, g["step"], key, g[key])
            else:
                assert g[key] == pytest.approx(w[key], rel=1e-5, abs=5e-6), (name, g["step"], key)
        if 0 < w.get("actor/grad_norm", 0) < NOISE_GRAD:
            break


def write_golden(golden: str, root: str, runs: dict = RUNS) -> None:
    """The golden file, from the code as it is, on the conftest's tiny model and counting set made the same way."""
    from rllava.data.synthetic import make_counting
    from rllava.model.tiny import build_tiny

    root = os.path.abspath(root)
    model = build_tiny("qwen2_vl", os.path.join(root, "qwen2_vl"), size="small")
    make_counting(os.path.join(root, "counting"), n_train=64, n_val=16, seed=0)
    out = {name: run(name, model, os.path.join(root, "counting"), os.path.join(root, name), runs) for name in runs}
    os.makedirs(os.path.dirname(golden), exist_ok=True)
    with open(golden, "w") as f:
        json.dump(out, f, indent=0)


@pytest.mark.parametrize("name", list(RUNS))
def test_the_terms_give_the_metrics_the_single_function_gave(name, tmp_path, tiny_model_dir, counting_dir):
    same_as_golden(GOLDEN, name, tiny_model_dir, counting_dir, str(tmp_path / name))


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    write_golden(GOLDEN, sys.argv[2])


def test_a_term_registered_outside_the_package_trains_with_the_rest(tmp_path, tiny_model_dir, counting_dir, capsys):
    """A new loss term is a registration in a file of `algorithm.plugins` and a coefficient in `actor.loss_terms`:
    no edit to the Actor. It trains two steps beside the policy loss and logs its value and its metrics; a name
    nothing registered is a one-line start-up error naming the key."""
    from rllava.train.outputs import keys_for
    from rllava.train.pipeline import rlvr

    plugin = tmp_path / "my_terms.py"
    plugin.write_text("from rllava.algorithms.registry import register_loss_term\n\n"
                      "@register_loss_term('own_nll')\ndef own_nll(inp):\n"
                      "    return -inp.logprobs, {'tokens': inp.mask.sum()}\n")
    os.chdir(REPO)
    base = ["config=examples/tasks/counting/tiny_cpu.yaml", f"actor.model.model_path={tiny_model_dir}",
            f"data.train_files={counting_dir}/train.jsonl", "data.val_files=null", "data.max_samples=8",
            "data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=2", "trainer.max_steps=2",
            "trainer.val_freq=-1", "trainer.val_before_train=false", "trainer.logger=[jsonl]",
            f"algorithm.plugins=[{plugin}]"]
    out = str(tmp_path / "run")
    rlvr.main([*base, *keys_for(out), "actor.loss_terms.own_nll=0.1"])
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    steps = [r for r in steps if "actor/pg_loss" in r]
    assert len(steps) == 2 and all(r["actor/own_nll"] > 0 and r["actor/own_nll/tokens"] > 0 for r in steps)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        rlvr.main([*base, *keys_for(str(tmp_path / "bad")), "actor.loss_terms.own_nl=0.1"])
    err = capsys.readouterr().err.strip().splitlines()
    registered = err[-1].split("(registered: ")[1].split(")")[0].split(", ")  # and the terms other tests registered
    assert "own_nll" in registered and err[-1] == (
        f"rllava: error: actor.loss_terms='own_nl' is not registered (registered: {', '.join(registered)}); did you "
        "mean 'own_nll'?"), err
