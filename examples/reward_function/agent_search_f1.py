"""Agent-search reward, rllava's, for multi-turn episodes with the `search` tool (MAT-Search / Visual-ARFT; prompt
examples/format_prompt/agent_search_tool.jinja): token-level F1 of the final answer, plus format. RLLaVA's rewards
are agent_search.py (one step of its RFT data) and agent_search_agentic.py (its multi-turn workflow).

    overall  = 0.9 * f1 + 0.1 * format  (+ query_weight * query, with reward.reward_function_kwargs.query_weight)
    f1       = SQuAD's token F1 of the last <answer>...</answer> against the ground truth (lower-cased, punctuation
               and the articles a/an/the removed, whitespace collapsed)
    format   = 1 if the last turn is one <answer>...</answer> (after an optional <think>...</think>)
Logged beside them (not in `overall`): `searched` (the episode called search), `found` (a search returned the
record's `doc_id`, the document holding the answer) and `used` (found, and the answer is right: the agent read
the result). `query` (Visual-ARFT's search reward, when `query_weight` > 0): all-MiniLM-L6-v2 cosine similarity of
the first search query to the record's gold `query`, 0 below 0.5.
"""

import re
import string
from collections import Counter
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_FINAL = re.compile(r"\s*(?:<think>.*?</think>\s*)?<answer>[^<]*</answer>\s*", re.DOTALL)


def normalize(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in str(text).lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1(prediction: str, truth: str) -> float:
    """Token-level F1 of two normalised strings (SQuAD): 2 P R / (P + R) over the multiset of common tokens."""
    pred, gold = normalize(prediction).split(), normalize(truth).split()
    common = sum((Counter(pred) & Counter(gold)).values())
    if not pred or not gold or common == 0:
        return float(pred == gold)
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def compute_score(reward_inputs: list[dict[str, Any]], query_weight: float = 0.0) -> list[dict[str, float]]:
    """The batch form examples/config.yaml names (reward.reward_type=batch): one dict of scores per input."""
    return [score_one(r["response"], r["ground_truth"], r.get("doc_id"), r.get("query"), r.get("tool_calls", ()),
                      r.get("tool_memory"), query_weight) for r in reward_inputs]


def score_one(response: str, ground_truth, doc_id=None, query=None, tool_calls=(), tool_memory=None,
              query_weight: float = 0.0) -> dict:
    answers = _ANSWER.findall(response)
    score = f1(answers[-1], str(ground_truth)) if answers else 0.0
    last_turn = response.split("\n")[-1]
    fmt = 1.0 if _FINAL.fullmatch(last_turn) else 0.0
    retrieved = [i for ids in (tool_memory or {}).get("search", []) for i in ids]
    searched = float(any(name == "search" for name, _ in tool_calls))
    found = float(doc_id is not None and doc_id in retrieved)
    out = {"overall": 0.9 * score + 0.1 * fmt, "f1": score, "format": fmt, "accuracy": float(score == 1.0),
           "searched": searched, "found": found, "used": found * float(score == 1.0)}
    if query_weight:
        queries = [args for name, args in tool_calls if name == "search"]
        out["query"] = query_similarity(str(queries[0]), str(query)) if queries and query else 0.0
        out["overall"] += query_weight * out["query"]
    return out


def query_similarity(query: str, gold_query: str) -> float:
    """Visual-ARFT's search-query reward: cosine similarity of all-MiniLM-L6-v2 embeddings, 0 below 0.5."""
    from rllava.agent.search import embed

    a, b = embed([query, gold_query])
    sim = float(a @ b)
    return sim if sim >= 0.5 else 0.0
