"""The examples tree: every script's command lines parse through the real config loader (an unknown key, a bad
value or a missing file fails here, not on a user's GPUs), each algorithm script differs from grpo.sh only in
its algorithm's keys, and every registered estimator and loss has a script."""

import glob
import json
import os
import shutil
import subprocess

import pytest

import rllava.algorithms.advantage  # noqa: F401  (registers the estimators)
import rllava.algorithms.losses  # noqa: F401  (registers the losses)
from rllava.algorithms.registry import ADV_ESTIMATORS, POLICY_LOSSES
from rllava.config import load_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "examples", "**", "*.sh"),
                                                              recursive=True) if not p.endswith("tasks/tiny_cpu.sh"))
TASKS = ("grounding", "OVD", "counting", "math")
# What an algorithm may change relative to GRPO (and the run's name and place).
ALGORITHM_KEYS = ("algorithm.", "actor.policy_loss.", "actor.clip_ratio", "actor.loss_agg_mode", "critic.",
                  "trainer.critic_warmup", "reward.overlong_buffer.", "rollout.n=", "rollout.val_override_config.",
                  "trainer.experiment_name=", "trainer.outputs_dir=",
                  # SFT+RL hybrids: the expert responses and the hybrid losses' keys
                  "data.target_key", "data.expert_", "actor.loss_remove_clip", "actor.off_policy_", "actor.on_policy_",
                  "actor.sft_loss_coef", "actor.srft_type")


def commands(script: str, tmp_path) -> list[list[str]]:
    """Run the script with `python` and `torchrun` replaced by shell functions that record their arguments:
    the command lines it would run, with its variables expanded, and nothing executed."""
    log = tmp_path / f"calls-{len(list(tmp_path.iterdir()))}"  # a new log per call
    stub = 'printf "%s\\x1f" "$FUNCNAME" "$@" >> "$CALLS"; printf "\\n" >> "$CALLS"'
    setup = f"python() {{ {stub}; }}; torchrun() {{ {stub}; }}; export -f python torchrun; bash {script}"
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "MODEL_PATH", "OUTPUT_DIR", "OUT")}
    subprocess.run(["bash", "-c", setup], cwd=REPO, env={**env, "CALLS": str(log)}, check=True,
                   capture_output=True, timeout=60)
    return [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]


def pipeline_args(cmd: list[str]) -> tuple[str, list[str]] | None:
    """(pipeline module, its arguments) of a `... -m rllava.train.pipeline.X args` command, else None."""
    if "-m" not in cmd or not cmd[cmd.index("-m") + 1].startswith("rllava.train.pipeline."):
        return None
    i = cmd.index("-m")
    return cmd[i + 1], cmd[i + 2:]


def test_the_tree_has_the_seeds_layout():
    for path in ["examples/config.yaml", *(f"examples/reward_function/{t}.py" for t in ("math", "counting", "grounding", "ovd")),
                 *(f"examples/format_prompt/{t}.jinja" for t in ("math", "counting", "grounding", "ovd"))]:
        assert os.path.isfile(os.path.join(REPO, path)), path
    for task in TASKS:
        scripts = [s for s in SCRIPTS if s.startswith(f"examples/tasks/{task}/")]
        assert any(s.endswith("_tiny_cpu.sh") for s in scripts), task
        assert any(s.split("/")[-1].startswith("qwen") for s in scripts), task
    assert "examples/tasks/counting/qwen2_5_vl_3b_clevr_online.sh" in SCRIPTS
    assert "examples/tasks/OVD/qwen2_5_vl_3b_ovd_online.sh" in SCRIPTS
    assert "examples/tasks/agent_search/qwen2_5_vl_3b_agent_search_online.sh" in SCRIPTS
    assert "examples/tasks/agent_code/qwen2_5_vl_3b_agent_code_online.sh" in SCRIPTS


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # scripts name their files relative to the repository root


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_parses_with_the_real_loader(script, tmp_path):
    runs = [pipeline_args(c) for c in commands(script, tmp_path)]
    runs = [r for r in runs if r is not None]
    assert runs, f"{script} runs no rllava pipeline"
    for module, args in runs:
        assert module in ("rllava.train.pipeline.rlvr", "rllava.train.pipeline.sft", "rllava.train.pipeline.agentic"), module
        cfg = load_config(args)  # raises ConfigError naming any unknown key or bad value
        for path in (cfg.data.format_prompt, cfg.reward.reward_function.rpartition(":")[0]):
            assert os.path.isfile(os.path.join(REPO, path)), f"{script}: {path} does not exist"
        assert cfg.actor.model.model_path, script
        if "grounding_iou.py" in cfg.reward.reward_function:  # rllava's (RLLaVA's grounding.py reads no frame)
            assert cfg.reward.reward_function_kwargs.get("frame"), f"{script}: grounding needs its frame"


def test_real_scripts_use_the_seed_command_and_real_models(tmp_path):
    for script in SCRIPTS:
        if script.endswith("_tiny_cpu.sh"):
            continue
        (cmd,) = commands(script, tmp_path)
        assert cmd[0] == "torchrun" and cmd[1].startswith("--nproc_per_node=") and cmd[2:4] == [
            "-m", "rllava.train.pipeline.rlvr"], cmd[:4]  # the seeds' command line
        assert "config=examples/config.yaml" in cmd
        last = lambda key: [a.split("=", 1)[1] for a in cmd if a.startswith(key + "=")][-1]  # noqa: E731 (last wins)
        model = last("actor.model.model_path")
        assert model.startswith("Qwen/Qwen2"), (script, model)  # a hub id, not a placeholder
        if "grounding" in script:  # the frame matches the model family
            frame = last("reward.reward_function_kwargs.frame")
            assert frame == {"Qwen/Qwen2-VL": "qwen2_vl", "Qwen/Qwen2.5-VL": "qwen2_5_vl"}[model.rsplit("-", 2)[0]]


def test_algorithm_scripts_differ_from_grpo_only_in_algorithm_keys(tmp_path):
    def overrides(name):  # in order: later keys win, as on the command line
        (cmd,) = commands(f"examples/algorithms/{name}.sh", tmp_path)
        return pipeline_args(cmd)[1]

    grpo = overrides("grpo")
    estimators, losses = set(), set()
    for script in glob.glob(os.path.join(REPO, "examples/algorithms/*.sh")):
        name = os.path.basename(script)[:-3]
        mine = overrides(name)
        extra = sorted(set(mine) - set(grpo))
        assert all(k.startswith(ALGORITHM_KEYS) for k in extra), (name, extra)
        assert all(k.startswith(ALGORITHM_KEYS) for k in set(grpo) - set(mine)), (name, sorted(set(grpo) - set(mine)))
        cfg = load_config(mine)
        estimators.add(cfg.algorithm.adv_estimator)
        losses.add(cfg.actor.policy_loss.loss_mode)
    for script in glob.glob(os.path.join(REPO, "examples/tasks/agent_search/qwen*.sh")):  # agents' estimators
        (cmd,) = commands(os.path.relpath(script, REPO), tmp_path)
        estimators.add(load_config(pipeline_args(cmd)[1]).algorithm.adv_estimator)
    assert set(ADV_ESTIMATORS) <= estimators  # every registered estimator has a script
    assert set(POLICY_LOSSES) - {"sft", "geo_mean"} <= losses  # sft is not RL; geo_mean = gmpo


@pytest.mark.slow
@pytest.mark.parametrize("script", [s for s in SCRIPTS if s.endswith("_tiny_cpu.sh")])
def test_tiny_cpu_twin_runs(script, tmp_path):
    """Each *_tiny_cpu.sh really runs here (model, data, SFT, GRPO under torchrun), on a tiny budget (~1 min)."""
    import sys

    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "OUT": str(tmp_path),
           "TRAIN": "64", "VAL": "8", "SFT_STEPS": "2", "RL_STEPS": "2", "OMP_NUM_THREADS": "1",
           **({"TEACHER_STEPS": "3"} if "opd" in script else {})}
    subprocess.run(["bash", script, "trainer.val_freq=2", "data.val_batch_size=8"], cwd=REPO, env=env, check=True,
                   capture_output=True, timeout=600)
    assert os.path.isdir(tmp_path / ("opd" if "opd" in script else "grpo") / "final")
    with open(tmp_path / "model" / "config.json") as f:  # the localising tasks need Qwen3-VL (docs/proof.md)
        localising = "grounding" in script or "ovd" in script
        assert json.load(f)["model_type"] == ("qwen3_vl" if localising else "qwen2_vl")


def test_nothing_points_outside_the_repository():
    """A user's clone holds only the repository: facts the code relies on live in docs/, never in a sibling
    folder such as the developers' shared notes."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    offenders = []
    for path in tracked:
        try:
            text = open(os.path.join(REPO, path), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        if any(f"shared/{folder}" in text for folder in ("reference", "seeds", "hooks")):
            offenders.append(path)
    assert offenders == []


# --- every real script runs one step as shipped --------------------------------------------------------------------
# What this machine forces is swapped, nothing else: the model (a tiny one, also as the critic / teacher), the data (a
# synthetic set of the task the script's reward scores, in the record fields the script names), sizes, the rollout
# engine (HF) and the launcher (the pipeline's main in this process instead of torchrun). The reward file, reward_type,
# prompt template and algorithm keys are the script's, with examples/config.yaml under them as the script names it.
REAL = [s for s in SCRIPTS if not s.endswith("_tiny_cpu.sh")]  # the tiny twins run whole in test_tiny_cpu_twin_runs
FAST = ("examples/algorithms/grpo.sh",)  # the rest: make test-slow (~2 min together)
MODEL_KEYS = ("actor.model.model_path", "critic.model.model_path", "algorithm.distill.teacher_path")
DATA_KEYS = ("data.train_files", "data.val_files", "data.train_image_dir", "data.val_image_dir",
             "rollout.agent.tool_kwargs.search.corpus")
TASK_OF_REWARD = {"math": "math", "math_answer": "math", "counting": "counting", "grounding_iou": "grounding",
                  "ovd_ap": "ovd", "agent_search_f1": "agent_search", "agent_code_f1": "agent_code"}
SIZES = ["data.max_samples=8", "data.train_batch_size=2", "data.val_batch_size=4", "rollout.n=2",
         "data.max_response_length=8", "data.max_pixels=12544", "actor.ppo_mini_batch_size=2",
         "actor.ppo_micro_batch_size=4", "actor.log_prob_micro_batch_size=4", "trainer.max_steps=1"]


@pytest.fixture(scope="session")
def synthetic_sets(tmp_path_factory):
    """task -> a small synthetic set of that task (built on first use)."""
    from rllava.data.synthetic import make_dataset

    root, made = tmp_path_factory.mktemp("example_data"), {}

    def get(task: str) -> str:
        if task not in made:
            made[task] = str(root / task)
            make_dataset(task, made[task], n_train=8, n_val=4)
        return made[task]
    return get


def _as_the_script_names_it(data: str, out: str, cfg) -> str:
    """The set's records with the fields the script's keys name (image_path, solution, ...) beside their own."""
    os.makedirs(out, exist_ok=True)
    for name in set(os.listdir(data)) - {"train.jsonl", "val.jsonl"}:  # images/, corpus.jsonl, ...
        os.symlink(os.path.join(data, name), os.path.join(out, name))
    for split in ("train", "val"):
        rows = [json.loads(line) for line in open(os.path.join(data, f"{split}.jsonl"))]
        for r in rows:
            for key, own in ((cfg.data.prompt_key, "problem"), (cfg.data.answer_key, "answer"),
                             (cfg.data.image_key, "images")):
                if key not in r and own in r:
                    r[key] = r[own]
        with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return out


@pytest.mark.parametrize("script", [pytest.param(s, marks=[] if s in FAST else [pytest.mark.slow]) for s in REAL])
def test_real_script_runs_one_step_as_shipped(script, tmp_path, tiny_model_dir, synthetic_sets):
    import importlib
    import warnings

    (cmd,) = commands(script, tmp_path)
    module, args = pipeline_args(cmd)
    cfg = load_config(args)
    reward_file = os.path.basename(cfg.reward.reward_function.rpartition(":")[0])[:-3]
    if reward_file == "agent_code_f1" and not shutil.which("bwrap"):
        pytest.skip("the code tool's jail needs bubblewrap (apt-get install bubblewrap)")
    data = synthetic_sets(TASK_OF_REWARD[reward_file])
    data = _as_the_script_names_it(data, str(tmp_path / "data"), cfg)
    swapped = {**{k: tiny_model_dir for k in MODEL_KEYS},
               "data.train_files": f"{data}/train.jsonl", "data.val_files": f"{data}/val.jsonl",
               "data.train_image_dir": data, "data.val_image_dir": data,
               "rollout.agent.tool_kwargs.search.corpus": f"{data}/corpus.jsonl"}
    args = [f"{k}={swapped[k]}" if k in swapped else a for a in args for k in [a.split("=", 1)[0]]]
    sizes = [*SIZES, *(["critic.ppo_mini_batch_size=2"] if cfg.critic else []),
             *(["rollout.max_turns=2"] if cfg.rollout.agent.tools else [])]
    out = tmp_path / "outputs"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. rollout.vllm.* ignored with rollout.name=hf: tested elsewhere
        importlib.import_module(module).main([*args, *sizes, "rollout.name=hf", f"trainer.outputs_dir={out}"])
    run = out / cfg.trainer.project_name / cfg.trainer.experiment_name
    rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1], script
    assert (run / "final" / "model.safetensors").exists()
