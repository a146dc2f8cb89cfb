"""Open-vocabulary detection reward, RLLaVA's (its examples/reward_function/ovd.py, Visual-RFT's, with
examples/format_prompt/ovd.jinja and examples/config_grounding.yaml in RLLaVA's qwen2_5_vl_3b_ovd_online.sh).
rllava's OVD reward (soft F1 + AP50 over {"bbox_2d", "score"} items) is ovd_ap.py.

    response      <think>...</think> <answer>[{'Position': [x1, y1, x2, y2], 'Confidence': 0.9}, ...]</answer>
    ground_truth  the true boxes the same way, inside <answer> </answer> (the record's solution)

    format     = 1 if the response starts with <think>...</think>, then <answer>...</answer> after any whitespace
    detections = the first <answer>...</answer> on one line, when it names both Position and Confidence: "[[" and
                 "]]" made "[" and "]", newlines dropped, single quotes made double, a list cut short closed after
                 its last whole item, read as JSON (a list whose first item is an object); repeated positions
                 dropped. An item's position is its Position / position / bbox / Bbox ([x1, y1, x2, y2] or
                 [[x1, y1], [x2, y2]]), its confidence c its Confidence / confidence / score / Score / prob / Prob /
                 probability / Probability (else 0)
    matching     detections by confidence, highest first, each to the unmatched true box of highest IoU; a match
                 needs IoU > 0.5, else the detection's IoU counts 0
    iou        = min(1, sum of the matched IoUs / max(#true boxes, #detections))
    confidence = the mean over detections of c if matched else 1 - c, within [0, 1]
    overall    = weight * iou + weight * confidence + (1 - 2 * weight) * format      (weight 0.33)
iou and confidence are 0 without detections. The sequential form RLLaVA's script sets (reward.reward_type=sequential):
one reward input a call. Where RLLaVA's code raises on a malformed item (a position that is a number, nested lists
of other than two corners, a coordinate that is neither a number nor text), that item matches nothing here (IoU 0);
a ground truth that is not such a list raises, as there.
"""

import json
import re
from typing import Any

FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
ANSWER = re.compile(r"<answer>(.*?)</answer>")  # one line: no DOTALL, as RLLaVA's
POSITION_KEYS = ("Position", "position", "bbox", "Bbox")
CONFIDENCE_KEYS = ("Confidence", "confidence", "score", "Score", "prob", "Prob", "probability", "Probability")


def compute_score(reward_input: dict[str, Any], weight: float = 0.33) -> dict[str, float]:
    response = reward_input["response"]
    fmt = 1.0 if FORMAT.match(response) else 0.0
    iou, confidence = accuracy(response, reward_input["ground_truth"])
    return {"overall": weight * iou + weight * confidence + (1 - 2 * weight) * fmt, "format": fmt, "iou": iou,
            "confidence": confidence}


def accuracy(response: str, ground_truth) -> tuple[float, float]:
    """(iou, confidence) of the response's detections against the true boxes."""
    found = ANSWER.search(response)
    if not found or "Position" not in found.group(1) or "Confidence" not in found.group(1):
        return 0.0, 0.0
    text = found.group(1).replace("[[", "[").replace("]]", "]").replace("\n", "")
    detections = read_list(f"<answer>{text}</answer>")
    if not detections or not isinstance(detections[0], dict):
        return 0.0, 0.0
    truths = ground_truth if isinstance(ground_truth, list) else read_list(ground_truth)
    if truths is None:
        raise ValueError(f"ground truth {str(ground_truth)[:80]!r} is not a list of boxes in <answer> </answer>")
    results = match(truths, _unique(detections))
    iou = sum(i for i, _ in results) / max(len(truths), len(results))
    confidence = sum(c if i else 1 - c for i, c in results) / len(results)
    return min(iou, 1.0), min(max(confidence, 0.0), 1.0)


def read_list(text):
    """RLLaVA's extract_bbox: the JSON list between the first <answer> and </answer> (or the end), or None."""
    if not isinstance(text, str) or "<answer>" not in text:
        return None
    start = text.find("<answer>") + len("<answer>")
    end = text.find("</answer>")
    content = text[start:end if end >= 0 else len(text)]
    if not content.endswith("]"):  # cut short: keep the whole items
        content = content.rsplit("},", 1)[0] + "}]"
    try:
        return json.loads(content.replace("'", '"'))
    except json.JSONDecodeError:
        return None


def match(truths: list, detections: list, threshold: float = 0.5) -> list[tuple[float, float]]:
    """(IoU, confidence) per detection, highest confidence first: greedy matching to the unmatched true boxes."""
    taken, results = set(), []
    for det in sorted(detections, key=_confidence, reverse=True):
        best, best_i = 0.0, -1
        for i, truth in enumerate(truths):
            if i not in taken:
                iou = _iou(_position(truth), _position(det))
                if iou > best:
                    best, best_i = iou, i
        if best > threshold:
            taken.add(best_i)
            results.append((best, _confidence(det)))
        else:
            results.append((0, _confidence(det)))
    return results


def _position(item):
    if isinstance(item, dict):
        for key in POSITION_KEYS:
            if item.get(key) is not None:
                return item[key]
    return [0, 0, 0, 0]


def _confidence(item) -> float:
    for key in CONFIDENCE_KEYS if isinstance(item, dict) else ():
        if item.get(key) is not None:
            try:
                return float(item[key])
            except (TypeError, ValueError, OverflowError):
                pass
    return 0.0


def _corners(position):
    """[x1, y1, x2, y2] of [x1, y1, x2, y2] or [[x1, y1], [x2, y2]]; [0, 0, 0, 0] for any other length."""
    if isinstance(position, (list, tuple, str)) and len(position) == 2 and isinstance(position[0], (list, tuple)):
        try:
            return [position[0][0], position[0][1], position[1][0], position[1][1]]
        except (IndexError, KeyError, TypeError):
            return None
    if isinstance(position, (list, tuple, str)) and len(position) == 4:
        return list(position)
    return [0, 0, 0, 0] if isinstance(position, (list, tuple, str, dict)) else None


def _iou(a, b) -> float:
    a, b = _corners(a), _corners(b)
    if a is None or b is None or not all(isinstance(v, (int, float)) for v in a + b):
        return 0.0  # RLLaVA's: 0 for a coordinate that is text (it raises on other types)
    x1, y1 = max(a[0], b[0]), max(a[1], b[1])
    x2, y2 = min(a[2], b[2]), min(a[3], b[3])
    if x2 <= x1 or y2 <= y1:
        return 0.0
    inter = (x2 - x1) * (y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def _unique(detections: list) -> list:
    """Detections whose position was seen before dropped (the first kept): RLLaVA's key, tuple(position)."""
    seen, out = set(), []
    for det in detections:
        position = _position(det)
        key = tuple(_frozen(v) for v in position) if isinstance(position, (list, str, dict)) else position
        if key not in seen:
            seen.add(key)
            out.append(det)
    return out


def _frozen(value):
    """A nested list or object as tuples (RLLaVA's key raises on those: unhashable)."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return tuple((k, _frozen(v)) for k, v in value.items()) if isinstance(value, dict) else value
