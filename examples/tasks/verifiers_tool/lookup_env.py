"""A two-turn verifiers ToolEnv over generated local data (`make proof`'s verifiers_tool row; docs/proof.md):

    rollout.agent.environment=verifiers:examples/tasks/verifiers_tool/lookup_env.py:load_environment

Each key (four random letters) has a random three-digit code that only the `lookup` tool knows. A question asks
for a key's code; the episode is the model's call (`lookup(key)`), the tool's result, then the answer inside
<answer></answer>. The held-out questions (`eval_dataset`) ask for keys no training question asks for, so their
codes cannot be learnt, only looked up. The rubric: 1 when the last message holds `<answer>CODE</answer>`."""

import random
import string

import verifiers as vf
from datasets import Dataset

CODES: dict[str, str] = {}  # every key's code, training and held-out keys alike (the tool's table)


def lookup(key: str) -> str:
    """The code of a key.

    Args:
        key: the key, four letters
    """
    return CODES.get(key.strip(), "unknown key")


def correct(completion, answer) -> float:
    """1 when the last assistant message says the code inside <answer> tags."""
    text = completion[-1].content if completion else ""
    return float(f"<answer>{answer}</answer>" in (text or ""))


def questions(num_train: int = 2000, num_eval: int = 200, keys: int = 400, seed: int = 0):
    """(train rows, held-out rows): `keys` training keys asked `num_train` times, `num_eval` other keys once."""
    rng = random.Random(seed)
    names = set()
    while len(names) < keys + num_eval:
        names.add("".join(rng.choice(string.ascii_lowercase) for _ in range(4)))
    names = sorted(names)
    rng.shuffle(names)
    CODES.clear()
    CODES.update({name: str(rng.randint(100, 999)) for name in names})
    row = lambda name: {"question": f"What is the code of {name}?", "answer": CODES[name]}  # noqa: E731
    train = [row(rng.choice(names[:keys])) for _ in range(num_train)]
    return train, [row(name) for name in names[keys:]]


def load_environment(num_train: int = 2000, num_eval: int = 200, keys: int = 400, seed: int = 0):
    train, held_out = questions(num_train, num_eval, keys, seed)
    return vf.ToolEnv(dataset=Dataset.from_list(train), eval_dataset=Dataset.from_list(held_out), tools=[lookup],
                      max_turns=2, rubric=vf.Rubric(funcs=[correct]))


def expert(row) -> list[dict]:
    """The expert's episode on a row, as OpenAI messages after its prompt: the call, the tool's result, the
    answer (what `make proof` warms the model up on)."""
    key = row["question"].removeprefix("What is the code of ").removesuffix("?")
    call = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": f'{{"key": "{key}"}}'}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": lookup(key)},
            {"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}]
