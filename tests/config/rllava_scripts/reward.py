"""A stand-in for RLLaVA's reward files (math.py is batch-style there, r1v.py is not in rllava): rewards what a
random tiny model's samples vary in, so the 2-step runs update the model. Its three forms:
RLLaVA's batch (a list of dicts), RLLaVA's sequential (one dict per call) and rllava's fn(response, ground_truth)."""


def _score(response, ground_truth):
    return {"overall": len(set(response)) / 20, "accuracy": float(response.strip() == str(ground_truth))}


def compute_score(reward_input):
    """batch: a list of dicts -> a list of scores; sequential: one dict -> one score."""
    if isinstance(reward_input, list):
        return [compute_score(r) for r in reward_input]
    return _score(reward_input["response"], reward_input["ground_truth"])


def compute_score_two_args(response, ground_truth):
    return _score(response, ground_truth)
