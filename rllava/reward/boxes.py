"""Pure helpers for rule rewards: answer extraction, boxes, IoU, coordinate frames and detection matching.

rllava's example rewards (`examples/reward_function/{counting,math_answer,grounding_iou,ovd_ap}.py`) are built from
these. Every function takes any input and never raises on model output: text that does not parse gives `None` or `[]`.

Boxes are `(x1, y1, x2, y2)`, top-left and bottom-right corners, x to the right and y down, in the frame a model writes:
- `relative_1000`: the image mapped onto a 1000 x 1000 grid, whatever its size (Qwen2-VL, Qwen3-VL);
- `absolute`: pixels of the image *as the model saw it*, i.e. after the processor's resize (Qwen2.5-VL: the
  image resized to multiples of 28 within min/max pixels by `smart_resize`, not the original image)."""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate

# The frame each model family writes boxes in (absolute since Qwen2.5-VL's technical report, arXiv:2502.13923)
MODEL_FRAMES = {"qwen2_vl": "relative_1000", "qwen2_5_vl": "absolute", "qwen3_vl": "relative_1000"}
FRAMES = ("relative_1000", "absolute")
MAX_ANSWER_CHARS = 10_000  # longer answer spans are not parsed (no model writes them; keeps the cost bounded)

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_ANSWER = re.compile(r"\s*(?:<think>(?:(?!<think>|</think>).)*</think>\s*)?<answer>((?:(?!<answer>|</answer>).)*)"
                           r"</answer>\s*", re.DOTALL)
_NUMBER = r"-?\d+(?:\.\d+)?"
_BOX = re.compile(rf"\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]"
                  rf"|\(\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\)\s*,?\s*\(\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\)")


def answer_text(response: str) -> str | None:
    """The text inside the first `<answer>...</answer>`, or None."""
    match = _ANSWER.search(response) if isinstance(response, str) else None
    return match.group(1) if match else None


def strict_answer(response: str) -> str | None:
    """The answer of a response that is exactly `[<think>...</think>] <answer>...</answer>` (whitespace around
    allowed, one answer, nothing else), else None: the format part of the rewards."""
    match = _THINK_ANSWER.fullmatch(response) if isinstance(response, str) else None
    return match.group(1) if match else None


def parse_box(text) -> tuple[float, float, float, float] | None:
    """The first box in `text`: `[x1, y1, x2, y2]` (JSON, e.g. Qwen2.5-VL's `{"bbox_2d": [...]}`) or `(x1,y1),(x2,y2)`
    (Qwen2-VL's `<|box_start|>` form). None if there is none or it is not a finite box with x1 < x2 and y1 < y2."""
    match = _BOX.search(text) if isinstance(text, str) and len(text) <= MAX_ANSWER_CHARS else None
    box = tuple(float(v) for v in match.groups() if v is not None) if match else None
    return box if is_box(box) else None


def is_box(box) -> bool:
    """Four finite numbers with x1 < x2 and y1 < y2."""
    try:
        x1, y1, x2, y2 = (float(v) for v in box)
    except (TypeError, ValueError):
        return False
    return all(math.isfinite(v) for v in (x1, y1, x2, y2)) and x1 < x2 and y1 < y2


def box_iou(a, b) -> float:
    """Intersection over union of two boxes: |a ∩ b| / (|a| + |b| - |a ∩ b|); 0 when either is not a box."""
    if not (is_box(a) and is_box(b)):
        return 0.0
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0.0) * max(h, 0.0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def frame_of(frame: str | None) -> str:
    """A frame name, or a model type (`qwen2_vl`, `qwen2_5_vl`, `qwen3_vl`) standing for its frame.
    A config error (not model output), so it raises: a wrong frame silently gives wrong IoUs."""
    resolved = MODEL_FRAMES.get(frame, frame)
    if resolved not in FRAMES:
        raise ValueError(f"reward.reward_function_kwargs.frame={frame!r}: choose one of {', '.join(FRAMES)} or a "
                         f"model type ({', '.join(MODEL_FRAMES)}), the frame the model writes boxes in")
    return resolved


def to_image_pixels(box, frame: str, image_size, model_image_size=None) -> tuple[float, ...] | None:
    """A box in the model's frame -> pixels of the original image of size (W, H); None if a size is missing or <= 0:

        relative_1000:  x * W / 1000,  y * H / 1000
        absolute:       x * W / w',    y * H / h'     (w', h') = `model_image_size`, the size the model saw"""
    try:
        W, H = (float(v) for v in image_size)
        w, h = (1000.0, 1000.0) if frame == "relative_1000" else (float(v) for v in model_image_size)
    except (TypeError, ValueError):
        return None
    bad = min(W, H, w, h) <= 0 or not is_box(box)
    return None if bad else (box[0] * W / w, box[1] * H / h, box[2] * W / w, box[3] * H / h)


def parse_detections(text) -> tuple[list[tuple[tuple[float, ...], float]], int]:
    """OVD answers: a JSON list whose items are `{"bbox_2d": [x1, y1, x2, y2], "score": c}` (also `"bbox"` /
    `"confidence"`) or `[x1, y1, x2, y2, c]`, boxes in 0-1000 integers, c in [0, 1] with at most two decimals. Returns
    (valid (box, c) pairs, number of malformed items); a text that is not a JSON list is one malformed item."""
    try:
        items = json.loads(text) if isinstance(text, str) and len(text) <= MAX_ANSWER_CHARS else None
    except (ValueError, RecursionError):
        items = None
    if not isinstance(items, list):
        return [], 1
    pairs = [_detection(item) for item in items]
    valid = [pair for pair in pairs if pair is not None]
    return valid, len(pairs) - len(valid)


def _detection(item) -> tuple[tuple[float, ...], float] | None:
    if isinstance(item, dict):
        box, conf = item.get("bbox_2d", item.get("bbox")), item.get("score", item.get("confidence"))
    elif isinstance(item, list) and len(item) == 5:
        box, conf = item[:4], item[4]
    else:
        return None
    if (not isinstance(box, list) or len(box) != 4 or not all(type(v) is int and 0 <= v <= 1000 for v in box)
            or type(conf) not in (int, float) or not 0 <= conf <= 1 or round(conf, 2) != conf or not is_box(box)):
        return None
    return tuple(float(v) for v in box), float(conf)


def greedy_match(preds, truths) -> list[tuple[int, int, float]]:
    """One-to-one pairs (pred index, truth index, IoU) taken greedily by IoU, highest first, IoU > 0 only."""
    pairs = sorted(((box_iou(p, t), i, j) for i, p in enumerate(preds) for j, t in enumerate(truths)), reverse=True)
    used_p, used_t, out = set(), set(), []
    for iou, i, j in pairs:
        if iou > 0 and i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
            out.append((i, j, iou))
    return out


def average_precision(detections, truths, iou_threshold: float = 0.5) -> float:
    """AP at one IoU threshold (VOC all-point): detections in descending confidence each take the unmatched
    truth they overlap most if IoU >= threshold (a true positive), else count as a false positive; AP is the
    area under the precision-recall curve with precision made monotone. No truths: 1 if no detections, else 0."""
    if not truths:
        return 0.0 if detections else 1.0
    used, hits = set(), []
    for box, _ in sorted(detections, key=lambda d: -d[1]):
        best = max(((box_iou(box, t), j) for j, t in enumerate(truths) if j not in used), default=(0.0, -1))
        hit = best[0] >= iou_threshold
        if hit:
            used.add(best[1])
        hits.append(hit)
    tp = list(accumulate(map(int, hits)))  # true positives among the first k detections
    precisions, recalls = [n / k for k, n in enumerate(tp, 1)], [n / len(truths) for n in tp]
    ap, prev_recall = 0.0, 0.0
    for k in range(len(hits)):
        if hits[k]:  # recall steps up here; precision envelope = best precision at this recall or beyond
            ap += (recalls[k] - prev_recall) * max(precisions[k:])
            prev_recall = recalls[k]
    return ap
