"""Counting / R1-V reward, RLLaVA's (its examples/reward_function/r1v.py, the CLEVR scripts' reward): reasoning in
<think> </think>, then the answer in <answer> </answer>, as examples/format_prompt/r1v.jinja asks.

    format   = 1 if the whole response is <think>...</think> <answer>...</answer>
    accuracy = 1 if mathruler's grade_answer finds the first <answer> content (else the whole response) equal to
               the ground truth (its own <answer> tags removed)
    overall  = (1 - format_weight) * accuracy + format_weight * format;  compute_score_without_format: accuracy

The sequential form RLLaVA's scripts set (reward.reward_type=sequential): one reward input (response, ground_truth,
...) per call. rllava's own counting reward (exact integer, strict format) is counting.py.
"""

import re
from typing import Any

from mathruler.grader import grade_answer

FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def accuracy(response: str, ground_truth) -> float:
    given, truth = ANSWER.search(response), ANSWER.search(str(ground_truth))
    truth = truth.group(1).strip() if truth else str(ground_truth).strip()
    try:
        return float(grade_answer(given.group(1).strip() if given else response.strip(), truth))
    except Exception:  # sympy on a malformed expression: no credit, as RLLaVA's
        return 0.0


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    fmt = 1.0 if FORMAT.fullmatch(reward_input["response"]) else 0.0
    acc = accuracy(reward_input["response"], reward_input["ground_truth"])
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}


def compute_score_without_format(reward_input: dict[str, Any]) -> dict[str, float]:
    return {"overall": accuracy(reward_input["response"], reward_input["ground_truth"])}
