"""Math reward, RLLaVA's and EasyR1's (their examples/reward_function/math.py): the response reasons inside
<think> </think> and puts the final answer in \\boxed{}, as examples/format_prompt/math.jinja asks.

    format   = 1 if the response matches <think>...</think>...\\boxed{...}... (whitespace around <, > and / removed
               first, as some models write "< think >")
    accuracy = 1 if mathruler's grade_answer (sympy) finds the last \\boxed{} content equal to the ground truth
    overall  = (1 - format_weight) * accuracy + format_weight * format

`compute_score` is the batch form examples/config.yaml names (reward.reward_type=batch): a list of reward inputs
(response, response_length, ground_truth, ...) in, one dict of scores per input out. For answers in <answer> tags
or ground truths written in them (GeoQA-8K's `solution`), checked by math-verify: math_answer.py.
"""

import re
from typing import Any

from mathruler.grader import extract_boxed_content, grade_answer

FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    return [score_one(r["response"], r["ground_truth"], format_weight) for r in reward_inputs]


def score_one(response: str, ground_truth, format_weight: float = 0.1) -> dict[str, float]:
    """One response's scores (the per-sample form: reward.reward_type=auto calls it as fn(response, ground_truth))."""
    response = re.sub(r"\s*(<|>|/)\s*", r"\1", response)
    fmt = 1.0 if FORMAT.fullmatch(response) else 0.0
    accuracy = 1.0 if grade_answer(extract_boxed_content(response), str(ground_truth)) else 0.0
    return {"overall": (1 - format_weight) * accuracy + format_weight * fmt, "format": fmt, "accuracy": accuracy}
