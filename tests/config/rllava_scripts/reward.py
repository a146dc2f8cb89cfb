"""A stand-in for RLLaVA's reward files (math.py is batch-style there, r1v.py is not in rllava): rewards what a
random tiny model's samples vary in, so the 2-step runs update the model. Its forms, as RLLaVA's files write
them: batch `compute_score_batch(reward_inputs: list[dict])`, sequential `compute_score(reward_input: dict)`, and
rllava's `compute_score_two_args(response, ground_truth)`."""


def _score(response, ground_truth):
    return {"overall": len(set(response)) / 20, "accuracy": float(response.strip() == str(ground_truth))}


def compute_score(reward_input: dict):
    """sequential: one dict -> one score."""
    return _score(reward_input["response"], reward_input["ground_truth"])


def compute_score_batch(reward_inputs: list):
    """batch: a list of dicts -> a list of scores."""
    return [compute_score(r) for r in reward_inputs]


def compute_score_two_args(response, ground_truth):
    return _score(response, ground_truth)
