"""Math reward with answer tags (GeoQA-8K, Geometry3K, MATH; prompt examples/format_prompt/math_answer.jinja): the
final answer checked by `math-verify` (LaTeX, fractions vs decimals, units, degrees, sets). RLLaVA's math reward
(<think> + \\boxed{}, mathruler's grader) is math.py.

    response     <think>...</think> <answer>...</answer>    or any text ending in \\boxed{...}
    ground_truth the answer as LaTeX or plain text ("\\frac{1}{2}", "12", "45^\\circ"), or inside <answer> tags

    format   = 1 if the response is exactly [<think>...</think>] <answer>...</answer>, or holds a \\boxed{}
    accuracy = 1 if math-verify finds the extracted answer equal to the ground truth
    overall  = (1 - format_weight) * accuracy + format_weight * format
The answer is the <answer> content if there is one, else the last \\boxed{...}. Answers longer than a few
thousand characters are not parsed (scored 0), so huge responses stay cheap.
"""

from typing import Any

from math_verify import parse, verify

from rllava.reward.boxes import MAX_ANSWER_CHARS, answer_text, strict_answer

MAX_MATH_CHARS = 1000  # math-verify's LaTeX parser is slow on long inputs; final answers are short


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} in `text` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None


def is_equivalent(answer: str, ground_truth) -> bool:
    """math-verify: the gold and the answer parsed as LaTeX (wrapped in $...$ when bare) and compared
    symbolically; False on anything it cannot parse."""
    if not answer or len(answer) > MAX_MATH_CHARS:
        return False
    truth = str(ground_truth)
    truth = answer_text(truth) or truth  # GeoQA-8K's `solution` is "<answer>...</answer>"
    try:
        gold = parse(_as_latex(truth))
        pred = parse(_as_latex(answer))
        return bool(gold) and bool(pred) and bool(verify(gold, pred))
    except Exception:  # math-verify's timeouts use signals, which fail outside the main thread
        return False


def _as_latex(text: str) -> str:
    text = text.strip()
    return text if "$" in text or "\\boxed" in text else f"${text}$"


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
    """The batch form examples/config.yaml names (reward.reward_type=batch): one dict of scores per input."""
    return [score_one(r["response"], r["ground_truth"], format_weight=format_weight) for r in reward_inputs]


def score_one(response, ground_truth, *, format_weight=0.1) -> dict:
    if not isinstance(response, str):
        response = ""
    strict = strict_answer(response)
    tail = response[-MAX_ANSWER_CHARS:]
    boxed = last_boxed(tail)
    fmt = 1.0 if strict is not None or boxed is not None else 0.0
    answer = strict if strict is not None else answer_text(tail) or boxed
    accuracy = 1.0 if answer is not None and is_equivalent(answer, ground_truth) else 0.0
    return {"overall": (1 - format_weight) * accuracy + format_weight * fmt, "format": fmt, "accuracy": accuracy}
