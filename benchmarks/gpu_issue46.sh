#!/usr/bin/env bash
# Issue 46 in one device call (third pass; the second, 2026-11-28, ran rllava24 beside rllava's research run, then
# TRL alone: docs/performance.md). Here rllava24 (capped at 24 GiB) runs with the planner's two misses traced
# (--trace: what was live at the old log-prob's and the update's peaks, by allocation site) beside TRL's research
# side for two steps (its warm step beside rllava24, as rllava's research step was). From the repo root, with .whl/
# carried (benchmarks/gpu_check.sh's header lists the wheels):
#     bash benchmarks/gpu_issue46.sh          # ~560 s; the tables, traces and logs go to $OUT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers, trl; print(torch.__version__, transformers.__version__, trl.__version__)" | tee -a $OUT/gpu.txt
python3 benchmarks/gpu_check.py --scenario rllava24 --steps 1 --keys data.train_batch_size=8 --run-timeout 540 \
    --trace "old log-prob" update --root /tmp/g --out $OUT/rllava24.md > $OUT/rllava24.log 2>&1 &
A=$!
python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import gpu_check as g
g.ensure_model('qwen2.5-vl-3b', '/tmp/g2', 'cuda', False); g.make_data('/tmp/g2', 'research', False)" > $OUT/trl.log 2>&1
echo "3B built at $(el) s"; mkdir -p /tmp/g2/runs/trl
timeout $(( 555 - $(el) )) python3 benchmarks/vs_trl.py --side trl --model /tmp/g2/models/qwen2.5-vl-3b \
    --data /tmp/g2/data-research --run /tmp/g2/runs/trl --steps 2 --device cuda --prompts 32 --k 8 \
    --new-tokens 512 --micro 16 >> $OUT/trl.log 2>&1
echo "TRL rc $? at $(el) s"; cp /tmp/g2/runs/trl/steps.json $OUT/trl_steps.json 2>/dev/null; cat $OUT/trl_steps.json
wait $A; echo "rllava24 done at $(el) s"
cp /tmp/g/trace.txt /tmp/g/rllava24-qwen3-vl-4b-auto.json $OUT/ 2>/dev/null
cp /tmp/g/runs/*/metrics.jsonl $OUT/rllava24_metrics.jsonl 2>/dev/null
cat $OUT/rllava24.md $OUT/rllava24-qwen3-vl-4b-auto.json; head -c 6000 $OUT/trace.txt
