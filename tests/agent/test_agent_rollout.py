"""The multi-turn driver: masks, image observations (token counts, pixels, M-RoPE over the whole interleaved
sequence), episodes ending at different turns, max_turns, the context budget, tools that fail."""

import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from rllava.agent.rollout import AgentRollout
from rllava.agent.tools import AgentState, Observation, ToolEnv, build_tools, register_tool, zoom
from rllava.config.schema import AgentConfig
from rllava.data.protocol import Batch, Sample, Segment, Trajectory, collate
from rllava.engine.inference.base import Completion, SamplingParams
from rllava.model.forward import token_logprobs
from rllava.model.processor import get_tokenizer, load_processor


@register_tool("echo")
def echo(args, state):
    return Observation(text=f"echo: {args}")


@register_tool("boom")
def boom(args, state):
    raise RuntimeError("disk on fire")


class ScriptedEngine:
    """Writes the scripted turns of each episode in order (episodes told apart by their first prompt token
    after the shared prefix: the sample's text); log-probs from `model` by teacher forcing when given."""

    shares_train_model = True

    def __init__(self, tokenizer, scripts: dict[int, list[str]], model=None):
        self.tok, self.scripts, self.model, self.calls = tokenizer, scripts, model, []

    def generate(self, requests, sampling):
        self.calls.append((len(requests), sampling.max_new_tokens))
        out = []
        for r in requests:
            text = self.tok.decode(r.prompt_ids)
            turns = next(v for k, v in self.scripts.items() if f"episode {k}." in text)
            ids = self.tok.encode(turns[self._turns_done(r)]) + [self.tok.eos_token_id]
            ids = ids[:sampling.max_new_tokens]
            stop = len(ids) and ids[-1] == self.tok.eos_token_id
            out.append([Completion(ids, self._logprobs(r, ids), "stop" if stop else "length")])
        return out

    def _turns_done(self, r) -> int:  # the prompt opens 3 turns (system, user, assistant), each round 2 more
        return (r.prompt_ids.count(self.tok.convert_tokens_to_ids("<|im_start|>")) - 3) // 2

    def _logprobs(self, r, ids):
        if self.model is None:
            return [-1.0] * len(ids)
        t = Trajectory(Sample(0, [], [], None), 0, [Segment(r.prompt_ids, False), Segment(ids, True)], r.mm_inputs)
        lp, _ = token_logprobs(self.model, collate([t], 0))
        return lp[0, len(r.prompt_ids):].tolist()


def _sample(i, images=()):
    content = [{"type": "image"} for _ in images] + [{"type": "text", "text": f"episode {i}."}]
    return Sample(i, [{"role": "user", "content": content}], list(images), None)


@pytest.fixture(scope="module")
def proc(tiny_model_dir):
    return load_processor(tiny_model_dir)


def _rollout(proc, scripts, tools=("echo", "boom", "zoom"), model=None, **kw):
    tok = get_tokenizer(proc)
    env = ToolEnv(build_tools(list(tools), {}), invalid_call_penalty=-0.1)
    args = dict(max_turns=4, max_response_length=400) | kw
    return AgentRollout(ScriptedEngine(tok, scripts, model), proc, env, **args)


def test_turns_trained_observations_given(proc):
    rollout = _rollout(proc, {0: ["<echo>hi</echo>", "<answer>hi</answer>"]})
    (t,) = rollout.generate([_sample(0)], SamplingParams(n=1, max_new_tokens=50))
    tok = get_tokenizer(proc)
    assert [s.trained for s in t.segments] == [False, True, False, True]
    assert tok.decode(t.segments[2].token_ids) == "\n<|im_start|>user\necho: hi<|im_end|>\n<|im_start|>assistant\n"
    assert t.response == "<echo>hi</echo>\n<answer>hi</answer>" and t.finish_reason == "stop"
    batch = collate([t], tok.pad_token_id)
    n = [len(s.token_ids) for s in t.segments]
    assert batch.loss_mask[0].tolist() == [0.0] * n[0] + [1.0] * n[1] + [0.0] * n[2] + [1.0] * n[3]
    assert t.turn_rewards == [0.0, 0.0] and t.agent.calls == [("echo", "hi")]
    # the whole row is what the chat template makes of the conversation
    text = proc.apply_chat_template(_sample(0).messages + [
        {"role": "assistant", "content": "<echo>hi</echo>"}, {"role": "user", "content": "echo: hi"},
        {"role": "assistant", "content": "<answer>hi</answer>"}], tokenize=False)
    assert tok.decode(batch.input_ids[0]) == text.rstrip("\n")


def test_episodes_end_at_different_turns_and_tools_fail_softly(proc):
    scripts = {0: ["<answer>1</answer>"], 1: ["<boom>x</boom>", "<echo>b</echo>", "<answer>2</answer>"],
               2: ["<echo>a</echo>", "no call, no answer"]}
    rollout = _rollout(proc, scripts)
    trajs = rollout.generate([_sample(i) for i in range(3)], SamplingParams(n=2, max_new_tokens=50))
    assert [t.group_id for t in trajs] == [0, 0, 1, 1, 2, 2]
    assert [len(t.turn_rewards) for t in trajs] == [1, 1, 3, 3, 2, 2]
    assert trajs[2].turn_rewards == [-0.1, 0.0, 0.0]  # the failing tool's turn is penalised
    tok = get_tokenizer(proc)
    obs = tok.decode(trajs[2].segments[2].token_ids)
    assert "Error: boom failed: RuntimeError: disk on fire" in obs
    assert [n for n, _ in rollout.engine.calls] == [6, 4, 2]  # each round batches the unfinished episodes


def test_json_calls_and_unknown_tools():
    env = ToolEnv(build_tools(["echo"], {}), tool_format="json", invalid_call_penalty=-1.0)
    state = AgentState(Sample(0, [], [], None))
    assert env.step(state, '<tool_call>{"name": "echo", "arguments": {"q": 1}}</tool_call>').text == "echo: {'q': 1}"
    assert env.step(state, '<tool_call>{"name": "zoom"}</tool_call>').text == \
        "Error: there is no tool 'zoom' (tools: echo)"
    bad = env.step(state, "<tool_call>{name: echo}</tool_call>")
    assert bad.error and bad.reward == -1.0 and "not valid JSON" in bad.text
    assert env.step(state, "<echo>x</echo>").done  # tags are not calls in the json format
    assert env.step(state, "<answer>4</answer>").done


def test_max_turns_and_context_budget(proc):
    loop = {0: ["<echo>again</echo>"] * 10}
    (t,) = _rollout(proc, loop, max_turns=3).generate([_sample(0)], SamplingParams(max_new_tokens=50))
    assert sum(s.trained for s in t.segments) == 3 and not t.segments[-1].token_ids == []
    assert t.segments[-1].trained  # the last turn's call is not run: no observation after it
    (t,) = _rollout(proc, loop, max_response_length=40).generate([_sample(0)], SamplingParams(max_new_tokens=50))
    assert t.num_response_tokens + sum(len(s.token_ids) for s in t.segments[1:] if not s.trained) <= 40
    assert t.finish_reason == "length"


def test_zoom_crops_the_pixels_the_model_pointed_at():
    img = Image.new("RGB", (200, 100), (0, 0, 0))
    img.paste((255, 0, 0), (100, 50, 150, 100))  # red in the stored image's [100, 50, 150, 100]
    state = AgentState(Sample(0, [], [img], None), images=[img], model_sizes=[(100, 50)])  # seen at half size
    obs = zoom("[50, 25, 75, 50]", state)
    assert obs.images[0].size == (50, 50) and obs.images[0].getpixel((25, 25)) == (255, 0, 0)
    tiny = zoom({"bbox_2d": [0, 0, 2, 2]}, state).images[0]  # grown to 28 px, kept inside the image
    assert tiny.size == (28, 28)
    env = ToolEnv({"zoom": zoom}, invalid_call_penalty=-0.05)
    for bad in ("[5, 5, 1, 1]", "[300, 300, 400, 400]", "left half"):
        o = env.step(state, f"<zoom>{bad}</zoom>")
        assert o.error and o.reward == -0.05 and o.text.startswith("Error: zoom: ") and not o.images


def test_image_observations_forward_equals_rollout(tiny_model_dir, proc):
    """Three turns, two returned crops: the training forward over the whole interleaved row (M-RoPE positions
    over all images) gives the log-probs the engine computed turn by turn, padded and padding-free."""
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, attn_implementation="sdpa",
                                                        dtype=torch.float32).eval()
    image = Image.new("RGB", (112, 84), (30, 140, 220))
    image.paste((250, 200, 0), (20, 10, 70, 50))
    scripts = {0: ["<zoom>[0, 0, 56, 56]</zoom>", "<zoom>[10, 10, 40, 40]</zoom>", "<answer>yellow</answer>"],
               1: ["<answer>blue</answer>"]}
    rollout = _rollout(proc, scripts, model=model)
    trajs = rollout.generate([_sample(0, [image]), _sample(1, [image])], SamplingParams(max_new_tokens=50))
    t = trajs[0]
    assert len(t.agent.images) == 3 and t.mm_inputs["image_grid_thw"].shape[0] == 3
    tok = get_tokenizer(proc)
    batch = collate(trajs, tok.pad_token_id)
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = proc.image_processor.merge_size ** 2
    assert (batch.input_ids[0] == pad).sum() == t.mm_inputs["image_grid_thw"].prod(-1).sum() // merge
    rollout_lp = torch.tensor([lp for s in t.segments if s.trained for lp in s.logprobs])
    with torch.no_grad():
        for padding_free in (False, True):
            lp, _ = token_logprobs(model, batch, padding_free=padding_free)
            trained = lp[0][batch.loss_mask[0].bool()]
            torch.testing.assert_close(trained, rollout_lp, atol=1e-4, rtol=1e-4)


def test_replay_expert_turns_through_the_tools(proc):
    """Multi-turn SFT: the expert's turns trained (teacher-forced), the tools' answers given in between."""
    rollout = _rollout(proc, {})
    sample = _sample(0)
    sample.target = ["<echo>hi</echo>", "<answer>hi</answer>", "never reached"]
    (t,) = rollout.replay([sample])
    tok = get_tokenizer(proc)
    assert [(s.trained, s.off_policy) for s in t.segments] == [(False, False), (True, True), (False, False),
                                                                (True, True)]
    assert "echo: hi" in tok.decode(t.segments[2].token_ids) and t.segments[3].token_ids[-1] == tok.eos_token_id
    assert t.response == "<echo>hi</echo>\n<answer>hi</answer>"
    sample.target = {"turns": 2}
    with pytest.raises(ValueError, match="record 0: an agent's expert trajectory .* is a list of turn texts, not dict"):
        rollout.replay([sample])


def test_a_rounds_tool_calls_run_at_once_up_to_tool_workers(proc):
    """Four episodes call a slow tool in the same round: with tool_workers=2 two calls run at a time (never
    more), with 1 they run one by one; the observations go back to their own episodes either way."""
    import threading
    import time

    active, peak, lock = [0], [0], threading.Lock()

    @register_tool("slow")
    def slow(args, state):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return Observation(text=f"slow: {args}")

    scripts = {i: [f"<slow>{i}</slow>", "<answer>1</answer>"] for i in range(4)}
    for workers, expected in ((2, 2), (1, 1)):
        peak[0] = 0
        trajs = _rollout(proc, scripts, tools=("slow",), tool_workers=workers).generate(
            [_sample(i) for i in range(4)], SamplingParams(max_new_tokens=50))
        assert peak[0] == expected
        assert [t.agent.calls for t in trajs] == [[("slow", str(i))] for i in range(4)]
        assert all(f"slow: {i}" in proc.tokenizer.decode(t.segments[2].token_ids) for i, t in enumerate(trajs))


def test_a_rounds_observations_are_bounded_as_they_arrive(proc):
    """Issue 45.4 (and 45.2 in the trainer): a round's observations held every image at full size until the
    round ended (64 code calls of four 4096 x 4096 16-bit PNGs: +4.4 GB). Each image is brought to
    data.max_pixels as its call returns (the full-size ones are gone before the next call runs), a round adds
    at most rollout.agent.round_image_mb of them (the rest are dropped with a note the model reads), and text
    with a lone surrogate (a file name that is not UTF-8) reaches the tokenizer as U+FFFD: it raised TypeError."""
    import weakref

    import numpy as np

    returned, alive = [], []

    @register_tool("flood")
    def flood(args, state):
        alive.append(sum(r() is not None for r in returned))  # the previous calls' full-size images still held
        images = [Image.fromarray(np.full((1024, 1024), 40000, np.uint16)) for _ in range(4)]  # I;16
        returned.extend(weakref.ref(im) for im in images)
        return Observation(text="\udcff.png", images=images)

    scripts = {i: ["<flood>x</flood>", "<answer>1</answer>"] for i in range(4)}
    rollout = _rollout(proc, scripts, tools=("flood",), max_pixels=256 * 256, round_image_mb=1,
                       max_response_length=4000)
    trajs = rollout.generate([_sample(i) for i in range(4)], SamplingParams(max_new_tokens=50))
    shown = [[im.size for im in t.agent.images] for t in trajs]
    assert alive == [0, 0, 0, 0]
    assert shown == [[(256, 256)] * 4, [(256, 256)], [], []]  # 5 x 192 KB of RGB fit in 1 MB
    texts = [proc.tokenizer.decode(t.segments[2].token_ids) for t in trajs]
    assert all("\ufffd.png" in t for t in texts) and "not shown" not in texts[0]
    assert "3 images not shown: this round's observations passed rollout.agent.round_image_mb=1" in texts[1]
    assert _rollout(proc, scripts).round_image_mb == AgentConfig().round_image_mb


@register_tool("nap")
def nap(args, state):
    import time

    time.sleep(float(args))
    return Observation(text="rested")


def test_async_mode_episodes_go_on_without_rounds(proc):
    """rollout.async_mode: episode 1's quick calls do not wait for episode 0's slow one. With rounds the
    engine calls batch [both, both, 1]; without, episode 1 writes its last two turns while episode 0 still
    naps, and episode 0's answer comes last, alone. The trajectories are the same."""
    scripts = {0: ["<nap>2</nap>", "<answer>0</answer>"], 1: ["<echo>a</echo>", "<echo>b</echo>", "<answer>1</answer>"]}
    sampling = SamplingParams(n=1, max_new_tokens=50)
    rounds = _rollout(proc, scripts, tools=("echo", "nap"), tool_workers=4)
    expected = rounds.generate([_sample(0), _sample(1)], sampling)
    assert [n for n, _ in rounds.engine.calls] == [2, 2, 1]
    free = _rollout(proc, scripts, tools=("echo", "nap"), tool_workers=4, asynchronous=True)
    got = free.generate([_sample(0), _sample(1)], sampling)
    assert [n for n, _ in free.engine.calls] == [2, 1, 1, 1]
    assert [(t.response, [s.token_ids for s in t.segments]) for t in got] == \
        [(t.response, [s.token_ids for s in t.segments]) for t in expected]


def test_partial_rollouts_pause_episodes_between_turns(proc, tmp_path):
    """rollout.partial_rollout with an agent: a round is one turn of every running episode. Two groups being
    written: episode 0 answers at once, episode 1 calls twice; after round 2 episodes 0 and 2 make the batch and
    episode 1 waits, paused after its second turn, to finish under the next weights (versions 0, 0, 1), with
    episode 4, while episode 3 pauses. The
    paused pool goes through a weights_only checkpoint file and goes on as the live one does."""
    from rllava.roles.rollout import PartialRollouts

    scripts = {0: ["<answer>0</answer>"], 1: ["<echo>a</echo>", "<echo>b</echo>", "<answer>1</answer>"],
               2: ["<answer>2</answer>"], 3: ["<echo>c</echo>", "<answer>3</answer>"], 4: ["<answer>4</answer>"]}
    data = [_sample(i) for i in range(5)]
    draws = iter([data[:2], data[2:4], data[4:]])
    sampling = SamplingParams(n=1, max_new_tokens=50)
    pool = PartialRollouts(_rollout(proc, scripts, tools=("echo",)), data, chunk=0, max_new_tokens=50)
    first = pool.next_batch(lambda: next(draws), sampling, 2, version=0)
    assert [t.sample.index for t in first] == [0, 2] and [t.group_id for t in first] == [0, 1]
    (paused,) = [e for g in pool.groups for e in g]
    assert paused.sample.index == 1 and paused.turn_texts == ["<echo>a</echo>", "<echo>b</echo>"]
    path = tmp_path / "pool.pt"
    torch.save(pool.state_dict(), path)
    again = PartialRollouts(_rollout(proc, scripts, tools=("echo",)), data, chunk=0, max_new_tokens=50)
    again.load_state_dict(torch.load(path, weights_only=True))
    again.waiting = list(pool.waiting)
    rest = iter([data[4:]])
    second = pool.next_batch(lambda: next(draws), sampling, 2, version=1)
    resumed = again.next_batch(lambda: next(rest), sampling, 2, version=1)
    assert [t.sample.index for t in second] == [1, 4]  # episode 3 called a tool: paused in its turn
    one = second[0]
    assert [s.version for s in one.segments if s.trained] == [0, 0, 1] and one.agent.calls == [("echo", "a"), ("echo", "b")]
    assert [(t.sample.index, t.response, [s.token_ids for s in t.segments], [s.version for s in t.segments])
            for t in resumed] == [(t.sample.index, t.response, [s.token_ids for s in t.segments],
                                   [s.version for s in t.segments]) for t in second]
    assert resumed[0].agent.step_reward == second[0].agent.step_reward == 2.0  # RLLaVA's step_reward, checkpointed


def test_the_reward_reads_each_turn_and_rllavas_step_reward(proc):
    """RLLaVA's agentic rewards read the last turn (its workflow's response) and `step_reward`: the environment's
    step rewards over the observations shown, 1 for each step that ran in RLLaVA's environments. Here: 1 for each
    call that ran, 0 for one that failed, nothing for a call in the last turn (no tool runs there)."""
    from rllava.reward.function import sample_fields

    scripts = {0: ["<echo>a</echo>", "<boom>x</boom>", "<echo>b</echo>", "<echo>c</echo>"], 1: ["<answer>1</answer>"]}
    ran, answered = _rollout(proc, scripts).generate([_sample(0), _sample(1)], SamplingParams(n=1, max_new_tokens=50))
    fields = sample_fields(ran)
    assert fields["turn_texts"] == scripts[0] and fields["response"] == "\n".join(scripts[0])
    assert fields["step_reward"] == 2.0 and ran.turn_rewards == [0.0, -0.1, 0.0, 0.0]
    assert sample_fields(answered)["step_reward"] == 0.0 and sample_fields(answered)["turn_texts"] == scripts[1]


ROUND = r'''
import json, resource, sys
from PIL import Image
sys.path.insert(0, REPO)
import rllava.agent.code  # noqa: F401 - registers the code tool
from rllava.agent.rollout import AgentRollout
from rllava.agent.tools import ToolEnv, build_tools
from rllava.engine.inference.base import SamplingParams
from rllava.model.processor import get_tokenizer, load_processor
from tests.agent.test_agent_rollout import ScriptedEngine, _sample

HOSTILE = [
    "from PIL import Image\nfor i in range(4):\n    Image.new('RGB', (256, 256), (i, 0, 0)).save(f'i{i}.png')\n",
    "import sys\nsys.stdout.write('x' * 10000000)\n",
    "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\npidfd = os.pidfd_open(1)\n"
    "print([libc.syscall(438, pidfd, fd, 0) for fd in range(3, 40)])\n",
    "from PIL import Image\nImage.new('RGB', (64, 64)).save(bytes([255]) + b'.png', format='PNG')\n",
    "import io\nfrom PIL import Image\nb = io.BytesIO()\nImage.new('L', (256, 256)).save(b, 'JPEG', progressive=True)\n"
    "j = b.getvalue()\nopen('s.jpg', 'wb').write(j[:-2] + bytes.fromhex('ffda000801010001' + '3f10') * 500 + j[-2:])\n",
    "import os\nwhile True:\n    os.fork()\n",
    "x = bytearray(1 << 40)\n",
    "for i in range(100000):\n    open('f%06d' % i, 'w').close()\n",
]
proc = load_processor(sys.argv[1])
tok = get_tokenizer(proc)
limits = dict(max_images=4, max_pixels=256 * 256, output_chars=500, memory_mb=512, processes=8, files=256,
              wall_s=5.0, cpu_s=2)


def round_of(n):
    scripts = {i: ["<code>" + HOSTILE[i % len(HOSTILE)] + "</code>", "<answer>1</answer>"] for i in range(n)}
    env = ToolEnv(build_tools(["code"], {"code": limits}), invalid_call_penalty=-0.1)
    rollout = AgentRollout(ScriptedEngine(tok, scripts), proc, env, max_turns=3, max_response_length=4000,
                           tool_workers=8, max_pixels=128 * 128, round_image_mb=2)
    return rollout.generate([_sample(i) for i in range(n)], SamplingParams(max_new_tokens=400))


round_of(16)  # warm-up: imports, decoders, the jail pool
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
trajs = round_of(64)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_mb": (after - before) / 1024, "episodes": len(trajs),
                  "images": sum(len(t.agent.images) for t in trajs)}))
'''


@pytest.mark.slow
def test_a_round_of_64_hostile_code_calls_grows_the_trainer_within_its_bound(tiny_model_dir):
    """Issue 45 (done when): a round of 64 hostile code calls (images at max_images x max_pixels, 10 MB of
    output, PID 1's report pipe taken, a non-UTF-8 name, a costly JPEG, fork / memory / file floods), 8 at a
    time, completes (no snippet makes the step raise) and the trainer's peak RSS grows by at most the documented
    bound (docs/agents.md): tool_workers x (max_images x 4 x max_pixels + 8 x output_chars) + round_image_mb
    + 24 MB (the interpreter's own: read buffers, arenas), here 8 x 1.0 MB + 2 MB + 24 MB = 34 MB (14 MB
    measured; issue 58.8: the report is no longer held as bytes). Measured in a process of its own (ru_maxrss is
    a lifetime peak), after a warm-up round."""
    from rllava.agent import sandbox

    try:
        sandbox.check()
    except Exception as e:  # noqa: BLE001
        pytest.skip(str(e))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", f"REPO = {repo!r}\n" + ROUND, tiny_model_dir], capture_output=True,
                         text=True, cwd=repo, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    bound = 8 * (4 * 4 * 256 * 256 + 8 * 500) / 2 ** 20 + 2 + 24
    assert got["episodes"] == 64 and got["images"] > 0, got
    assert got["growth_mb"] <= bound, (got, bound)


HELD = r'''
import json, sys
from PIL import Image
sys.path.insert(0, REPO)
from rllava.agent.rollout import AgentRollout
from rllava.agent.tools import Observation, ToolEnv, build_tools, register_tool
from rllava.engine.inference.base import SamplingParams
from rllava.model.processor import get_tokenizer, load_processor
from tests.agent.test_agent_rollout import ScriptedEngine, _sample

@register_tool("big")
def big(args, state):
    return Observation(text="big", images=[Image.new("RGB", (4096, 4096), (i, 0, 0)) for i in range(2)])

proc = load_processor(sys.argv[1])
tok = get_tokenizer(proc)

def rss_mb():
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) / 1024

def round_of(n):
    scripts = {i: ["<big>x</big>", "<answer>1</answer>"] for i in range(n)}
    rollout = AgentRollout(ScriptedEngine(tok, scripts), proc, ToolEnv(build_tools(["big"], {})), max_turns=3,
                           max_response_length=4000, tool_workers=8, max_pixels=128 * 128)
    return rollout.generate([_sample(i) for i in range(n)], SamplingParams(max_new_tokens=400))

round_of(8)
before = rss_mb()
trajs = round_of(32)
print(json.dumps({"held_mb": rss_mb() - before, "episodes": len(trajs)}))
'''


@pytest.mark.slow
def test_a_round_of_tool_threads_gives_back_the_memory_its_images_freed(tiny_model_dir):
    """Issue 58.8: 64 code calls of 4 images of 4096 x 4096 over 8 workers left the trainer +2 GB after the round:
    freed, but kept in each tool thread's glibc arena. The round hands it back (`_give_back_freed_memory`): 32
    calls of 2 such images from a stand-in tool on 8 threads hold +41 MB after the round (1,062 MB untrimmed)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", f"REPO = {repo!r}\n" + HELD, tiny_model_dir], capture_output=True,
                         text=True, cwd=repo, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["episodes"] == 32 and got["held_mb"] <= 64, got
