"""rllava/reward/boxes.py: hand-computed IoU, frames, parsing, matching and AP."""

import pytest

from rllava.reward.boxes import (answer_text, average_precision, box_iou, frame_of, greedy_match, parse_box,
                                 parse_detections, strict_answer, to_image_pixels)


def test_iou_hand_computed():
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 10)) == 1.0
    assert box_iou((0, 0, 10, 10), (5, 5, 15, 15)) == pytest.approx(25 / 175)  # inter 5x5, union 100+100-25
    assert box_iou((0, 0, 10, 10), (0, 0, 10, 5)) == pytest.approx(0.5)  # nested: 50 / 100
    assert box_iou((0, 0, 4, 2), (2, 0, 6, 2)) == pytest.approx(4 / 12)  # inter 2x2, union 8+8-4
    assert box_iou((0, 0, 10, 10), (10, 0, 20, 10)) == 0.0  # touching edges
    assert box_iou((0, 0, 10, 10), (20, 20, 30, 30)) == 0.0
    assert box_iou((10, 10, 0, 0), (0, 0, 10, 10)) == 0.0  # not a box (x1 > x2)
    assert box_iou(None, (0, 0, 1, 1)) == 0.0 and box_iou((0, 0, float("nan"), 1), (0, 0, 1, 1)) == 0.0


def test_parse_box_forms():
    assert parse_box("[10, 20, 30, 40]") == (10, 20, 30, 40)
    assert parse_box('{"bbox_2d": [10.5, 20, 30, 40], "label": "cat"}') == (10.5, 20, 30, 40)
    assert parse_box("<|box_start|>(120,230),(560,780)<|box_end|>") == (120, 230, 560, 780)
    assert parse_box("[30, 20, 10, 40]") is None  # x1 > x2
    assert parse_box("[1, 2, 3]") is None and parse_box("") is None and parse_box(None) is None


def test_answer_extraction():
    assert answer_text("x <answer> 3 </answer> y <answer>4</answer>") == " 3 "
    assert strict_answer("<think>count</think> <answer>3</answer>\n") == "3"
    assert strict_answer("<answer>3</answer>") == "3"
    assert strict_answer("so <answer>3</answer>") is None  # text outside the tags
    assert strict_answer("<answer>3</answer><answer>4</answer>") is None  # two answers
    assert strict_answer("<think><think></think><answer>3</answer>") is None


def test_frames():
    assert frame_of("qwen2_vl") == frame_of("qwen3_vl") == "relative_1000"
    assert frame_of("qwen2_5_vl") == frame_of("absolute") == "absolute"
    with pytest.raises(ValueError, match="reward.reward_function_kwargs.frame=None: choose one of relative_1000"):
        frame_of(None)
    # relative: 0-1000 of a 200 x 100 image; absolute: pixels of the 644 x 476 image the model saw of a 1288 x 952
    assert to_image_pixels((250, 250, 750, 750), "relative_1000", (200, 100)) == (50, 25, 150, 75)
    assert to_image_pixels((64.4, 47.6, 322, 238), "absolute", (1288, 952), (644, 476)) == \
        pytest.approx((128.8, 95.2, 644, 476))
    assert to_image_pixels((1, 1, 2, 2), "absolute", (10, 10), None) is None  # size missing
    assert to_image_pixels((1, 1, 2, 2), "relative_1000", (0, 10)) is None


def test_parse_detections():
    valid, bad = parse_detections('[{"bbox_2d": [0, 0, 100, 100], "score": 0.9}, [10, 10, 20, 20, 0.55],'
                                  ' {"bbox": [5, 5, 6, 6], "confidence": 1}]')
    assert valid == [((0, 0, 100, 100), 0.9), ((10, 10, 20, 20), 0.55), ((5, 5, 6, 6), 1.0)] and bad == 0
    for item in ['[0, 0, 10, 10]', '{"bbox_2d": [0, 0, 1001, 10], "score": 0.5}',  # 4 numbers, > 1000
                 '{"bbox_2d": [0, 0, 10.5, 10], "score": 0.5}', '{"bbox_2d": [0, 0, 10, 10], "score": 0.555}',
                 '{"bbox_2d": [0, 0, 10, 10], "score": 1.5}', '{"bbox_2d": [10, 0, 0, 10], "score": 0.5}',
                 '{"bbox_2d": [0, 0, 10, 10], "score": true}']:
        assert parse_detections(f"[{item}]") == ([], 1), item
    assert parse_detections("[]") == ([], 0)
    assert parse_detections("{}") == ([], 1) and parse_detections("not json") == ([], 1)


def test_greedy_match_and_ap():
    truths = [(0, 0, 10, 10), (20, 20, 30, 30)]
    preds = [(0, 0, 10, 5), (0, 0, 10, 10), (20, 20, 30, 30)]
    assert greedy_match(preds, truths) == [(2, 1, 1.0), (1, 0, 1.0)]  # the exact box wins over the half box
    # Ranked by score: hit (P 1/1, R 1/2), miss, hit (P 2/3, R 2/2) -> AP = 0.5 * 1 + 0.5 * 2/3
    dets = [((0, 0, 10, 10), 0.9), ((50, 50, 60, 60), 0.8), ((20, 20, 30, 30), 0.7)]
    assert average_precision(dets, truths) == pytest.approx(0.5 + 1 / 3)
    # The same boxes with the false positive ranked last: AP 1
    dets[1] = ((50, 50, 60, 60), 0.1)
    assert average_precision(dets, truths) == pytest.approx(1.0)
    assert average_precision([], truths) == 0.0
    assert average_precision([], []) == 1.0 and average_precision(dets, []) == 0.0
    # a duplicate of a matched box is a false positive; ranked below the match, after full recall, it costs nothing
    assert average_precision([((0, 0, 10, 10), 0.9), ((0, 0, 10, 10), 0.8)], truths[:1]) == pytest.approx(1.0)
