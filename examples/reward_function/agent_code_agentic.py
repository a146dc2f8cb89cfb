"""Agent-code reward for multi-turn episodes, RLLaVA's (its examples/reward_function/agent_code_agentic.py, with
examples/format_prompt/agent_code.jinja in RLLaVA's qwen2_5_vl_3b_agent_code_agentic.sh): the answer of the last turn,
its format, and a bonus for a tool step whose result was shown. rllava's multi-turn code reward (F1 of the answer,
format and the share of code that ran) is agent_code_f1.py.

    overall = acc_weight * accuracy + format_weight * format + tool_weight * tool      (0.8, 0.2, 1.2)
with turn, format, accuracy, exact_match and tool as agent_search_agentic.py, but answers normalised for Chinese too:
Chinese punctuation (full-width forms, 、。：《》【】) removed as well, and a text with a CJK character (U+4E00 to
U+9FFF) loses its spaces and keeps its articles; when either answer has one, F1 counts characters, not words.

`step_reward` is what RLLaVA's environment steps returned, summed over the turns whose observation was shown (its
AgentCodeEnv: 1 for each <problem> tip and each snippet that ran); rllava's agent rollouts give the same field
(agent_search_agentic.py says how). The sequential form RLLaVA's script sets (reward.reward_type=sequential).
"""

import os
import re
import string
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_search_agentic import (answer_scores, final_format, gold_answer, last_answer, last_turn,  # noqa: E402
                                  tool_bonus)

CHINESE_PUNCTUATION = "！？｡＂＃＄％＆＇（）＊＋，－．／：；＜＝＞＠［＼］＾＿｀｛｜｝～、。：《》【】"
PUNCTUATION = set(string.punctuation + CHINESE_PUNCTUATION)


def compute_score(reward_input: dict[str, Any], acc_weight: float = 0.8, format_weight: float = 0.2,
                  tool_weight: float = 1.2) -> dict[str, float]:
    turn = last_turn(reward_input)
    fmt = final_format(turn)
    accuracy, exact = answer_scores(last_answer(turn), gold_answer(reward_input.get("ground_truth", "")),
                                    normalize, split)
    tool = tool_bonus(reward_input)
    return {"overall": acc_weight * accuracy + format_weight * fmt + tool_weight * tool, "accuracy": accuracy,
            "exact_match": exact, "format": fmt, "tool": tool}


def is_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    if is_chinese(text):
        return text.replace(" ", "")
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def split(prediction: str, gold: str) -> tuple[list[str], list[str]]:
    """Characters when either text is Chinese, else words."""
    if is_chinese(prediction) or is_chinese(gold):
        return list(prediction), list(gold)
    return prediction.split(), gold.split()
