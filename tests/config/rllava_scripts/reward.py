"""A stand-in for a RLLaVA reward file rllava does not ship (its sequential form), swapped in by
tests/config/test_rllava_scripts.py only then: rewards what a random tiny model's samples vary in. Every RLLaVA
script there runs with its own reward file now (examples/reward_function/, under RLLaVA's names)."""


def compute_score(reward_input: dict):
    """sequential: one dict -> one score."""
    response, ground_truth = reward_input["response"], reward_input["ground_truth"]
    return {"overall": len(set(response)) / 20, "accuracy": float(response.strip() == str(ground_truth))}
