"""Agent-search reward for multi-turn episodes, RLLaVA's (its examples/reward_function/agent_search_agentic.py, with
examples/format_prompt/agent_search.jinja in RLLaVA's qwen2_5_vl_3b_agent_search_agentic.sh): the answer of the last
turn, its format, and a bonus for a search whose result was shown. rllava's multi-turn search reward (F1 of the answer,
with retrieval logged) is agent_search_f1.py.

    turn       = the episode's last model turn (the reward input's `turn_texts`[-1]; RLLaVA's workflow folds the
                 earlier turns into the prompt, so its `response` is that turn), else the response
    format     = 0 with two <answer> or <think> tags in the turn; else 1 if it holds <think>...</think> and then
                 (after whitespace) <answer>...</answer>
    accuracy   = 1 if the turn's last <answer> and the gold answer (the text inside the gold's first <answer>, else
                 all of it) are equal once normalised, else their token F1; 0 when either is empty
    tool       = 1 if the episode's `step_reward` >= 1, else 0
    overall    = acc_weight * accuracy + format_weight * format + tool_weight * tool      (0.8, 0.2, 1.2)
Logged beside them: `exact_match` (the normalised equality). Normalised: lower case, no punctuation, no articles
a/an/the, single spaces; F1 over the distinct common tokens (RLLaVA's, as agent_search.py).

`step_reward` is what RLLaVA's environment steps returned, summed over the turns whose observation was shown (its
AgentSearchEnv: 1 for each search with a query). rllava's agent rollouts give the same field
(rllava/reward/function.py): an environment class's own step rewards (rollout.env_config_path), and for rllava's
tools (rollout.agent.tools, e.g. the `search` tool standing in for RLLaVA's web search) 1 for each call that ran
without an error. The sequential form RLLaVA's script sets (reward.reward_type=sequential): one reward input a call.
"""

import os
import re
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agent_search import normalize  # noqa: E402  (RLLaVA's normalisation)

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
FINAL = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)


def compute_score(reward_input: dict[str, Any], acc_weight: float = 0.8, format_weight: float = 0.2,
                  tool_weight: float = 1.2) -> dict[str, float]:
    turn = last_turn(reward_input)
    fmt = final_format(turn)
    accuracy, exact = answer_scores(last_answer(turn), gold_answer(reward_input.get("ground_truth", "")), normalize)
    tool = tool_bonus(reward_input)
    return {"overall": acc_weight * accuracy + format_weight * fmt + tool_weight * tool, "accuracy": accuracy,
            "exact_match": exact, "format": fmt, "tool": tool}


def last_turn(reward_input: dict[str, Any]) -> str:
    """The last model turn: what RLLaVA's multi-turn workflow scores as the response."""
    turns = reward_input.get("turn_texts")
    return (turns[-1] if turns else reward_input.get("response")) or ""


def final_format(turn: str) -> float:
    if not turn or turn.count("<answer>") >= 2 or turn.count("<think>") >= 2:
        return 0.0
    return 1.0 if FINAL.search(turn) else 0.0


def last_answer(turn: str) -> str:
    answers = ANSWER.findall(turn)
    return answers[-1].strip() if answers else ""


def gold_answer(ground_truth) -> str:
    """The gold answer: a dict's `ground_truth` (else `answer`, else its text), inside its first <answer> if any."""
    if isinstance(ground_truth, dict):
        ground_truth = ground_truth.get("ground_truth", ground_truth.get("answer", str(ground_truth)))
    if not isinstance(ground_truth, str):
        return ""
    found = ANSWER.search(ground_truth)
    return found.group(1).strip() if found else ground_truth.strip()


def answer_scores(prediction: str, gold: str, normalize, split=lambda a, b: (a.split(), b.split())):
    """(F1, exact match) of two answers: normalised, then split into tokens (`split` of both texts); F1 over the
    distinct common tokens, 1 on an exact match, 0 when either answer is empty."""
    if not prediction or not gold:
        return 0.0, 0.0
    pred, truth = normalize(prediction), normalize(gold)
    if pred == truth:
        return 1.0, 1.0
    pred_tokens, gold_tokens = split(pred, truth)
    common = len(set(pred_tokens) & set(gold_tokens))
    if not pred_tokens or not gold_tokens or not common:
        return 0.0, 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), 0.0


def tool_bonus(reward_input: dict[str, Any]) -> float:
    """1 if the episode's step rewards (`step_reward`) add up to at least 1."""
    try:
        step_reward = float(reward_input.get("step_reward", 0.0))
    except (TypeError, ValueError, OverflowError):
        return 0.0
    return 1.0 if step_reward >= 1.0 else 0.0
