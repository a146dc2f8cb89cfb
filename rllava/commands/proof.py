"""`make proof`: on each task, GRPO visibly improves an SFT-warmed tiny model on held-out data, on a CPU.

    python -m rllava.commands.proof --out outputs/proof [--tasks counting grounding math ovd agent_search] [--seed 0]
        [--sft-steps N] [--rl-steps N] [--val-freq N]   # default: the configs' budgets and evaluation interval

For each task: build a tiny random VLM (`rllava.model.tiny`, `Task.arch`) and its synthetic set
(`rllava.data.synthetic TASK`, 4000 train / 200 held out), warm the model up with SFT on the records'
`solution` targets (`examples/tasks/<dir>/tiny_cpu_sft.yaml`), then run GRPO with the task's reward
(`examples/tasks/<dir>/tiny_cpu.yaml`); both are the real command lines a user runs (`*_tiny_cpu.sh` runs the
same), printed before they start, with the configs' step budgets. Grounding and OVD use a tiny Qwen3-VL: its
vision tower adds learned absolute position embeddings, and the Qwen2-VL tower (rotary positions only) did not
learn to localise within the budget. The held-out metric is measured before GRPO and after it, sampled at the
rollout temperature (what RL optimises) with greedy beside it; "after" averages the last `average`
evaluations, because one evaluation of a tiny model jumps by whole answer classes.

Writes `OUT/results.md` (the table: SFT -> after GRPO, lift, the target lift; every task with a summary in
OUT, so single-task runs add up) and `OUT/<task>.png` (held-out metric and training reward per step).
`make demo` is the counting row alone. `agent_search` is a multi-turn agent with the search tool (`rllava.agent`),
warmed up on expert trajectories with the tool's outputs replayed: besides its F1 the table reports how often the
held-out episodes search (`searched`), retrieve the document with the answer (`found`) and answer right from it
(`used`). `agent_code` runs Python in the sandbox (`rllava.agent.code`) to restore a turned, flipped or
darkened image: the table reports how often held-out episodes call it (`coded`) and how much of it ran (`ran`).
Two rows run through the policy's endpoint (`rllava.agent.program`): `reasoning_gym` is a reasoning-gym task
(`RG_TASK`) as data, each episode `examples/agents/reasoning_gym_agent.py` (one request), scored by the task's own
`score_answer`, warmed up on its answers; `verifiers_tool` is a two-turn verifiers ToolEnv
(`examples/tasks/verifiers_tool/lookup_env.py`: call `lookup`, answer the code it returns), scored by its rubric
on its `eval_dataset`, warmed up on its expert turns without the tool prompt, then as the endpoint renders them
(`verifiers_data`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from rllava.commands import command_parser
from rllava.data.synthetic import make_dataset
from rllava.model.tiny import build_tiny
from rllava.commands.plot import read_metrics, series
from rllava.train.outputs import keys_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Task:
    """One row of the proof: where its configs live, what it measures and the lift it must show."""

    name: str  # synthetic task and reward name
    folder: str  # examples/tasks/<folder>/tiny_cpu{,_sft}.yaml
    metric: str  # held-out metric, logged as val/<metric> (sampled) and val_greedy/<metric>
    scale: float  # 100: accuracy in points; 1: IoU or reward as is
    target: float  # the lift asked for, in scaled units
    arch: str = "qwen2_vl"  # rllava.model.tiny arch; localising tasks need Qwen3-VL's absolute position embeddings
    # held-out rates reported beside the metric, before and after (agents: how often they search and use it)
    rates: tuple[str, ...] = ()
    data: str = "synthetic"  # rllava.data.synthetic records, or "reasoning_gym" (RG_TASK), "verifiers" (its env)
    sizes: tuple[int, int] = (4000, 200)  # train / held-out records
    # SFT steps on data/sft_short.jsonl before the warm-up (verifiers_tool: its turns without the tool prompt)
    short_sft_steps: int = 0


TASKS = {t.name: t for t in [
    Task("counting", "counting", "accuracy", 100.0, 15.0),
    Task("grounding", "grounding", "iou", 1.0, 0.10, arch="qwen3_vl"),
    Task("math", "math", "accuracy", 100.0, 10.0),
    Task("ovd", "OVD", "reward_mean", 1.0, 0.10, arch="qwen3_vl"),
    Task("agent_search", "agent_search", "f1", 1.0, 0.10, rates=("searched", "found", "used")),
    Task("agent_code", "agent_code", "accuracy", 100.0, 10.0, rates=("coded", "ran")),
    Task("reasoning_gym", "reasoning_gym", "reward_mean", 1.0, 0.10, data="reasoning_gym"),  # score_answer: 0-1
    Task("verifiers_tool", "verifiers_tool", "correct", 1.0, 0.10, data="verifiers", rates=("total_tool_calls",),
         sizes=(2000, 64), short_sft_steps=400),  # ~500-token prompts (the tool prompt): 64 held out keep it minutes
]}

# the reasoning_gym row's task: sums of two numbers of one digit ("Calculate 4 + 1."; parse_qsl reads a "+" as a
# space, hence %2B); a small question space, so held-out records ask questions train ones ask too. With "-" too,
# 200 SFT steps left the tiny model at 11 % and 60 GRPO steps did not lift it (docs/proof.md)
RG_TASK = ("basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=1&operators=[\"%2B\"]"
           "&allow_parentheses=false&allow_negation=false")


def _run(module: str, args: list[str], processes: int = 1) -> float:
    """Run `python -m module args` (under torchrun with `processes` > 1) from the repository root, streaming its
    output; returns seconds taken."""
    launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"] if processes > 1 else []
    cmd = [sys.executable, *launch, "-m", module, *args]
    print("\n$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, cwd=REPO, check=True)
    return time.time() - start


def prepare(task: Task, out: str, *, seed: int = 0, n_train: int = 4000, n_val: int = 200) -> list[str]:
    """A tiny random model at out/model and the task's synthetic records at out/data; returns the data keys."""
    start = time.time()
    model_dir, data_dir = os.path.join(out, "model"), os.path.join(out, "data")
    build_tiny(task.arch, model_dir, size="demo", seed=seed)
    if task.data == "reasoning_gym":
        return reasoning_gym_data(data_dir, seed, n_train, n_val)
    if task.data == "verifiers":
        return verifiers_data(model_dir, data_dir, seed, n_train, n_val)
    data = make_dataset(task.name, data_dir, n_train=n_train, n_val=n_val, seed=seed)
    print(f"built a tiny {task.arch} in {model_dir} and {n_train}/{n_val} {task.name} records in {data_dir} "
          f"({time.time() - start:.0f}s)", flush=True)
    corpus = os.path.join(data_dir, "corpus.jsonl")  # agent_search: what its search tool reads
    return [f"data.train_files={data['train']}", f"data.val_files={data['val']}", f"trainer.seed={seed}",
            *([f"rollout.agent.tool_kwargs.search.corpus={corpus}"] if os.path.exists(corpus) else [])]


def reasoning_gym_data(data_dir: str, seed: int, n_train: int, n_val: int) -> list[str]:
    """The reasoning_gym row's specs (train: seed, held out: seed + 10^6: reasoning-gym draws entry i from seed + i)
    and its SFT records at data_dir/sft.jsonl: the train records with `solution` = `<answer>{answer}</answer>` (what
    the scorer reads)."""
    from rllava.data.reasoning_gym import reasoning_gym_records

    train = f"reasoning_gym:{RG_TASK}&size={n_train}&seed={seed}"
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "sft.jsonl"), "w") as f:
        for r in reasoning_gym_records(train, "problem", "answer", "proof"):
            f.write(json.dumps({**r, "solution": f"<answer>{r['answer']}</answer>"}) + "\n")
    return [f"data.train_files={train}", f"data.val_files=reasoning_gym:{RG_TASK}&size={n_val}&seed={seed + 10**6}",
            f"trainer.seed={seed}"]


VF_ENV = "verifiers:examples/tasks/verifiers_tool/lookup_env.py:load_environment"


def verifiers_data(model_dir: str, data_dir: str, seed: int, n_train: int, n_val: int) -> list[str]:
    """The verifiers_tool row's env keys and its SFT records at data_dir/sft.jsonl: each expert turn of each train
    row (`expert` of the env's file) after the conversation before it, rendered as the endpoint renders it
    (`chat_messages`: the tool prompt in the system message, the call as <tool_call> text, the result as a
    <tool_response> user turn) and given as one user message. The SFT template writes its own system message
    ("You are a helpful assistant.") and user header first, so each prompt differs from the episode's by that
    header alone: rllava's SFT replays multi-turn experts through rllava's tools only, not through an env.
    data_dir/sft_short.jsonl holds the same turns rendered without the tool list (no tool prompt: ~60 tokens
    instead of ~500), the warm-up's first stage (`Task.short_sft_steps`)."""
    from rllava.agent.endpoint import chat_messages
    from rllava.agent.verifiers_env import _load_module
    from rllava.model.processor import load_processor

    module = _load_module(VF_ENV.split(":")[1])
    kwargs = {"num_train": n_train, "num_eval": n_val, "seed": seed}
    env = module.load_environment(**kwargs)
    processor = load_processor(model_dir)
    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                               "parameters": t.parameters, "strict": t.strict}}
             for t in env.tool_defs]  # what verifiers' OpenAI client sends (to_native_tool)

    def endpoint(messages, tools=None) -> list[dict]:
        return chat_messages(messages, tools, processor.chat_template or "", (None, None))[0]

    def render(messages, tools=None) -> str:
        return processor.apply_chat_template(endpoint(messages, tools), add_generation_prompt=True, tokenize=False)

    head, tail = render([{"role": "user", "content": "\0"}]).split("\0")  # the SFT template around a prompt
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "sft.jsonl"), "w") as episode, \
            open(os.path.join(data_dir, "sft_short.jsonl"), "w") as short:
        for row in env.build_dataset():
            history = list(row["prompt"])
            for message in module.expert(row):
                if message["role"] == "assistant":
                    solution = endpoint([message])[0]["content"]
                    for f, listed in ((episode, tools), (short, None)):  # the episode's prompt; no tool prompt
                        text = render(history, listed)
                        shared = os.path.commonprefix([head, text])
                        f.write(json.dumps({"problem": text[len(shared):-len(tail)], "solution": solution}) + "\n")
                history.append(message)
    return [*(f"rollout.agent.environment_kwargs.{k}={v}" for k, v in kwargs.items()), f"trainer.seed={seed}"]


def warm_up(task: Task, out: str, common: list[str], sft_steps: int | None = None, name: str = "sft") -> float:
    """SFT of out/model on the records' `solution` targets into out/<name> (out/sft: the RL runs' start), after
    `task.short_sft_steps` on out/data/sft_short.jsonl into out/<name>_short where the task has them; returns
    seconds taken."""
    start, seconds = os.path.join(out, "model"), 0.0
    if task.short_sft_steps:
        keys = _sft_keys(out, common, "sft_short.jsonl",
                         needed_by=f"{task.name} ({task.data} data): short_sft_steps={task.short_sft_steps}")
        seconds = _sft(task, out, start, keys, task.short_sft_steps, f"{name}_short")
        start = os.path.join(out, f"{name}_short", "final")
    return seconds + _sft(task, out, start, _sft_keys(out, common), sft_steps, name)


def _sft(task: Task, out: str, start: str, data_keys: list[str], steps: int | None, name: str) -> float:
    return _run("rllava.train.pipeline.sft", [
        f"config={_configs(task)}/tiny_cpu_sft.yaml", f"actor.model.model_path={start}", *data_keys,
        *([f"trainer.max_steps={steps}"] if steps else []), "trainer.val_freq=0",
        *keys_for(os.path.join(out, name)), "trainer.overwrite=true"])  # fresh model and data


def train_rl(task: Task, out: str, common: list[str], name: str = "grpo", keys: tuple[str, ...] = (),
             rl_steps: int | None = None, val_freq: int | None = None, processes: int = 1,
             start: str = "sft") -> float:
    """RL from out/<start>/final (the SFT warm-up) into out/<name> (GRPO, or a hybrid with `keys`); returns
    seconds taken."""
    return _run("rllava.train.pipeline.rlvr", [
        f"config={_configs(task)}/tiny_cpu.yaml", f"actor.model.model_path={os.path.join(out, start, 'final')}",
        *common, *([f"trainer.max_steps={rl_steps}"] if rl_steps else []),
        *([f"trainer.val_freq={val_freq}"] if val_freq else []), "trainer.val_before_train=true", *keys,
        *keys_for(os.path.join(out, name)), "trainer.overwrite=true"], processes)


def _sft_keys(out: str, common: list[str], records: str = "sft.jsonl", needed_by: str = "") -> list[str]:
    """The warm-up's data keys: rows whose RL records are not files (reasoning-gym specs, a verifiers env) warm up
    on out/data/<records>, without the env. Without that file, the RL records' keys, unless a stage `needed_by`
    it: then an error naming the file."""
    path = os.path.join(out, "data", records)
    if not os.path.exists(path):
        if needed_by:
            raise FileNotFoundError(f"{needed_by} warms up on {path}, which its data step did not write")
        return common
    kept = [k for k in common if not k.startswith(("data.", "rollout.agent.environment"))]
    return [*kept, f"data.train_files={path}", "data.val_files=null"]


def _configs(task: Task) -> str:
    return os.path.join("examples", "tasks", task.folder)


def run_task(task: Task, out: str, *, sft_steps: int | None = None, rl_steps: int | None = None,
             val_freq: int | None = None, average: int = 3, seed: int = 0, n_train: int | None = None,
             n_val: int | None = None) -> dict:
    """Build, warm up, train one task under `out`; returns its summary (also written to `out/summary.json`)."""
    start = time.time()
    out = os.path.abspath(out)
    common = prepare(task, out, seed=seed, n_train=n_train or task.sizes[0], n_val=n_val or task.sizes[1])
    sft_time = warm_up(task, out, common, sft_steps)
    rl_time = train_rl(task, out, common, rl_steps=rl_steps, val_freq=val_freq)
    summary = summarize(task, read_metrics(os.path.join(out, "grpo")), average)
    summary.update(sft_seconds=sft_time, rl_seconds=rl_time, total_seconds=time.time() - start, outputs=out)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def hybrid_keys(method: str, steps: int) -> tuple[str, ...]:
    """The keys of examples/algorithms/<method>.sh for a tiny run of `steps` RL steps: the records' `solution`
    is the expert response, and the schedules keep their shape scaled to the run (CHORD: mu warms up over the
    first third and decays to mu_valley by the end, as 200 + 400 steps; UFT: hints fade over the first 60 %, as
    300 of 500). UFT's hint
    SFT coefficient is RLLaVA's script's 1.0, not the paper's 0.001: with 0.001 the tiny model learns to end
    the hinted responses (EOS after the answer) and nothing of how to begin one, so without hints it answers
    nothing (held-out 2 % -> 0 % in 80 steps, docs/proof.md). HPT's SFT coefficient is 0.3, the HPT authors'
    value for their smaller model (exp_scripts/train.sh; 1.0 for 7B, RLLaVA's script 0.05): at 1.0 the tiny
    model's sampled accuracy ended 3-9 points below GRPO's where GRPO can start (docs/proof.md)."""
    return {
        "grpo": (),
        "chord": ("actor.policy_loss.loss_mode=chord", f"algorithm.mu_warmup_steps={steps // 3}",
                  f"algorithm.mu_decay_steps={2 * steps // 3}", "algorithm.mu_peak=0.5", "algorithm.mu_valley=0.02"),
        "chord_phi": ("actor.policy_loss.loss_mode=chord", "algorithm.mu_warmup_steps=0", "algorithm.mu_decay_steps=0",
                      "algorithm.mu_peak=0.1", "algorithm.mu_valley=0.1", "algorithm.enable_phi_function=true"),
        "luffy": ("actor.policy_loss.loss_mode=luffy", "algorithm.prefix_strategy=random",
                  "algorithm.min_prefix_ratio=1.0", "algorithm.n_prefix=1", "actor.off_policy_reshape=p_div_p_0.1",
                  "actor.loss_remove_clip=true", "actor.loss_agg_mode=seq-mean-token-sum-norm",
                  "algorithm.norm_adv_by_std_in_grpo=false"),
        "srft": ("actor.policy_loss.loss_mode=srft", "algorithm.prefix_strategy=random",
                 "algorithm.min_prefix_ratio=1.0", "algorithm.n_prefix=1"),
        "uft": ("actor.policy_loss.loss_mode=uft", "algorithm.prefix_strategy=hint",
                f"algorithm.hint_steps={3 * steps // 5}", "algorithm.max_prefix_ratio=0.95",
                "algorithm.min_prefix_ratio=0.05", "algorithm.prefix_share_across_samples=true",
                "actor.sft_loss_coef=1.0"),
        "hpt": ("actor.policy_loss.loss_mode=hpt", "algorithm.unify_strategy=switch", "algorithm.switch_gate=0",
                "actor.sft_loss_coef=0.3"),
    }[method] + (("data.target_key=solution",) if method != "grpo" else ())


HYBRID_METHODS = ("grpo", "chord", "chord_phi", "luffy", "uft", "hpt", "srft")


def run_hybrids(task: Task, out: str, *, sft_steps: int | None, rl_steps: int, val_freq: int, methods=HYBRID_METHODS,
                average: int = 3, seed: int = 0) -> list[dict]:
    """GRPO and each hybrid from one SFT checkpoint (`sft_steps` of warm-up) for the same `rl_steps`; returns
    one summary per method (also written to out/<method>/summary.json)."""
    return run_methods(task, out, {m: (hybrid_keys(m, rl_steps), 1) for m in methods}, sft_steps=sft_steps,
                       rl_steps=rl_steps, val_freq=val_freq, average=average, seed=seed)


# Asynchronous RL (`--async`): the synchronous run, then 1 trainer + 1 rollout process (torchrun) at each staleness,
# with token-level truncated importance sampling (verl's rollout correction, cap 2) or without any correction
ASYNC = ("trainer.async_training=true", "trainer.rollout_ranks=1")
ASYNC_RUNS = {
    "sync": ((), 1),
    "k1_tis": ((*ASYNC, "trainer.max_staleness=1", "algorithm.rollout_is=token"), 2),
    "k2_tis": ((*ASYNC, "trainer.max_staleness=2", "algorithm.rollout_is=token"), 2),
    "k4_plain": ((*ASYNC, "trainer.max_staleness=4"), 2),
    "k4_tis": ((*ASYNC, "trainer.max_staleness=4", "algorithm.rollout_is=token"), 2),
}


def run_methods(task: Task, out: str, methods: dict[str, tuple[tuple[str, ...], int]], *, sft_steps: int | None,
                rl_steps: int, val_freq: int, average: int = 3, seed: int = 0) -> list[dict]:
    """Each of `methods` (name: its keys, processes) from one SFT checkpoint (`sft_steps` of warm-up) for the
    same `rl_steps`; returns one summary per method (also written to out/<name>/summary.json). A method already
    summarised there is not run again (runs of single methods add up)."""
    out = os.path.abspath(out)
    data = os.path.join(out, "data")
    common = [f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", f"trainer.seed={seed}"]
    if not os.path.isdir(os.path.join(out, "sft", "final")):  # one warm-up serves every method
        common = prepare(task, out, seed=seed)
        warm_up(task, out, common, sft_steps)
    summaries = []
    for name, (keys, processes) in methods.items():
        path = os.path.join(out, name, "summary.json")
        if not os.path.exists(path):
            seconds = train_rl(task, out, common, name, keys, rl_steps, val_freq, processes)
            s = {**summarize(task, read_metrics(os.path.join(out, name)), average), "method": name,
                 "rl_seconds": seconds, "sft_steps": sft_steps, "rl_steps": rl_steps, "seed": seed}
            with open(path, "w") as f:
                json.dump(s, f, indent=1)
        with open(path) as f:
            summaries.append(json.load(f))
    return summaries


# 64 completions a step as GRPO's 8 prompts x 8 samples, spent on 64 prompts x 1 sample (distillation needs no
# group), in four mini-batches of 16: four optimizer steps a step (GRPO's config takes one)
WIDE = ("data.train_batch_size=64", "rollout.n=1", "actor.ppo_mini_batch_size=16")


def distill_runs(teacher: str) -> dict[str, tuple[tuple[str, ...], int]]:
    """On-policy distillation (`--distill`) beside GRPO: pure distillation (no reward in the loss) from `teacher`
    with the exact reverse KL (`full`) and with the sampled k1 advantage, in GRPO's config; `opd_wide`: the exact
    KL over 64 prompts a step (WIDE)."""
    opd = (f"algorithm.distill.teacher_path={teacher}", "algorithm.distill.use_reward=false")
    return {"grpo": ((), 1), "opd": (opd, 1), "opd_k1": ((*opd, "algorithm.distill.loss=k1"), 1),
            "opd_wide": ((*opd, *WIDE), 1)}


def run_distill(task: Task, out: str, *, sft_steps: int | None, teacher_steps: int, rl_steps: int, val_freq: int,
                seed: int = 0, methods: tuple[str, ...] = ("grpo", "opd_wide", "opd", "opd_k1")
                ) -> tuple[dict, list[dict]]:
    """The student (`sft_steps` of SFT) and the teacher (`teacher_steps` from the same random model) warm up; the
    teacher is evaluated as the runs are (out/teacher_eval); GRPO and OPD (`methods` of `distill_runs`) run from
    the student for `rl_steps`. Returns (the teacher's summary, one summary per run)."""
    out = os.path.abspath(out)
    data = os.path.join(out, "data")
    common = [f"data.train_files={data}/train.jsonl", f"data.val_files={data}/val.jsonl", f"trainer.seed={seed}"]
    if not os.path.isdir(os.path.join(out, "sft", "final")):
        common = prepare(task, out, seed=seed)
        warm_up(task, out, common, sft_steps)
    if not os.path.isdir(os.path.join(out, "teacher", "final")):
        warm_up(task, out, common, teacher_steps, name="teacher")
    path = os.path.join(out, "teacher_eval", "summary.json")
    if not os.path.exists(path):
        train_rl(task, out, common, "teacher_eval", ("trainer.val_only=true",), start="teacher")
        with open(path, "w") as f:
            json.dump({**summarize(task, read_metrics(os.path.join(out, "teacher_eval"))), "method": "teacher",
                       "sft_steps": teacher_steps}, f, indent=1)
    with open(path) as f:
        teacher = json.load(f)
    runs = distill_runs(os.path.join(out, "teacher", "final"))
    return teacher, run_methods(task, out, {m: runs[m] for m in methods}, sft_steps=sft_steps, rl_steps=rl_steps,
                                val_freq=val_freq, seed=seed)


def distill_table(teacher: dict, summaries: list[dict]) -> str:
    """One row per run: held-out start -> end (mean of the last 3 evaluations), the first evaluation at or above
    GRPO's end, and every evaluation (the curve); the teacher's accuracy first."""
    base = next(s["sampled_after"] for s in summaries if s["method"] == "grpo")
    lines = [f"Teacher ({teacher['sft_steps']} SFT steps): {teacher['sampled_before']:.1f} sampled, "
             f"{teacher['greedy_before']:.1f} greedy.", "",
             "| run | held-out (sampled): start -> end | end - teacher's | first step >= GRPO's end | greedy end | "
             "curve (step: sampled) |", "|---|---|---|---|---|---|"]
    for s in summaries:
        reached = next((step for step, v in s["curve"] if step > 0 and v >= base), None)
        curve = ", ".join(f"{step}: {v:.1f}" for step, v in s["curve"])
        lines.append(f"| {s['method']} | {s['sampled_before']:.1f} -> {s['sampled_after']:.1f} | "
                     f"{s['sampled_after'] - teacher['sampled_before']:+.1f} | {reached if reached is not None else '-'} "
                     f"| {s['greedy_after']:.1f} | {curve} |")
    return "\n".join(lines)


def async_table(by_seed: dict[int, list[dict]]) -> str:
    """One row per run: held-out metric after RL for each seed and their mean, its gap to the synchronous run."""
    seeds = sorted(by_seed)
    rows = {s["method"]: {} for summaries in by_seed.values() for s in summaries}
    for seed, summaries in by_seed.items():
        for s in summaries:
            rows[s["method"]][seed] = s
    base = {seed: rows["sync"][seed]["sampled_after"] for seed in seeds if seed in rows.get("sync", {})}
    lines = ["| run | " + " | ".join(f"seed {k}: start -> end" for k in seeds) + " | mean end | mean end - sync's "
             "| greedy end (mean) | RL s (mean) |", "|---|" + "---|" * (len(seeds) + 4)]
    for name, per in rows.items():
        ends = [per[k]["sampled_after"] for k in seeds if k in per]
        gap = [per[k]["sampled_after"] - base[k] for k in seeds if k in per and k in base]
        cells = [f"{per[k]['sampled_before']:.1f} -> {per[k]['sampled_after']:.1f}" if k in per else "-" for k in seeds]
        mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {mean(ends):.1f} | {mean(gap):+.1f} | "
                     f"{mean([per[k]['greedy_after'] for k in per]):.1f} | {mean([per[k]['rl_seconds'] for k in per]):.0f} |")
    return "\n".join(lines)


def hybrids_table(summaries: list[dict]) -> str:
    """One row per method: held-out metric start -> end, its gain, and the gain over GRPO's."""
    base = next((s["sampled_lift"] for s in summaries if s["method"] == "grpo"), float("nan"))
    lines = ["| method | held-out (sampled): start -> end | gain | gain - GRPO's | greedy: start -> end | RL s |",
             "|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(f"| {s['method']} | {s['sampled_before']:.1f} -> {s['sampled_after']:.1f} | "
                     f"{s['sampled_lift']:+.1f} | {s['sampled_lift'] - base:+.1f} | "
                     f"{s['greedy_before']:.1f} -> {s['greedy_after']:.1f} | {s['rl_seconds']:.0f} |")
    return "\n".join(lines)


def summarize(task: Task, rows: list[dict], average: int = 3) -> dict:
    """Held-out metric before GRPO (the step-0 evaluation) and after (mean of the last `average` evaluations),
    sampled and greedy, in the task's units; training reward over the first and last 20 steps (half the steps each
    in a run under 40: the two windows never overlap)."""
    def mean(evals: list[dict], key: str) -> float:
        values = [r[key] for r in evals if key in r]
        return task.scale * sum(values) / len(values) if values else float("nan")

    sampled, greedy = f"val/{task.metric}", f"val_greedy/{task.metric}"
    vals = [r for r in rows if sampled in r]
    before, after = [v for v in vals if v["step"] == 0], [v for v in vals if v["step"] > 0][-average:]
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    window = max(1, min(20, len(rewards) // 2))
    s = {"task": task.name, "metric": task.metric, "target": task.target,
         "sampled_before": mean(before, sampled), "sampled_after": mean(after, sampled),
         "greedy_before": mean(before, greedy), "greedy_after": mean(after, greedy),
         "after_steps": [v["step"] for v in after],
         "train_reward_window": window,
         "train_reward_first": sum(rewards[:window]) / max(len(rewards[:window]), 1),
         "train_reward_last": sum(rewards[-window:]) / max(len(rewards[-window:]), 1)}
    s["curve"] = [(v["step"], task.scale * v[sampled]) for v in vals]  # every evaluation, sampled
    s["sampled_lift"] = s["sampled_after"] - s["sampled_before"]
    s["greedy_lift"] = s["greedy_after"] - s["greedy_before"]
    for rate in task.rates:  # sampled, in [0, 1]
        s[f"{rate}_before"] = mean(before, f"val/{rate}") / task.scale
        s[f"{rate}_after"] = mean(after, f"val/{rate}") / task.scale
    return s


def plot_task(task: Task, rows: list[dict], path: str) -> None:
    """Held-out metric (sampled, greedy) and the training reward (20-step moving mean) against the step."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a CPU box
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for key, style in ((f"val/{task.metric}", "o-"), (f"val_greedy/{task.metric}", "s--")):
        steps, values = series(rows, key)
        if steps:
            ax.plot(steps, [task.scale * v for v in values], style, label=f"held-out {key}")
    steps, rewards = series(rows, "reward/mean")
    if steps:
        window = [sum(rewards[max(0, i - 19):i + 1]) / len(rewards[max(0, i - 19):i + 1]) for i in range(len(steps))]
        twin = ax.twinx()
        twin.plot(steps, window, color="gray", alpha=0.6, label="training reward (20-step mean)")
        twin.set_ylabel("training reward")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel(f"{task.metric}" + (" (%)" if task.scale == 100 else ""))
    model = {"qwen2_vl": "Qwen2-VL", "qwen3_vl": "Qwen3-VL"}.get(task.arch, task.arch)
    ax.set_title(f"{task.name}: GRPO from an SFT-warmed tiny {model}")
    handles = [line for a in fig.axes for line in a.get_lines()]  # one legend under the plot for both axes
    ax.legend(handles, [h.get_label() for h in handles], loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def results_table(summaries: list[dict]) -> str:
    """The markdown table of `results.md`: one row per task."""
    lines = ["| task | held-out metric | SFT (before GRPO) | after GRPO | lift | target | greedy: before -> after "
             "| SFT s | GRPO s |", "|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        unit = " pts" if s["metric"] == "accuracy" else ""
        fmt = (lambda v: f"{v:.1f}") if unit else (lambda v: f"{v:.3f}")
        ok = "yes" if s["sampled_lift"] >= s["target"] - 1e-9 else "NO"
        lines.append(f"| {s['task']} | {s['metric']} (sampled) | {fmt(s['sampled_before'])} | {fmt(s['sampled_after'])} "
                     f"| {s['sampled_lift']:+.{1 if unit else 3}f}{unit} | >= +{fmt(s['target'])}{unit} ({ok}) "
                     f"| {fmt(s['greedy_before'])} -> {fmt(s['greedy_after'])} "
                     f"| {s['sft_seconds']:.0f} | {s['rl_seconds']:.0f} |")
    for s in summaries:  # the agents' behaviour beside their metric
        names = TASKS[s["task"]].rates if s["task"] in TASKS else ()
        if not names:
            continue
        rates = ", ".join(f"{r} {s[f'{r}_before']:.2f} -> {s[f'{r}_after']:.2f}" for r in names)
        lines.append(f"\n{s['task']}, share of held-out episodes (sampled) before -> after GRPO: {rates}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = command_parser("proof", __doc__)
    parser.add_argument("--out", default="outputs/proof")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hybrids", action="store_true", help="GRPO and each SFT+RL hybrid from one warm-up "
                        "(--sft-steps, --rl-steps) on the first of --tasks; writes OUT/hybrids.md")
    parser.add_argument("--async", dest="async_", action="store_true", help="the synchronous run and asynchronous "
                        "ones (staleness 1, 2, 4; with and without correction) from one warm-up per --seeds on the "
                        "first of --tasks; writes OUT/async.md")
    parser.add_argument("--distill", action="store_true", help="GRPO and on-policy distillation from a teacher "
                        "warmed --teacher-steps SFT steps, from one student warm-up on the first of --tasks; writes "
                        "OUT/distill.md")
    parser.add_argument("--teacher-steps", type=int, help="with --distill (default 150)")
    parser.add_argument("--seeds", nargs="+", type=int, help="with --async (default 0 1)")
    parser.add_argument("--methods", nargs="+", choices=list(HYBRID_METHODS), help="with --hybrids (default: all)")
    parser.add_argument("--sft-steps", type=int, help="SFT steps of each warm-up (default: the task's "
                        "tiny_cpu_sft.yaml budget)")
    parser.add_argument("--rl-steps", type=int, help="RL steps of each run (default: the task's tiny_cpu.yaml "
                        "budget; 100 with --hybrids, --async, --distill)")
    parser.add_argument("--val-freq", type=int, help="held-out evaluation every N RL steps (default: the task's "
                        "tiny_cpu.yaml; 25 with --hybrids, --async, --distill)")
    args = parser.parse_args(argv)
    for flag, value, mode, default in (("--teacher-steps", "teacher_steps", "distill", 150),
                                       ("--seeds", "seeds", "async_", [0, 1]),
                                       ("--methods", "methods", "hybrids", list(HYBRID_METHODS))):
        if getattr(args, value) is not None and not getattr(args, mode):  # a flag works, or it is refused
            parser.exit(2, f"proof: {flag} applies to --{mode.rstrip('_')} runs only\n")
        if getattr(args, value) is None:
            setattr(args, value, default)
    os.makedirs(args.out, exist_ok=True)
    steps = dict(sft_steps=args.sft_steps, rl_steps=args.rl_steps, val_freq=args.val_freq)
    if args.async_ or args.hybrids or args.distill:  # several runs from one warm-up on the first task
        task, steps = TASKS[args.tasks[0]], dict(steps, rl_steps=args.rl_steps or 100, val_freq=args.val_freq or 25)
        if args.distill:
            name, what, table = "distill.md", "GRPO and on-policy distillation from one student warm-up", \
                distill_table(*run_distill(task, args.out, teacher_steps=args.teacher_steps, seed=args.seed, **steps))
        elif args.async_:
            by_seed = {seed: run_methods(task, os.path.join(args.out, f"seed{seed}"), ASYNC_RUNS, seed=seed, **steps)
                       for seed in args.seeds}
            name, what, table = "async.md", "synchronous and asynchronous GRPO from one warm-up per seed", \
                async_table(by_seed)
        else:
            name, what, table = "hybrids.md", "GRPO and the SFT+RL hybrids from one warm-up", hybrids_table(
                run_hybrids(task, args.out, methods=args.methods, seed=args.seed, **steps))
        with open(os.path.join(args.out, name), "w") as f:
            f.write(f"# {task.name}: {what} ({args.sft_steps or 'default'} SFT steps), {steps['rl_steps']} RL steps "
                    f"each\n\n{table}\n")
        print(f"\n{table}", flush=True)
        return
    for name in args.tasks:
        task = TASKS[name]
        try:
            s = run_task(task, os.path.join(args.out, name), seed=args.seed, **steps)
        except subprocess.CalledProcessError as e:
            parser.exit(1, f"proof: a {name} training run failed (exit status {e.returncode}); its output is above\n")
        plot_task(task, read_metrics(os.path.join(s["outputs"], "grpo")), os.path.join(args.out, f"{name}.png"))
        print(f"\n{write_results(args.out)}", flush=True)


def write_results(out: str) -> str:
    """`out/results.md` from every task's `out/<task>/summary.json` there (runs of single tasks add up);
    returns the table."""
    summaries = []
    for name in TASKS:
        path = os.path.join(out, name, "summary.json")
        if os.path.exists(path):
            with open(path) as f:
                summaries.append(json.load(f))
    table = results_table(summaries)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("# GRPO on SFT-warmed tiny Qwen2-VLs, held-out sets of 200 (python -m rllava.commands.proof)\n\n"
                f"{table}\n\nSampled at the rollout temperature (2 samples per prompt); 'after' = mean of the last 3 "
                "evaluations; 2 CPU cores shared with other work, so the seconds vary. Curves: <task>.png.\n")
    return table


if __name__ == "__main__":
    main()
