"""A two-turn verifiers ToolEnv over generated local data (`make proof`'s verifiers_tool row; docs/proof.md):

    rollout.agent.environment=verifiers:examples/tasks/verifiers_tool/lookup_env.py:load_environment

A few keys (two random letters each) have codes (one random digit) that change from one episode to the next,
like a price or a reading: each row carries its day's table in `info`, which only the `lookup` tool reads (a
verifiers StatefulToolEnv injects it, hidden from the model's schema). A question asks for a key's code; the episode
is the model's call (`lookup(key)`), the tool's result, then the answer inside <answer></answer>. The held-out
questions (`eval_dataset`) ask about the same keys on other days: their codes cannot be learnt, only looked up.
The rubric: 1 when the last message holds `<answer>CODE</answer>`."""

import random
import string

import verifiers as vf
from datasets import Dataset


def lookup(key: str, codes: dict) -> str:
    """Today's code of a key.

    Args:
        key: the key, two letters
    """
    return codes.get(key.strip(), "unknown key")


def correct(completion, answer) -> float:
    """1 when the last assistant message says the code inside <answer> tags."""
    text = completion[-1].content if completion else ""
    return float(f"<answer>{answer}</answer>" in (text or ""))


def questions(num_train: int = 2000, num_eval: int = 200, keys: int = 8, seed: int = 0):
    """(train rows, held-out rows): each row asks for one of `keys` keys, with its own day's table of codes."""
    if keys > 26 ** 2:
        raise ValueError(f"keys = {keys}: there are only {26 ** 2} two-letter keys")
    rng = random.Random(seed)
    names = set()
    while len(names) < keys:
        names.add("".join(rng.choice(string.ascii_lowercase) for _ in range(2)))
    names = sorted(names)

    def row() -> dict:
        codes = {name: str(rng.randint(0, 9)) for name in names}
        name = rng.choice(names)
        # the key in quotes: the tiny tokenizer then splits it as in the call's `"key": "..."`
        return {"question": f'What is the code of "{name}"?', "answer": codes[name], "info": {"codes": codes}}

    return [row() for _ in range(num_train)], [row() for _ in range(num_eval)]


class LookupEnv(vf.StatefulToolEnv):
    """A ToolEnv whose `lookup` reads the episode's table (`info.codes`), an argument the model does not see."""

    def __init__(self, **kwargs):
        super().__init__(tools=[], **kwargs)
        self.add_tool(lookup, args_to_skip=["codes"])

    def update_tool_args(self, tool_name, tool_args, messages, state, **kwargs) -> dict:
        return {**tool_args, "codes": state["info"]["codes"]}


def load_environment(num_train: int = 2000, num_eval: int = 200, keys: int = 8, seed: int = 0):
    train, held_out = questions(num_train, num_eval, keys, seed)
    return LookupEnv(dataset=Dataset.from_list(train), eval_dataset=Dataset.from_list(held_out), max_turns=2,
                     rubric=vf.Rubric(funcs=[correct]))


def expert(row) -> list[dict]:
    """The expert's episode on a row, as OpenAI messages after its prompt: the call, the tool's result, the
    answer (what `make proof` warms the model up on)."""
    key = row["question"].removeprefix('What is the code of "').removesuffix('"?')
    call = {"id": "call_0", "type": "function", "function": {"name": "lookup", "arguments": f'{{"key": "{key}"}}'}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": lookup(key, row["info"]["codes"])},
            {"role": "assistant", "content": f"<answer>{row['answer']}</answer>"}]
