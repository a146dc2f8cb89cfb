#!/bin/bash
# Agent code (MAT-Coding): multi-turn GRPO where Qwen2.5-VL-3B writes Python that manipulates the image (rotate,
# crop, enhance, flip) between turns: <code> ... </code> runs in the sandbox (rllava.agent.sandbox: no network,
# its own directory, CPU / memory / time limits), what it prints and the images it saves come back, and the model
# answers in <answer> </answer>; reward = token F1 of the answer + format + code that ran: rllava's reward and
# prompt (agent_code_f1.py, agent_code_tool.jinja), not RLLaVA's script of this name (single-step RFT on MAT's
# reasoning chains: agent_code.jinja, agent_code.py, reward.reward_type=sequential). Run from the repository root:
#   bash examples/tasks/agent_code/qwen2_5_vl_3b_agent_code_online.sh   (NPROC, MODEL_PATH, DATA, IMAGE_DIR,
#                                                                         OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
DATA=${DATA:-data/MAT/MAT-Training/rft_agent_code_1k.json}
IMAGE_DIR=${IMAGE_DIR:-data/MAT/MAT-Training/rft_agent_code_1k_images}
OUTPUT_DIR=${OUTPUT_DIR:-outputs}  # the run writes ${OUTPUT_DIR}/<project_name>/<experiment_name>
export TENSORBOARD_DIR=${OUTPUT_DIR}

torchrun --nproc_per_node=${NPROC:-1} -m rllava.train.pipeline.rlvr \
  config=examples/config.yaml \
  data.train_files=${DATA}@train \
  data.val_files=${DATA}@train \
  data.image_key=image_path \
  data.answer_key=solution \
  data.train_image_dir=${IMAGE_DIR} \
  data.val_image_dir=${IMAGE_DIR} \
  data.format_prompt=./examples/format_prompt/agent_code_tool.jinja \
  data.max_prompt_length=2048 \
  data.max_response_length=2048 \
  data.max_pixels=401408 \
  actor.model.model_path=${MODEL_PATH} \
  rollout.n=5 \
  rollout.max_turns=3 \
  rollout.agent.tools=[code] \
  rollout.agent.tool_kwargs.code.wall_s=20 \
  rollout.agent.invalid_call_penalty=-0.05 \
  reward.reward_function=./examples/reward_function/agent_code_f1.py:compute_score \
  trainer.experiment_name=qwen2_5_vl_3b_agent_code_online \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.save_freq=50 \
  trainer.total_epochs=40 \
  trainer.val_before_train=false \
  "$@"
