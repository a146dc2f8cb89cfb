"""A stand-in for the RLLaVA reward file rllava does not ship yet (agent_search_agentic.py, the agentic MAT-Search
script's; its sequential form): rewards what a random tiny model's samples vary in. Every other RLLaVA script runs
with its own reward file (examples/reward_function/, under RLLaVA's names)."""


def compute_score(reward_input: dict):
    """sequential: one dict -> one score."""
    response, ground_truth = reward_input["response"], reward_input["ground_truth"]
    return {"overall": len(set(response)) / 20, "accuracy": float(response.strip() == str(ground_truth))}
