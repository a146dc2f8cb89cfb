#!/bin/bash
# Agent search (MAT-Search, Visual-ARFT): multi-turn GRPO where Qwen2.5-VL-3B searches a local corpus between turns
# (<search> query </search> -> <information> top-3 documents </information>) and answers in <answer> </answer>;
# reward = token F1 of the answer: rllava's reward and prompt (agent_search_f1.py, agent_search_tool.jinja), not
# RLLaVA's script of this name (single-step RFT on MAT's reasoning chains: agent_search.jinja, agent_search.py,
# reward.reward_type=sequential). The search tool reads a .jsonl of
# documents {"id", "text", "title"?, "image"?}: point CORPUS at one built for your data (MAT's questions were
# written for web search). Run from the repository root:
#   bash examples/tasks/agent_search/qwen2_5_vl_3b_agent_search_online.sh   (NPROC, MODEL_PATH, DATA, IMAGE_DIR,
#                                                                             CORPUS, OUTPUT_DIR override)
set -x
export PYTHONUNBUFFERED=1
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-VL-3B-Instruct}
DATA=${DATA:-data/MAT/MAT-Training/rft_agent_search_20.json}
IMAGE_DIR=${IMAGE_DIR:-data/MAT/MAT-Training/rft_agent_search_20_images}
CORPUS=${CORPUS:-data/MAT/corpus.jsonl}
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
  data.format_prompt=./examples/format_prompt/agent_search_tool.jinja \
  data.max_prompt_length=2048 \
  data.max_response_length=2048 \
  data.max_pixels=401408 \
  actor.model.model_path=${MODEL_PATH} \
  rollout.n=5 \
  rollout.max_turns=3 \
  rollout.agent.tools=[search] \
  rollout.agent.tool_kwargs.search.corpus=${CORPUS} \
  rollout.agent.tool_kwargs.search.top_k=3 \
  reward.reward_function=./examples/reward_function/agent_search_f1.py:compute_score \
  trainer.experiment_name=qwen2_5_vl_3b_agent_search_online \
  trainer.outputs_dir=${OUTPUT_DIR} \
  trainer.save_freq=50 \
  trainer.total_epochs=40 \
  trainer.val_before_train=false \
  "$@"
