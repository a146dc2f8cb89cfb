"""Agent-code reward, rllava's, for multi-turn episodes with the sandboxed `code` tool (MAT-Coding style; prompt
examples/format_prompt/agent_code_tool.jinja): the answer about the restored image, its format, and code that ran.
RLLaVA's rewards are agent_code.py (one step of its RFT data) and agent_code_agentic.py (its multi-turn workflow).

    overall = 0.8 * f1 + 0.1 * format + 0.1 * ran
    f1      = SQuAD's token F1 of the last <answer>...</answer> against the ground truth (as agent_search_f1.py)
    format  = 1 if the last turn is one <answer>...</answer> (after an optional <think>...</think>)
    ran     = the share of the episode's code calls that ran without an error or a limit (0 without a call)
Logged beside them: `coded` (the episode called the code tool) and `accuracy` (f1 == 1).
"""

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_search_f1 import _ANSWER, _FINAL, f1  # noqa: E402


def compute_score(reward_inputs: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The batch form examples/config.yaml names (reward.reward_type=batch): one dict of scores per input."""
    return [score_one(r["response"], r["ground_truth"], r.get("tool_calls", ()), r.get("tool_memory"))
            for r in reward_inputs]


def score_one(response: str, ground_truth, tool_calls=(), tool_memory=None) -> dict:
    answers = _ANSWER.findall(response)
    score = f1(answers[-1], str(ground_truth)) if answers else 0.0
    fmt = 1.0 if _FINAL.fullmatch(response.split("\n")[-1]) else 0.0
    code = (tool_memory or {}).get("code", {"calls": 0, "ran": 0})
    ran = code["ran"] / code["calls"] if code["calls"] else 0.0
    return {"overall": 0.8 * score + 0.1 * fmt + 0.1 * ran, "f1": score, "format": fmt, "ran": ran,
            "coded": float(any(name == "code" for name, _ in tool_calls)), "accuracy": float(score == 1.0)}
