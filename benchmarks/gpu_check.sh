#!/usr/bin/env bash
# The one-shot GPU check (issue 34) on a bare GPU machine: install what it lacks, then run benchmarks/gpu_check.py.
#
#     bash benchmarks/gpu_check.sh              # from the repo root; the table goes to $OUT/gpu_check.md
#
# The GPU machines have PyTorch, transformers, peft and accelerate but no internet. rllava also needs the rest of
# pyproject.toml's dependencies (transformers >= 5, tokenizers, omegaconf, datasets, jinja2, pillow, safetensors,
# tqdm, numpy, peft; tensorboard, matplotlib, av and math-verify are not used by this check). Whatever of those is
# missing there is installed from ./wheels/ (pip install --no-index --find-links wheels), which you fill on the
# machine with internet, for the GPU image's Python (this script prints it, and what is missing, in seconds when a
# wheel is absent: run it once with an empty wheels/ to find out, for little device time):
#
#     pip download --only-binary=:all: --no-deps -d wheels --python-version 3.X --platform manylinux2014_x86_64 \
#         omegaconf antlr4-python3-runtime PyYAML                 # + what the first try reported missing, e.g.
#         # datasets pyarrow dill multiprocess xxhash fsspec pandas (transformers 4.x there: transformers
#         # huggingface_hub tokenizers safetensors)
#
# Only the missing ones are installed (pip resolves against what is there first). wheels/ is git-ignored: name it
# in the device tool's `carry` (keep it under 64 MiB, never commit it; pyarrow alone is ~40 MiB).
#
# What ran on 2026-11-27 (H200 image: Python 3.12, torch 2.11, transformers 5.17, no omegaconf / datasets): wheels/
# held omegaconf 2.4.0, antlr4-python3-runtime 4.13.2, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19, plus
# transformers 5.24.0 and regex 2026.11.19 (the versions CI tests; 15 MiB in all), installed without their
# dependency checks before this script so that the image's pyarrow and fsspec serve:
#
#     python3 -m pip install -q --no-index --no-deps --target /tmp/site wheels/*.whl && export PYTHONPATH=/tmp/site
#     PYTHON=python3 bash benchmarks/gpu_check.sh --run-timeout 150     # ~6.5 min on one H200
#
# Issue 46's scenarios (benchmarks/gpu_check.py --scenario rllava24 | research) ran 2026-11-27 on an H100 with
# .whl/ holding omegaconf 2.4.0, datasets 5.2.0, dill 0.4.1, multiprocess 0.70.19, transformers 5.24.0, tokenizers
# 0.23.3, regex 2026.11.19, mathruler 0.1.0, pylatexenc 2.11 and trl 1.16.0 (20 MiB; RLLaVA's math reward needs
# mathruler, the TRL side trl), each call starting with
#
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#         .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
#     python3 benchmarks/gpu_check.py --scenario rllava24 --steps 1 --keys data.train_batch_size=8 \
#         --run-timeout 290 --root /tmp/g --out $OUT/rllava24.md          # ~150 s to the ref pass, + the update
#     python3 benchmarks/gpu_check.py --scenario research --steps 2 --run-timeout 285 --root /tmp/g2 \
#         --out $OUT/research.md                                            # rllava ~190 s, then TRL's side
#
# 2026-11-28 (H200): benchmarks/gpu_issue46.sh ran the three in one call (docs/performance.md, "second pass").
# Next GPU: rllava24's step time alone, and TRL's side with two steps alone (see there).
# Issue 56 (actor.strategy=accelerate, Accelerate's FSDP2 plugin, never run on a GPU yet), ~3 min:
#     bash benchmarks/gpu_check.sh --models qwen2.5-vl-3b --engines fsdp2 accelerate
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-.}

check='import transformers, sys
assert int(transformers.__version__.split(".")[0]) >= 5, f"transformers {transformers.__version__} < 5"
import rllava.train.pipeline.rlvr, rllava.train.memory.planner'
if ! (cd /tmp && $PY -c "import rllava" 2>/dev/null); then  # not installed (gpu_check.py would manage without)
    $PY -m pip install -q --no-deps --no-build-isolation --no-index -e . \
        || echo "note: pip install -e . failed; gpu_check.py puts the repo on sys.path itself"
fi
if ! $PY -c "$check" 2>/dev/null; then
    missing=()
    for pair in transformers:transformers tokenizers:tokenizers omegaconf:omegaconf datasets:datasets \
                jinja2:jinja2 PIL:pillow safetensors:safetensors tqdm:tqdm numpy:numpy peft:peft; do
        $PY -c "import ${pair%%:*}" 2>/dev/null || missing+=("${pair##*:}")
    done
    if $PY -c "import transformers" 2>/dev/null && \
        ! $PY -c "import transformers; assert int(transformers.__version__.split('.')[0]) >= 5"; then
        missing+=("transformers>=5,<6")  # 4.x there: bring transformers, huggingface_hub, tokenizers wheels
    fi
    echo "python $($PY -c 'import sys; print(sys.version.split()[0])');" \
         "missing: ${missing[*]:-none (see the error below)}"
    if [ ${#missing[@]} -gt 0 ]; then
        [ -d wheels ] || { echo "no wheels/ folder: fill it as the top of this script says"; exit 3; }
        $PY -m pip install --no-index --find-links wheels "${missing[@]}"
    fi
    $PY -c "$check"  # still failing: its error ends the script here
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
mkdir -p "$OUT"
timeout 540 $PY benchmarks/gpu_check.py --out "$OUT/gpu_check.md" --root "${ROOT:-/tmp/rllava-gpu-check}" "$@"
