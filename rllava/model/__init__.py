"""Without CUDA, DeepSpeed is told the CPU (DS_ACCELERATOR) before accelerate imports it, which it does whenever
transformers saves a model: else every command that saves one warns that DeepSpeed guessed the CPU."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
