"""A template reward: copy this file next to prompt.jinja and config.yaml, then change the parsing and scoring.

The config names it as `reward.reward_function=./examples/custom/reward.py:compute_score`. rllava calls
`compute_score(response, ground_truth)` once per sampled response:

    response      the model's text (special tokens removed: reward.skip_special_tokens)
    ground_truth  the record's answer field (data.answer_key) as the data file holds it: a string, a number, a list

and reads back a float, or a dict of floats: `overall` is the score the advantage is computed from, every other
entry is a named part, logged per step as `reward/<part>_mean` (metrics.jsonl) and per validation as
`val/<part>` (an `accuracy` part becomes `val/accuracy` and `reward/accuracy_mean`; without one, `overall` is
counted as the accuracy). Validation generations (val_generations.jsonl) carry every part.

A reward must be total: whatever the model writes (nothing, garbage, an unclosed tag), return numbers. A reward
that raises stops the run with one line naming the function and the sample (reward.on_error=zero scores it 0
instead and counts it in reward/errors).
"""

import re

# The answer format prompt.jinja asks for. Change the two together: the prompt says what to write, this finds it.
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def parse_answer(response: str):
    """The text inside the first <answer>...</answer>, stripped; None when the response has no such tag."""
    match = ANSWER.search(response)
    return match.group(1).strip() if match else None


def compute_score(response: str, ground_truth) -> dict:
    answer = parse_answer(response)
    fmt = 1.0 if answer is not None else 0.0  # the model followed the format
    accuracy = 1.0 if answer is not None and answer == str(ground_truth).strip() else 0.0
    # A little credit for the format makes a random model's first steps carry signal; the rest is the answer.
    return {"overall": 0.1 * fmt + 0.9 * accuracy, "format": fmt, "accuracy": accuracy}
