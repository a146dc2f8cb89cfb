"""Grounding reward, rllava's (RefCOCO-style referring expressions; prompt
examples/format_prompt/grounding_answer.jinja): IoU of the predicted box with the ground truth, in the frame the
model writes. RLLaVA's grounding reward (IoU squared, half of it for format) is grounding.py.

    response     [<think>...</think>] <answer>[x1, y1, x2, y2]</answer>   (also {"bbox_2d": [...]} or (x1,y1),(x2,y2))
    ground_truth [x1, y1, x2, y2] in pixels of the original image (RefCOCO's own coordinates; a JSON string works)

    format   = 1 if the response is exactly one answer (after an optional think) holding a box
    iou      = IoU(predicted box mapped to original-image pixels, ground truth)
    accuracy = 1 if iou >= 0.5 (the usual REC metric, Acc@0.5)
    overall  = format * iou, or 0 below `min_iou` (default 0: plain IoU; 0.5 credits only Acc@0.5 hits, so a
               policy that cannot yet localise gains nothing by hedging with one large central box)

The box is read in the frame the model writes (reward.reward_function_kwargs.frame, required):
`relative_1000` (Qwen2-VL, Qwen3-VL) or `absolute` pixels of the image the model saw after its processor's
resize (Qwen2.5-VL); a model type (`qwen2_vl`, `qwen2_5_vl`, `qwen3_vl`) names its frame. The sizes come from
the Reward role per sample: `image_sizes` (each image as stored) and `model_image_sizes` (as the processor
resized it, from its patch grid), so nothing here needs min/max pixels. IoU is the same in any frame that
scales x and y separately, so it is computed in original pixels.
"""

from typing import Any

from rllava.reward.boxes import answer_text, box_iou, frame_of, is_box, parse_box, strict_answer, to_image_pixels


def compute_score(reward_inputs: list[dict[str, Any]], frame=None, min_iou: float = 0.0) -> list[dict[str, float]]:
    """The batch form examples/config.yaml names (reward.reward_type=batch): one dict of scores per input."""
    return [score_one(r["response"], r["ground_truth"], r["image_sizes"], r["model_image_sizes"], frame=frame,
                      min_iou=min_iou) for r in reward_inputs]


def score_one(response, ground_truth, image_sizes=(), model_image_sizes=(), *, frame=None, min_iou=0.0) -> dict:
    frame = frame_of(frame)
    truth = _truth(ground_truth)
    answer = strict_answer(response)
    fmt = 1.0 if answer is not None and parse_box(answer) is not None else 0.0
    box = parse_box(answer if answer is not None else answer_text(response))
    pred = to_image_pixels(box, frame, _first(image_sizes), _first(model_image_sizes)) if box else None
    iou = box_iou(pred, truth) if pred is not None and truth is not None else 0.0
    return {"overall": fmt * iou if iou >= min_iou else 0.0, "format": fmt, "iou": iou, "accuracy": float(iou >= 0.5)}


def _truth(ground_truth):
    if isinstance(ground_truth, str):
        return parse_box(ground_truth)
    return tuple(float(v) for v in ground_truth) if is_box(ground_truth) else None


def _first(sizes):
    return sizes[0] if isinstance(sizes, (list, tuple)) and sizes else None
