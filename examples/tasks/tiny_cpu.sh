#!/bin/bash
# One example task end to end on a CPU, in minutes (what each tasks/*/*_tiny_cpu.sh runs, and a row of
# `make proof`): a tiny random Qwen2-VL (rllava.model.tiny; ARCH=qwen3_vl for the localising tasks), a synthetic
# set in the real set's record shape (rllava.data.synthetic TASK), an SFT warm-up on its `solution` targets
# (FOLDER/tiny_cpu_sft.yaml), then GRPO with the task's reward (FOLDER/tiny_cpu.yaml). TEACHER_STEPS set: the
# same tiny model warmed that many SFT steps is a teacher (algorithm.distill.teacher_path; opd_tiny_cpu.sh). From the
# repository root:
#   bash examples/tasks/tiny_cpu.sh TASK FOLDER [key=value ...]
#   (OUT, ARCH, SFT_STEPS, RL_STEPS, TRAIN, VAL, TEACHER_STEPS, RL_NAME override)
set -ex
TASK=${1:?usage: tiny_cpu.sh TASK FOLDER [key=value ...]}
FOLDER=${2:?usage: tiny_cpu.sh TASK FOLDER [key=value ...]}
shift 2
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-outputs/tiny_cpu/${TASK}}
RUNS=(trainer.outputs_dir=$(dirname ${OUT}) trainer.project_name=$(basename ${OUT}))  # runs in ${OUT}/<experiment_name>

python -m rllava.model.tiny --arch ${ARCH:-qwen2_vl} --size demo --out ${OUT}/model
python -m rllava.data.synthetic ${TASK} --out ${OUT}/data --train ${TRAIN:-4000} --val ${VAL:-200}

# tasks with a search corpus (agent_search): the search tool reads it, in the SFT replay and in RL
AGENT=()
[ -f ${OUT}/data/corpus.jsonl ] && AGENT=(rollout.agent.tool_kwargs.search.corpus=${OUT}/data/corpus.jsonl)

warm_up() {  # SFT of the tiny model into ${OUT}/$1 (extra keys after it)
  python -m rllava.train.pipeline.sft \
    config=examples/tasks/${FOLDER}/tiny_cpu_sft.yaml \
    "${AGENT[@]}" \
    actor.model.model_path=${OUT}/model \
    data.train_files=${OUT}/data/train.jsonl \
    data.val_files=${OUT}/data/val.jsonl \
    "${RUNS[@]}" trainer.experiment_name=$1 "${@:2}"
}
warm_up sft ${SFT_STEPS:+trainer.max_steps=${SFT_STEPS}}

# on-policy distillation: a teacher warmed longer from the same random model (one tokenizer)
DISTILL=()
if [ -n "${TEACHER_STEPS}" ]; then
  warm_up teacher trainer.max_steps=${TEACHER_STEPS}
  DISTILL=(algorithm.distill.teacher_path=${OUT}/teacher/final)
fi

torchrun --standalone --nproc_per_node=1 -m rllava.train.pipeline.rlvr \
  config=examples/tasks/${FOLDER}/tiny_cpu.yaml \
  actor.model.model_path=${OUT}/sft/final \
  data.train_files=${OUT}/data/train.jsonl \
  data.val_files=${OUT}/data/val.jsonl \
  "${RUNS[@]}" trainer.experiment_name=${RL_NAME:-grpo} \
  ${RL_STEPS:+trainer.max_steps=${RL_STEPS}} \
  "${AGENT[@]}" "${DISTILL[@]}" \
  "$@"
