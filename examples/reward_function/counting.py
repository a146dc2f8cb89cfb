"""Counting reward: the response must be exactly `<answer>N</answer>` with the right integer N.

    overall  = format * accuracy   (strict: the measured recipe that learns on CPU; a loose reward let the
                                    model stop emitting EOS, see ../shared/reference/cpu_learning_notes.md)
    format   = 1 if the whole response is one <answer>integer</answer>
    accuracy = 1 if the first <answer> tag holds the ground-truth integer
"""

import re

_STRICT = re.compile(r"\s*<answer>\s*(-?[0-9]{1,9})\s*</answer>\s*")
_FIRST = re.compile(r"<answer>\s*(-?[0-9]{1,9})\s*</answer>")


def compute_score(response: str, ground_truth) -> dict:
    try:
        truth = int(str(ground_truth).strip())
    except ValueError:
        truth = None
    fmt = 1.0 if _STRICT.fullmatch(response) else 0.0
    first = _FIRST.search(response)
    accuracy = 1.0 if first is not None and truth is not None and int(first.group(1)) == truth else 0.0
    return {"overall": fmt * accuracy, "format": fmt, "accuracy": accuracy}
