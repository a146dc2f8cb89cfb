#!/usr/bin/env bash
# Issue 61 in one device call (~9 min on one H200, under the device tool's 600 s a command): RLLaVA's own 4B
# script (benchmarks/gpu_check.py --scenario rllava24: examples/config.yaml as the file is, random-init
# Qwen3-VL-4B, FSDP2 with CPU offload on one GPU, the card capped at 24 GiB with set_per_process_memory_fraction)
# at 8 prompts x 5, first with the planner's sizes (actor.ppo_micro_batch_size=auto, log_prob_micro_batch_size=auto,
# fsdp.keep_gathered_units=auto, fsdp.forward_prefetch=true) for 3 steps (the table's step time: the mean of steps
# 2-3), then RLLaVA's micro-batch of 1 for one step in the time left (issue 46 measured it at 385 s a step, traced;
# cut off, its row keeps the phases it reached). The auto run's first ~1-2 min are the random 4B's build and the
# planner's search (on the host's CPU, before the model loads: three phase plans). From the repo root, with .whl/
# carried (benchmarks/gpu_check.sh's header lists the wheels):
#     bash benchmarks/gpu_issue61.sh          # the tables go to $OUT (auto.md, rllava1.md) and to stdout
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
OUT=${OUT:-/tmp/gpu61}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
AUTO="actor.ppo_micro_batch_size=auto actor.log_prob_micro_batch_size=auto actor.fsdp.keep_gathered_units=auto \
actor.fsdp.forward_prefetch=true"
python3 benchmarks/gpu_check.py --scenario rllava24 --steps 3 --keys data.train_batch_size=8 $AUTO \
    --run-timeout 400 --root /tmp/g --out "$OUT/auto.md" > "$OUT/auto.log" 2>&1
echo "auto done at $(el) s"
cp /tmp/g/runs/rllava24-qwen3-vl-4b-auto/metrics.jsonl "$OUT/auto_metrics.jsonl" 2>/dev/null  # the next run's dir
python3 -c "from rllava.config import load_config
a = load_config(['config=/tmp/g/runs/rllava24-qwen3-vl-4b-auto/config.yaml']).actor
print('chosen: ppo_micro_batch_size', a.ppo_micro_batch_size, 'log_prob_micro_batch_size',
      a.log_prob_micro_batch_size, 'fsdp.keep_gathered_units', a.fsdp.keep_gathered_units)" | tee "$OUT/auto_sizes.txt"
LEFT=$(( 550 - $(el) ))
if [ $LEFT -gt 60 ]; then
    python3 benchmarks/gpu_check.py --scenario rllava24 --steps 1 --keys data.train_batch_size=8 \
        --run-timeout $LEFT --root /tmp/g --out "$OUT/rllava1.md" > "$OUT/rllava1.log" 2>&1
fi
echo "micro-batch 1 done at $(el) s"
cat "$OUT/auto.md" "$OUT/rllava1.md"; tail -3 "$OUT/auto.log" "$OUT/rllava1.log"
