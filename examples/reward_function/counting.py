"""Counting reward: the response must be exactly `<answer>N</answer>` with the right integer N.

    overall  = format * accuracy   (strict: the measured recipe that learns on CPU; a loose reward let the
                                    model stop emitting EOS, see docs/cpu_learning.md)
    format   = 1 if the whole response is one <answer>integer</answer> (after an optional <think>...</think>)
    accuracy = 1 if the first <answer> tag holds the ground-truth integer
"""

import re
from typing import Any

from rllava.reward.boxes import answer_text, strict_answer

_INTEGER = re.compile(r"\s*(-?[0-9]{1,9})\s*")


def _integer(text):
    match = _INTEGER.fullmatch(text) if isinstance(text, str) else None
    return int(match.group(1)) if match else None


def compute_score(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The batch form examples/config.yaml names (reward.reward_type=batch): one dict of scores per input."""
    return [score_one(r["response"], r["ground_truth"]) for r in reward_inputs]


def score_one(response: str, ground_truth) -> dict:
    truth = _integer(str(ground_truth))
    fmt = 1.0 if _integer(strict_answer(response)) is not None else 0.0
    answer = _integer(answer_text(response))
    accuracy = 1.0 if answer is not None and answer == truth else 0.0
    return {"overall": fmt * accuracy, "format": fmt, "accuracy": accuracy}
