"""rllava: RL for vision-language models. The Python API (imported on first use, so `python -m rllava.commands.plot` and
the config tools stay light):

    from rllava import RLVRPipeline, PPO, register_ppo, register_adv_estimator, register_policy_loss
"""

_EXPORTS = {"RLVRPipeline": "rllava.api", "PPO": "rllava.algorithms.ppo",
            "register_ppo": "rllava.algorithms.registry", "register_adv_estimator": "rllava.algorithms.registry",
            "register_policy_loss": "rllava.algorithms.registry"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rllava' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
