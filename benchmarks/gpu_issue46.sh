#!/usr/bin/env bash
# Issue 46 in one device call (what ran on an H200 on 2026-11-28, docs/performance.md "second pass"): rllava24
# (capped at 24 GiB) beside rllava's research run; then TRL's side alone; then the compiled-decode research run if
# time is left. From the repo root, with .whl/ carried (benchmarks/gpu_check.sh's header lists the wheels):
#     bash benchmarks/gpu_issue46.sh          # ~560 s; the tables and logs go to $OUT
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
python3 -c "import torch, transformers, trl; print(torch.__version__, transformers.__version__, trl.__version__)" | tee -a $OUT/gpu.txt
python3 benchmarks/gpu_check.py --scenario rllava24 --steps 1 --keys data.train_batch_size=8 --run-timeout 330 \
    --root /tmp/g --out $OUT/rllava24.md > $OUT/rllava24.log 2>&1 &
A=$!
python3 benchmarks/gpu_check.py --scenario research --steps 2 --no-trl --run-timeout 250 --root /tmp/g2 \
    --out $OUT/research.md > $OUT/research.log 2>&1
echo "research rllava done at $(el) s"
wait $A; echo "rllava24 done at $(el) s"
mkdir -p /tmp/g2/runs/trl
timeout $(( 560 - $(el) )) python3 benchmarks/vs_trl.py --side trl --model /tmp/g2/models/qwen2.5-vl-3b \
    --data /tmp/g2/data-research --run /tmp/g2/runs/trl --steps 2 --device cuda --prompts 32 --k 8 \
    --new-tokens 512 --micro 16 > $OUT/trl.log 2>&1
echo "TRL rc $? at $(el) s"; cp /tmp/g2/runs/trl/steps.json $OUT/trl_steps.json 2>/dev/null; cat $OUT/trl_steps.json
left=$(( 570 - $(el) ))
if [ $left -gt 150 ]; then
  python3 benchmarks/gpu_check.py --scenario research --steps 2 --no-trl --run-timeout $left --root /tmp/g2 \
      --keys rollout.hf_decode=compiled --out $OUT/compiled.md > $OUT/compiled.log 2>&1
  echo "compiled done at $(el) s"
fi
cat $OUT/rllava24.md $OUT/research.md $OUT/compiled.md 2>/dev/null
