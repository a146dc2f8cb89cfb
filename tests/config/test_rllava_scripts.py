"""RLLaVA's own scripts run here unchanged: their keys (tests/config/rllava_scripts/*.txt, copied from RLLaVA's
examples/config.yaml, config_grounding.yaml and example scripts) load and train for 2 steps on the tiny model. Only what a CPU test must
change is swapped: the model, the data (and a prompt template or reward file rllava does not have yet), sizes and
lengths, the rollout engine (vLLM is GPU-only; RLLaVA's agent-search environment calls a web-search API: the
`search` tool over a local corpus instead), the outputs dir and max_steps. Every other key is RLLaVA's: all the
scripts share one outputs dir, as RLLaVA's share OUTPUT_DIR=outputs, and the agent-search one runs under torchrun.
A second test checks that every key a script does not set resolves to what RLLaVA would have used."""

import json
import os
import subprocess
import sys
import warnings

import pytest
from omegaconf import OmegaConf

from rllava.config import load_config
from rllava.data.synthetic import make_dataset
from rllava.train.pipeline import agentic, rlvr, sft_rl

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rllava_scripts")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = ["grpo", "dapo", "drgrpo", "rloo", "counting_clevr", "luffy_clevr", "agent_search_agentic", "grounding"]
CONFIGS = {"grounding": "config_grounding"}  # the config= a script names (its keys here); else RLLaVA's config.yaml
MODULES = {"luffy_clevr": sft_rl, "agent_search_agentic": agentic}  # the module each script runs; else rlvr
TORCHRUN = {"agent_search_agentic": 1}  # run under torchrun (--nproc_per_node), as the script does; the rest in process
# the data's own field names, swapped with the data (the synthetic counting records: problem, answer, images,
# solution); the LUFFY script's expert text is then `solution` + "\n" + the answer (RLHFDatasetWithTargetClevr)
DATA_FIELDS = {"luffy_clevr": ["data.answer_key=answer", "data.image_key=images",
                               "data.dataset_kwargs.target_key=solution"],
               # the web search (RLLaVA's env file calls a search API; no internet here) -> the search tool over the
               # synthetic data's local corpus; the MAT image dirs -> the data's own
               "agent_search_agentic": ["rollout.env_config_path=null", "rollout.agent.tools=[search]",
                                        "rollout.agent.tool_kwargs.search.corpus={data}/corpus.jsonl",
                                        "data.train_image_dir={data}", "data.val_image_dir={data}"],
               # the synthetic grounding records: `expression` is PR1's problem (the referring expression, no <image>:
               # rec.jinja places the image), `answer` the box; config_grounding.yaml's min_pixels=262144 would make the
               # 112-pixel images 512 x 512 on the CPU
               "grounding": ["data.prompt_key=expression", "data.image_key=images", "data.answer_key=answer",
                             "data.min_pixels=3136"]}


def _keys(name: str) -> list[str]:
    return [line.strip() for line in open(os.path.join(HERE, f"{name}.txt"))
            if line.strip() and not line.startswith("#")]


def _swaps(script_keys, model, data, out) -> list[str]:
    """The CPU test's swaps, given after RLLaVA's keys (later keys win). The reward file and prompt template are the
    script's own: rllava ships them under RLLaVA's names (test_every_file_a_script_names_is_shipped)."""
    swaps = [f"actor.model.model_path={model}", f"data.train_files={data}/train.jsonl",
             f"data.val_files={data}/val.jsonl", "rollout.name=hf",
             "data.max_samples=16", "data.train_batch_size=4", "data.val_batch_size=8", "rollout.n=2",
             "data.max_response_length=8", "data.max_pixels=12544", "actor.ppo_micro_batch_size=8",
             "actor.log_prob_micro_batch_size=8", "trainer.max_steps=2", f"trainer.outputs_dir={out}"]
    if any(k.startswith("data.max_response_length=") for k in script_keys):  # the script's own length, on CPU
        swaps.append("data.max_response_length=8")
    return swaps


def test_every_file_a_script_names_is_shipped():
    """A RLLaVA script run from a clone of rllava finds each file it names (config, prompt, reward) there."""
    for name in SCRIPTS:
        for key in ("config", "data.format_prompt", "reward.reward_function"):
            for k in _keys(name):
                if k.startswith(f"{key}="):
                    assert os.path.isfile(os.path.join(REPO, k.split("=", 1)[1].split(":")[0])), (name, k)


def test_script_key_files_hold_only_rllava_keys_and_values():
    for name in ["config", *CONFIGS.values(), *SCRIPTS]:
        text = open(os.path.join(HERE, f"{name}.txt")).read()
        assert text.startswith("# RLLaVA's examples/") and "TinyLoopX/RLLaVA@" in text.splitlines()[0]
        assert all("=" in k for k in _keys(name))


@pytest.fixture(scope="module")
def agent_search_dir(tmp_path_factory):
    """MAT-Search's record layout (`image_path`, `solution`) on the synthetic agent_search task, with RLLaVA's RFT
    mix: every fourth training record's solution is a gold <search> step only (AgentSearchDataset drops those)."""
    out = str(tmp_path_factory.mktemp("agent_search"))
    paths = make_dataset("agent_search", out, n_train=16, n_val=8)
    for split in ("train", "val"):
        rows = [json.loads(line) for line in open(paths[split])]
        for i, r in enumerate(rows):
            r["image_path"] = r.pop("images")
            r["problem"] = r["problem"].replace("<image>", "")  # MAT's: agent_search.jinja places the image
            if split == "train" and i % 4 == 3:
                r["solution"] = f"<think>I need to look it up.</think><search> {r['query']}</search>"
        with open(paths[split], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return out


@pytest.fixture(scope="module")
def grounding_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("grounding"))
    make_dataset("grounding", out, n_train=16, n_val=8)
    return out


@pytest.fixture(scope="module")
def shared_outputs(tmp_path_factory):
    """One outputs dir for every script, as RLLaVA's scripts share OUTPUT_DIR=outputs: each run writes its own
    <outputs_dir>/<project_name>/<experiment_name> (RLLaVA's layout), so none collides with another."""
    return tmp_path_factory.mktemp("shared") / "outputs"


SLOW = ("dapo",)  # a random tiny model scores 0 on the real reward: DAPO samples its 20 rounds a step (make test-slow)


@pytest.mark.parametrize("script", [pytest.param(s, marks=[pytest.mark.slow] if s in SLOW else []) for s in SCRIPTS])
def test_rllava_script_runs_two_steps_unchanged(script, tmp_path, tiny_model_dir, counting_dir, agent_search_dir,
                                                grounding_dir, shared_outputs, monkeypatch):
    monkeypatch.chdir(REPO)  # RLLaVA's scripts name files relative to the repository root
    base = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.from_dotlist(_keys(CONFIGS.get(script, "config"))), base)  # RLLaVA's config= file
    keys = _keys(script)
    data = {"agent_search_agentic": agent_search_dir, "grounding": grounding_dir}.get(script, counting_dir)
    fields = [k.format(data=data) for k in DATA_FIELDS.get(script, [])]
    argv = [f"config={base}", *keys, *_swaps(keys, tiny_model_dir, data, shared_outputs), *fields]
    module = MODULES.get(script, rlvr)
    if script in TORCHRUN:  # as the script launches it, through the CLI
        res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc_per_node={TORCHRUN[script]}", "-m", module.__name__, *argv],
                             capture_output=True, text=True, cwd=REPO)
        assert res.returncode == 0, res.stderr[-3000:]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. rollout.vllm.* ignored with rollout.name=hf: tested elsewhere
            module.main(argv)
    experiment = dict(k.split("=", 1) for k in keys)["trainer.experiment_name"]
    out = shared_outputs / "rllava" / experiment  # RLLaVA's layout: outputs_dir/project_name/experiment_name
    assert os.listdir(shared_outputs) == ["rllava"]
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    assert (out / "final" / "model.safetensors").exists()
    if script == "dapo":
        assert all("batch/sampling_rounds" in r for r in rows if "reward/mean" in r)
    steps = [r for r in rows if "reward/mean" in r]
    if script.startswith("agent_search"):  # multi-turn episodes: search -> <information> -> answer
        samples = [json.loads(line) for line in open(out / "samples.jsonl")]
        assert all("turns" in s for s in samples) and all("<answer>" not in s["ground_truth"] for s in samples)
        return
    if script == "grounding":  # config_grounding.yaml: val_before_train=false; the script: val_freq=-1
        assert not any("val/accuracy" in r for r in rows)
        return
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]  # val_before_train, and at the last step
    if script == "rloo":  # KL in the reward (use_kl_in_reward), none in the loss (use_kl_loss=false)
        assert all("actor/reward_kl" in r and "actor/kl_loss" not in r for r in steps)
    if script == "grpo":  # RLLaVA's default use_kl_loss=true: the KL term is in the loss
        assert all("actor/kl_loss" in r for r in steps)
    if script == "luffy_clevr":  # the expert response (the Clevr class: field + "\n" + answer) is in each group
        assert all(r["hybrid/prefix_tokens_mean"] > 0 and r["hybrid/off_policy_token_share"] > 0 for r in steps)


@pytest.mark.parametrize("script", SCRIPTS)
def test_rllava_script_resolves_every_key_it_does_not_set_as_rllava(script, tmp_path, tiny_model_dir, counting_dir,
                                                                   monkeypatch):
    """Every key of RLLaVA's schema that neither the script nor the CPU swaps set resolves to what RLLaVA would
    have used: its examples/config.yaml's value, else its schema default. The only exceptions are rllava's
    deliberate default differences (RLLAVA_DIFFERENCES), each a row of docs/rllava_scripts.md's table."""
    from tests.config.test_config import RLLAVA_DIFFERENCES, RLLAVA_SCHEMA, _get, _leaves, _parse_schema_block

    monkeypatch.chdir(REPO)
    keys = _keys(script)
    swaps = [*_swaps(keys, tiny_model_dir, counting_dir, "/tmp/unused"), *DATA_FIELDS.get(script, [])]
    base = _leaves(OmegaConf.to_container(OmegaConf.from_dotlist(_keys(CONFIGS.get(script, "config")))))
    rllava = {**_parse_schema_block(RLLAVA_SCHEMA), **base}  # what RLLaVA resolves before the script's keys
    set_here = {k.split("=", 1)[0] for k in [*keys, *swaps]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = tmp_path / "config.yaml"
        OmegaConf.save(OmegaConf.from_dotlist(_keys(CONFIGS.get(script, "config"))), config)  # the script's config=
        cfg = load_config([f"config={config}", *keys, *[s.format(data=counting_dir) for s in swaps]])
    docs = open(os.path.join(REPO, "docs", "rllava_scripts.md")).read()
    checked, wrong = 0, []
    for key, value in rllava.items():
        if key == "critic" or any(key == k or key.startswith(f"{k}.") or k.startswith(f"{key}.")
                                  for k in [*set_here, *(base if key not in base else ())]):
            continue  # set, or inside / around what is set (val_override_config: {} vs its keys in the file)
        want = RLLAVA_DIFFERENCES.get(key, value) if key not in base else value
        if key in RLLAVA_DIFFERENCES and key not in base and f"`{key}`" not in docs:
            wrong.append(f"{key}: a deliberate difference docs/rllava_scripts.md does not list")
        if _get(cfg, key) != want:
            wrong.append(f"{key} resolves to {_get(cfg, key)!r}, RLLaVA's is {want!r}")
        checked += 1
    assert not wrong and checked > 150, "\n".join(wrong)


def test_luffy_clevr_script_on_records_with_an_answer_field(tmp_path, tiny_model_dir, counting_dir, monkeypatch):
    """Clevr_CoGenT's layout (problem, thinking, solution, image) plus an `answer` field, with the script's own
    data.answer_key=solution and target_key=thinking: the expert text is thinking + "\\n" + the solution, as RLLaVA's
    RLHFDatasetWithTargetClevr builds it from data.answer_key; the record's `answer` does not clash with it
    (issue 49: a jinja TypeError, "multiple values for keyword argument 'answer'", at the first step)."""
    monkeypatch.chdir(REPO)
    for split in ("train", "val"):
        rows = [json.loads(line) for line in open(os.path.join(counting_dir, f"{split}.jsonl"))]
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps({**r, "thinking": "I count.", "images": [os.path.join(counting_dir, p)
                                                                             for p in r["images"]]}) + "\n"
                         for r in rows)
    base = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.from_dotlist(_keys("config")), base)
    keys = _keys("luffy_clevr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sft_rl.main([f"config={base}", *keys, *_swaps(keys, tiny_model_dir, tmp_path, tmp_path / "out"),
                     "data.image_key=images", "trainer.val_before_train=false"])
    out = tmp_path / "out" / "rllava" / "qwen2_vl_2b_luffy_drgrpo"
    rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["hybrid/prefix_tokens_mean"] > 0 for r in rows if "reward/mean" in r] == [True, True]
