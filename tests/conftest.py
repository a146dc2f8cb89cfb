"""Session fixtures: tiny models and synthetic data, built once per test run (offline, on CPU)."""

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A small (~1 M parameter) random Qwen2-VL checkpoint directory."""
    from rllava.model.tiny import build_tiny

    return build_tiny("qwen2_vl", str(tmp_path_factory.mktemp("models") / "qwen2_vl"), size="small")


@pytest.fixture(scope="session")
def counting_dir(tmp_path_factory):
    """A small synthetic CLEVR-like counting set: train.jsonl, val.jsonl, images/."""
    from rllava.data.synthetic import make_counting

    out = str(tmp_path_factory.mktemp("data") / "counting")
    make_counting(out, n_train=64, n_val=16, seed=0)
    return out
