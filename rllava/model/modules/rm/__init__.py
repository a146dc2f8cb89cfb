"""RLLaVA's rule-reward helpers, at the import path its `examples/reward_function/*.py` use."""
