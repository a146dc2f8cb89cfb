"""Open-vocabulary detection reward, rllava's (COCO / LVIS style; prompt examples/format_prompt/ovd_json.jinja): all
boxes of the asked category, with confidences. RLLaVA's OVD reward (Visual-RFT's Position / Confidence lists) is
ovd.py.

    response     [<think>...</think>] <answer>[{"bbox_2d": [x1, y1, x2, y2], "score": 0.93}, ...]</answer>
                 boxes in 0-1000 integers (the image as a 1000 x 1000 grid), score in [0, 1] with two decimals;
                 `[x1, y1, x2, y2, 0.93]` items are accepted too, `[]` means "none in the image"
    ground_truth the true boxes, a list of [x1, y1, x2, y2] in the same 0-1000 frame (a JSON string works)

    soft_f1   = 2 * sum(IoU of greedily matched pairs) / (#predicted + #true)     localisation + count
    ap50      = average precision at IoU 0.5, ranking by score                     the confidences matter
    precision = TP / #predicted,  recall = TP / #true   (TP: matched pairs with IoU >= 0.5)
    format    = 1 if the response is one well-formed answer and every item is valid
    overall   = (soft_f1 + ap50) / 2   if format,  else -malformed_penalty
    accuracy  = ap50
No true boxes and none predicted scores 1 everywhere.
"""

import json
from typing import Any

from rllava.reward.boxes import average_precision, greedy_match, is_box, parse_detections, strict_answer


def compute_score(reward_inputs: list[dict[str, Any]], iou_threshold: float = 0.5,
                  malformed_penalty: float = 0.5) -> list[dict[str, float]]:
    """The batch form examples/config.yaml names (reward.reward_type=batch): one dict of scores per input."""
    return [score_one(r["response"], r["ground_truth"], iou_threshold=iou_threshold,
                      malformed_penalty=malformed_penalty) for r in reward_inputs]


def score_one(response, ground_truth, *, iou_threshold=0.5, malformed_penalty=0.5) -> dict:
    truths = _truths(ground_truth)
    answer = strict_answer(response)
    detections, bad = parse_detections(answer) if answer is not None else ([], 1)
    boxes = [box for box, _ in detections]
    pairs = greedy_match(boxes, truths)
    tp = sum(iou >= iou_threshold for _, _, iou in pairs)
    total = len(boxes) + len(truths)
    soft_f1 = 2 * sum(iou for _, _, iou in pairs) / total if total else 1.0
    ap50 = average_precision(detections, truths, iou_threshold)
    fmt = float(bad == 0)
    return {"overall": (soft_f1 + ap50) / 2 if fmt else -malformed_penalty, "format": fmt,
            "soft_f1": soft_f1, "ap50": ap50, "accuracy": ap50,
            "precision": tp / len(boxes) if boxes else float(not truths),
            "recall": tp / len(truths) if truths else 1.0}


def _truths(ground_truth) -> list:
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError:
            return []
    if not isinstance(ground_truth, (list, tuple)):
        return []
    return [tuple(float(v) for v in box) for box in ground_truth if is_box(box)]
