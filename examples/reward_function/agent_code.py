"""Agent-code reward for one step, RLLaVA's (its examples/reward_function/agent_code.py, with
examples/format_prompt/agent_code.jinja in RLLaVA's qwen2_5_vl_3b_agent_code_online.sh): MAT-Coding's RFT data gives a
reasoning chain so far, and the response is the next step: the image's problems, code, or the answer. rllava's reward
for multi-turn episodes with the sandboxed `code` tool is agent_code_f1.py; RLLaVA's multi-turn one is
agent_code_agentic.py.

    ground truth <answer>gold</answer>:   accuracy = 0 if the response has <code> or <problem>, else
                                          F1(the response's first <answer> on one line, else all of it; gold)
    ground truth <code>...</code>:        accuracy = 0 if the response has <answer> or <problem>, else 0.9 (any code)
    ground truth <problem>{...}</problem>: accuracy = 0 if the response has <answer> or <code>; else 0.5 when the
                                          gold holds two labels, one of them rotation90 (or, failing that,
                                          rotation180), and the response names that one label alone; else 0
    any other ground truth:               accuracy = 0
    format   = 0 with two <answer>, <code>, <think> or <problem> tags; else 1 if the response starts with
               <think>...</think> and then (after whitespace), by the first of these it holds: <answer>...</answer>;
               <code> ```python ... ``` ... </code>; exactly <problem> {'label', ...} </problem> and nothing after
    overall  = (1 - format_weight) * accuracy + format_weight * format      (format_weight 0.5)

Labels are the quoted words of the first <problem> {...} </problem>. A response whose labels equal the gold's scores 0
too: RLLaVA's code means to give it 1, but there its `reward` is unset at that point and its `except` returns 0; this
file keeps RLLaVA's scores. F1 is RLLaVA's (as agent_search.py: distinct common tokens). The sequential form RLLaVA's
script sets (reward.reward_type=sequential): one reward input a call.
"""

import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_search import _first, f1  # noqa: E402  (RLLaVA's token F1)

ANSWER_STEP = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
CODE_STEP = re.compile(r"<think>.*?</think>\s*<code>\s*```python(.*?)```.*?</code>", re.DOTALL)
PROBLEM_STEP = re.compile(r"^<think>.*?</think>\s*<problem>\s*\{\s*'[^']+'\s*(?:,\s*'[^']+'\s*)*\}\s*</problem>$",
                          re.DOTALL)
PROBLEM = re.compile(r"<problem>\s*\{(.*?)\}\s*</problem>", re.DOTALL)
TAGS = ("<answer>", "<code>", "<problem>")


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    response = reward_input["response"]
    fmt, acc = format_score(response), accuracy(response, reward_input["ground_truth"])
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}


def format_score(response: str) -> float:
    if any(response.count(tag) >= 2 for tag in (*TAGS, "<think>")):
        return 0.0
    for tag, step in zip(TAGS, (ANSWER_STEP, CODE_STEP, PROBLEM_STEP)):
        if tag in response:
            return 1.0 if step.match(response) else 0.0
    return 0.0


def accuracy(response: str, ground_truth) -> float:
    if not isinstance(ground_truth, str):
        return 0.0
    for tag in TAGS:  # the gold's step: the first of these tags it holds
        if tag in ground_truth:
            if any(other in response for other in TAGS if other != tag):
                return 0.0
            if tag == "<answer>":
                return f1(_first(response, "answer"), _first(ground_truth, "answer"))
            return 0.9 if tag == "<code>" else _half_right(labels(ground_truth), labels(response))
    return 0.0


def labels(text: str) -> list[str]:
    """The quoted labels of the first <problem> {'a', 'b'} </problem>, sorted ([] without one)."""
    found = PROBLEM.search(text)
    return sorted(re.findall(r"'([^']+)'", found.group(1))) if found else []


def _half_right(gold: list[str], predicted: list[str]) -> float:
    """RLLaVA's <problem> score: 0.5 for one of two gold labels given alone (rotation90, else rotation180)."""
    for label in ("rotation90", "rotation180"):
        if len(gold) == 2 and label in gold:
            return 0.5 if len(predicted) == 1 and label in predicted else 0.0
    return 0.0
