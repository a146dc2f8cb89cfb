"""Models: loading, forward passes, tiny builds. Without CUDA, DeepSpeed is told the CPU (DS_ACCELERATOR=cpu) before
accelerate imports it, as it does whenever transformers saves a model: else every command warns that it guessed."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
