#!/bin/bash
# CHORD-phi (arXiv:2508.11408): constant mu = 0.1, each SFT token weighted by phi(p) = p (1 - p), so the
# demonstrations teach what the policy is unsure of without overwriting what RL found.
# = grpo.sh (Geometry3K on Qwen2.5-VL-3B) plus the keys below. Geometry3K has no worked solutions, so the expert
# response is the bare answer (data.expert_template); point data.target_key at a field holding expert solutions
# (RLLaVA's OpenR1 data, a stronger model's traces) for real demonstrations. From the repository root:
#   bash examples/algorithms/chord_phi.sh [key=value ...]
EXPERIMENT=${EXPERIMENT:-qwen2_5_vl_3b_geo3k_chord_phi} exec bash examples/algorithms/grpo.sh \
  data.expert_template='<answer>{{ answer }}</answer>' \
  actor.policy_loss.loss_mode=chord \
  algorithm.expert_data_ratio=0.2 \
  algorithm.mu_warmup_steps=0 \
  algorithm.mu_decay_steps=0 \
  algorithm.mu_peak=0.1 \
  algorithm.mu_valley=0.1 \
  algorithm.enable_phi_function=true \
  "$@"
