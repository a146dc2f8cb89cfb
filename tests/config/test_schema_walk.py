"""Every key of the schema, walked: setting it to a value other than its default either changes something a
test observes (COVERED names that test) or is refused or flagged at start-up (a ConfigError or a one-line
warning naming the key). A key added to the schema and not classified fails here.

COVERED maps a key to the test that checks its effect, as "path::test" (that test's source, decorators included,
names the full dotted key) or ("path::test", "word") where the test exercises the code the key feeds under
another name (e.g. a loss's keyword argument). critic.* keys share actor.*'s dataclasses; where the critic reads
one through the same function as the actor (apply_lora, freeze, _engine), the actor's test is named.
"""

import ast
import functools
import os
import typing
import warnings

import pytest

from rllava.config import ConfigError, load_config
from rllava.config.loader import LEAVES, _strip_optional
from rllava.config.schema import DERIVED_KEYS, CriticConfig, PPOConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OWNED_ELSEWHERE: set[str] = set()  # keys built on a branch not merged yet (none now)

COVERED = {
    "algorithm.distill.teacher_path": "tests/train/test_distill.py::test_a_teacher_that_is_the_student_sees_the_same_pixels",
    "algorithm.distill.loss": "tests/train/test_distill.py::test_a_teacher_that_is_the_student_sees_the_same_pixels",
    "algorithm.distill.use_reward": "tests/train/test_distill.py::test_a_teacher_that_is_the_student_sees_the_same_pixels",
    "algorithm.distill.coef": "tests/train/test_distill.py::test_coef_weights_the_teachers_term",
    "algorithm.distill.route_field": "tests/train/test_distill.py::test_the_builder_reads_routes_and_offload",
    "algorithm.distill.teachers": "tests/train/test_distill.py::test_the_builder_reads_routes_and_offload",
    "algorithm.distill.offload": "tests/train/test_distill.py::test_the_builder_reads_routes_and_offload",
    "algorithm.distill.engine": "tests/engine/test_rollout_engines.py::test_a_teacher_engine_is_built_from_the_distill_keys_and_scores_the_trained_tokens",
    "algorithm.distill.engine_kwargs": "tests/engine/test_rollout_engines.py::test_a_teacher_engine_is_built_from_the_distill_keys_and_scores_the_trained_tokens",
    "rollout.partial_rollout": "tests/train/test_async.py::test_partial_rollouts_resume_exactly",
    "rollout.hf_decode": "tests/engine/test_hf_static_cache.py::test_the_key_reaches_the_engine_and_compiled_needs_cuda",
    "actor.loss_terms": "tests/train/test_loss_terms.py::test_a_term_registered_outside_the_package_trains_with_the_rest",
    "rollout.agent.round_image_mb": "tests/agent/test_agent_pipeline.py::test_agent_keys_reach_the_driver",
    "trainer.max_staleness": "tests/train/test_async.py::test_resume_is_the_uninterrupted_run",
    "reward.num_cpus": ("tests/reward/test_function.py::test_worker_pool_scores_kills_hung_workers_and_replaces_dead_ones", "num_cpus"),
    "reward.timeout": "tests/reward/test_function.py::test_a_sleeping_reward_times_out_in_process",
    "reward.on_error": "tests/reward/test_scoring.py::test_error_policy_of_strict_fallback_and_on_error",
    "reward.strict": "tests/reward/test_scoring.py::test_timeout_names_the_function_and_the_sample",
    "reward.fallback_score": "tests/train/test_pipelines.py::test_weighted_rewards_log_each_source_and_survive_a_nan",
    "reward.reward_functions": "tests/train/test_pipelines.py::test_weighted_rewards_log_each_source_and_survive_a_nan",
    "trainer.memory_budget_gb": "tests/test_memory_auto.py::test_a_run_sizes_auto_before_its_first_step_and_says_so",
    "trainer.overwrite": "tests/train/test_runtime.py::test_outputs_dir_belongs_to_one_run",
    "data.train_files": "tests/data/test_records.py::test_empty_after_max_samples_and_empty_spec",
    "data.val_files": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "data.sampler": "tests/train/test_pipelines.py::test_difficulty_pools_observe_each_training_group_once_and_no_validation_one",
    "data.sampler_kwargs": "tests/train/test_checkpoint.py::test_difficulty_pools_resume_bitwise_and_another_sampler_is_one_line",
    "data.train_image_dir": ("tests/config/test_key_wiring.py::test_data_field_keys_and_image_dirs_reach_the_dataset", "data.train_image_dir"),
    "data.val_image_dir": "tests/config/test_key_wiring.py::test_data_field_keys_and_image_dirs_reach_the_dataset",
    "data.prompt_key": ("tests/data/test_dataset.py::test_bad_records_name_the_record", "prompt_key"),
    "data.answer_key": "tests/config/test_key_wiring.py::test_data_field_keys_and_image_dirs_reach_the_dataset",
    "data.image_key": "tests/config/test_key_wiring.py::test_data_field_keys_and_image_dirs_reach_the_dataset",
    "data.video_key": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "data.video_fps": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "data.video_max_frames": "tests/data/test_video.py::test_video_keys_are_checked",
    "data.video_min_pixels": "tests/data/test_video.py::test_video_keys_are_checked",
    "data.max_prompt_length": ("tests/config/test_key_wiring.py::test_lengths_batch_sizes_and_tokenizer_path", "data.max_prompt_length"),
    "data.max_response_length": ("tests/config/test_key_wiring.py::test_lengths_batch_sizes_and_tokenizer_path", "data.max_response_length"),
    "data.val_batch_size": "tests/test_examples.py::test_tiny_cpu_twin_runs",
    "data.format_prompt": ("tests/data/test_dataset.py::test_sample_messages_images_and_template", "format_prompt"),
    "data.override_chat_template": "tests/train/test_checkpoint.py::test_hf_export_every_save_and_after_the_fact",
    "data.shuffle": ("tests/data/test_sampler.py::test_each_epoch_is_a_permutation_and_reshuffles", "shuffle"),
    "data.seed": ("tests/data/test_sampler.py::test_each_epoch_is_a_permutation_and_reshuffles", "seed"),
    "data.min_pixels": "tests/data/test_video.py::test_video_keys_are_checked",
    "data.max_pixels": "tests/data/test_video.py::test_video_keys_are_checked",
    "data.filter_overlong_prompts": ("tests/config/test_key_wiring.py::test_lengths_batch_sizes_and_tokenizer_path", "data.filter_overlong_prompts"),
    "data.max_samples": "tests/data/test_records.py::test_empty_after_max_samples_and_empty_spec",
    "data.target_key": "tests/train/test_pipelines.py::test_sft_needs_target_key",
    "algorithm.gamma": ("tests/algorithms/test_advantage.py::test_gae_by_hand_and_padding_is_skipped", "gamma"),
    "algorithm.lam": "tests/train/test_pipelines.py::test_ppo_gae_with_critic_and_warmup",
    "algorithm.adv_estimator": "tests/algorithms/test_advantage.py::test_unknown_estimator_lists_choices",
    "algorithm.norm_adv_by_std_in_grpo": ("tests/algorithms/test_advantage.py::test_dr_grpo_drops_std", "norm_adv_by_std_in_grpo"),
    "algorithm.use_kl_loss": "tests/train/test_pipelines.py::test_lora_with_kl_to_the_adapter_free_base",
    "algorithm.kl_ctrl.kl_coef": "tests/config/test_key_wiring.py::test_kl_controller_and_rollout_is_keys",
    "algorithm.kl_ctrl.horizon": "tests/train/test_checkpoint.py::test_stop_and_resume_equals_straight_run_bitwise",
    "algorithm.kl_ctrl.target_kl": ("tests/algorithms/test_kl.py::test_adaptive_controller_shapes_rewards_then_moves_beta", "target_kl"),
    "algorithm.use_kl_in_reward": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "algorithm.ref_reset_freq": "tests/train/test_reference.py::test_reset_on_every_engine",
    "algorithm.online_filtering": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "algorithm.filter_key": "tests/algorithms/test_filtering.py::test_fill_batch_stops_at_max_tries",
    "algorithm.filter_low": ("tests/algorithms/test_filtering.py::test_informative_groups", "low="),
    "algorithm.filter_high": ("tests/algorithms/test_filtering.py::test_informative_groups", "high="),
    "algorithm.plugins": "tests/train/test_pipelines.py::test_register_ppo_class_plugin",
    "algorithm.rollout_is_cap": "tests/config/test_key_wiring.py::test_kl_controller_and_rollout_is_keys",
    "algorithm.rollout_rs": "tests/algorithms/test_rollout_correction.py::test_rollout_rs_keys_reach_the_actor_and_drop_tokens_from_the_rl_mask",
    "algorithm.rollout_rs_threshold": "tests/algorithms/test_rollout_correction.py::test_rollout_rs_keys_reach_the_actor_and_drop_tokens_from_the_rl_mask",
    "actor.policy_loss.behav_imp_weight_cap": ("tests/algorithms/test_rollout_correction.py::test_decoupled_ppo_by_hand", "behav_imp_weight_cap"),
    "actor.ppo_micro_batch_size": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "actor.log_prob_micro_batch_size": "tests/config/test_key_wiring.py::test_actor_and_ref_batch_sizes_and_trust_remote_code",
    "actor.ppo_max_token_len_per_gpu": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.log_prob_max_token_len_per_gpu": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.logprob_chunk_size": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.max_grad_norm": ("tests/config/test_key_wiring.py::test_optim_keys_reach_the_engine", "max_grad_norm"),
    "actor.skip_grad_norm": ("tests/engine/test_single.py::test_skip_grad_norm_skips_the_update_but_advances_the_schedule", "skip_grad_norm"),
    "actor.clip_ratio": "tests/config/test_startup_checks.py::test_clip_ratio_drives_the_sides_left_at_their_default",
    "actor.clip_ratio_low": "tests/config/test_startup_checks.py::test_clip_ratio_drives_the_sides_left_at_their_default",
    "actor.clip_ratio_high": "tests/config/test_startup_checks.py::test_clip_ratio_drives_the_sides_left_at_their_default",
    "actor.clip_ratio_c": ("tests/algorithms/test_losses.py::test_losses_take_their_hyperparameters_from_the_config_pool", "clip_ratio_c"),
    "actor.entropy_coeff": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.tis_imp_ratio_cap": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.ppo_epochs": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.model.model_path": "tests/test_examples.py::test_script_parses_with_the_real_loader",
    "actor.model.tokenizer_path": ("tests/config/test_key_wiring.py::test_lengths_batch_sizes_and_tokenizer_path", "actor.model.tokenizer_path"),
    "actor.model.attn_implementation": ("tests/model/test_video_inputs.py::test_rollout_and_padding_free_log_probs_with_images_and_videos", "attn_implementation"),
    "actor.model.override_config": "tests/config/test_config.py::test_dict_fields_accept_any_sub_keys",
    "actor.model.enable_gradient_checkpointing": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.model.trust_remote_code": "tests/config/test_key_wiring.py::test_actor_and_ref_batch_sizes_and_trust_remote_code",
    "actor.model.freeze_vision_tower": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "actor.model.freeze_connector": ("tests/model/test_modular.py::test_freeze_errors", "freeze_connector"),
    "actor.model.freeze_llm": ("tests/model/test_modular.py::test_freeze_errors", "freeze_llm"),
    "actor.model.padding_free": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "actor.model.shared_prefix": "tests/config/test_key_wiring.py::test_shared_prefix_reaches_actor_reference_and_critic",
    "critic.model.shared_prefix": "tests/config/test_key_wiring.py::test_shared_prefix_reaches_actor_reference_and_critic",
    "actor.model.dynamic_batching": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.model.use_peft": "tests/train/test_pipelines.py::test_lora_with_kl_to_the_adapter_free_base",
    "actor.model.lora_task_type": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "task_type"),
    "actor.model.lora_r": "tests/train/test_pipelines.py::test_lora_with_kl_to_the_adapter_free_base",
    "actor.model.lora_target_modules": ("tests/model/test_lora.py::test_bad_lora_settings_name_the_key", "lora_target_modules"),
    "actor.model.lora_alpha": "tests/train/test_pipelines.py::test_lora_with_kl_to_the_adapter_free_base",
    "actor.model.lora_dropout": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "lora_dropout"),
    "actor.model.lora_use_rslora": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "lora_use_rslora"),
    "actor.model.lora_weight_path": "tests/model/test_lora.py::test_save_merges_adapters_and_keeps_the_adapter",
    "actor.model.lora_bias": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "bias"),
    "actor.model.use_rslora": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "use_rslora"),
    "actor.model.lora_modules_to_save": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "modules_to_save"),
    "actor.optim.lr": "tests/train/test_pipelines.py::test_sft_learns_the_format",
    "actor.optim.weight_decay": ("tests/config/test_key_wiring.py::test_optim_keys_reach_the_engine", "weight_decay"),
    "actor.optim.lr_warmup_ratio": ("tests/config/test_key_wiring.py::test_optim_keys_reach_the_engine", "lr_warmup_ratio"),
    "actor.optim.lr_warmup_steps": ("tests/config/test_key_wiring.py::test_optim_keys_reach_the_engine", "lr_warmup_steps"),
    "actor.policy_loss.loss_mode": "tests/test_learning.py::test_policy_loss_learns",
    "actor.policy_loss.clip_cov_ratio": ("tests/algorithms/test_losses.py::test_losses_take_their_hyperparameters_from_the_config_pool", "clip_cov_ratio"),
    "actor.policy_loss.clip_cov_lb": ("tests/algorithms/test_losses.py::test_losses_take_their_hyperparameters_from_the_config_pool", "clip_cov_lb"),
    "actor.policy_loss.clip_cov_ub": ("tests/algorithms/test_losses.py::test_losses_take_their_hyperparameters_from_the_config_pool", "clip_cov_ub"),
    "actor.policy_loss.kl_cov_ratio": ("tests/algorithms/test_losses.py::test_losses_take_their_hyperparameters_from_the_config_pool", "kl_cov_ratio"),
    "actor.policy_loss.ppo_kl_coef": ("tests/algorithms/test_losses.py::test_losses_take_their_hyperparameters_from_the_config_pool", "ppo_kl_coef"),
    "actor.policy_loss.cispo_clip_ratio_low": ("tests/algorithms/test_losses.py::test_cispo_clips_the_weight_but_keeps_every_gradient", "cispo_clip_ratio_low"),
    "actor.policy_loss.cispo_clip_ratio_high": ("tests/algorithms/test_losses.py::test_cispo_clips_the_weight_but_keeps_every_gradient", "cispo_clip_ratio_high"),
    "actor.policy_loss.tau_pos": ("tests/algorithms/test_losses.py::test_sapo_soft_gate_by_hand", "tau_pos"),
    "actor.policy_loss.tau_neg": ("tests/algorithms/test_losses.py::test_sapo_soft_gate_by_hand", "tau_neg"),
    "actor.fsdp.forward_prefetch": "tests/test_memory_auto.py::test_prefetch_and_kept_units_reach_the_fsdp2_engines",
    "actor.fsdp.keep_gathered_units": "tests/test_memory_auto.py::test_prefetch_and_kept_units_reach_the_fsdp2_engines",
    "critic.fsdp.forward_prefetch": "tests/test_memory_auto.py::test_prefetch_and_kept_units_reach_the_fsdp2_engines",
    "critic.fsdp.keep_gathered_units": "tests/test_memory_auto.py::test_prefetch_and_kept_units_reach_the_fsdp2_engines",
    "actor.fsdp.enable_cpu_offload": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.fsdp.offload_params": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "actor.fsdp.offload_optimizer": "tests/train/test_pipelines.py::test_ppo_gae_with_critic_and_warmup",
    "actor.model.ulysses_size": "tests/engine/test_sharded_engines.py::test_ulysses_pipeline_takes_the_steps_of_sp1",
    "actor.kl_loss_coef": "tests/train/test_pipelines.py::test_lora_with_kl_to_the_adapter_free_base",
    "ref.model_path": ("tests/config/test_key_wiring.py::test_ref_model_path_and_trainer_seed", "ref.model_path"),
    "ref.log_prob_micro_batch_size": "tests/config/test_key_wiring.py::test_actor_and_ref_batch_sizes_and_trust_remote_code",
    "ref.log_prob_max_token_len_per_gpu": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "critic.ppo_mini_batch_size": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.ppo_mini_batch_size"),
    "critic.ppo_micro_batch_size": "tests/test_learning.py::test_ppo_with_gae_critic_learns",
    "critic.log_prob_micro_batch_size": "tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model",
    "critic.ppo_max_token_len_per_gpu": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.ppo_max_token_len_per_gpu"),
    "critic.forward_max_token_len_per_gpu": "tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model",
    "critic.max_grad_norm": "tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model",
    "critic.cliprange_value": "tests/config/test_config.py::test_critic_from_the_command_line",
    "critic.ppo_epochs": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.ppo_epochs"),
    "critic.model.model_path": "tests/test_learning.py::test_ppo_with_gae_critic_learns",
    "critic.model.attn_implementation": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.model.attn_implementation"),
    "critic.model.override_config": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.model.override_config"),
    "critic.model.enable_gradient_checkpointing": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.model.enable_gradient_checkpointing"),
    "critic.model.trust_remote_code": "tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model",
    "critic.model.freeze_vision_tower": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.model.freeze_vision_tower"),
    "critic.model.freeze_connector": ("tests/model/test_modular.py::test_freeze_errors", "freeze_connector"),
    "critic.model.freeze_llm": ("tests/model/test_modular.py::test_freeze_errors", "freeze_llm"),
    "critic.model.padding_free": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.model.padding_free"),
    "critic.model.dynamic_batching": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.model.dynamic_batching"),
    "critic.model.use_peft": ("tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model", "peft"),
    "critic.model.lora_task_type": ("tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model", "task_type"),
    "critic.model.lora_r": ("tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model", "LORA"),
    "critic.model.lora_target_modules": ("tests/model/test_lora.py::test_bad_lora_settings_name_the_key", "lora_target_modules"),
    "critic.model.lora_alpha": ("tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model", "LORA"),
    "critic.model.lora_dropout": ("tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model", "lora_dropout"),
    "critic.model.lora_use_rslora": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "lora_use_rslora"),
    "critic.model.lora_weight_path": ("tests/model/test_lora.py::test_save_merges_adapters_and_keeps_the_adapter", "lora_weight_path"),
    "critic.model.lora_bias": ("tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model", "bias"),
    "critic.model.use_rslora": ("tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model", "use_rslora"),
    "critic.model.lora_modules_to_save": ("tests/config/test_key_wiring.py::test_lora_keys_reach_the_adapters", "modules_to_save"),
    "critic.optim.lr": "tests/test_learning.py::test_ppo_with_gae_critic_learns",
    "critic.optim.weight_decay": "tests/config/test_key_wiring.py::test_critic_keys_reach_the_value_model",
    "critic.optim.lr_warmup_ratio": ("tests/config/test_key_wiring.py::test_optim_keys_reach_the_engine", "lr_warmup_ratio"),
    "critic.optim.lr_warmup_steps": ("tests/config/test_key_wiring.py::test_optim_keys_reach_the_engine", "lr_warmup_steps"),
    "critic.fsdp.enable_cpu_offload": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.fsdp.enable_cpu_offload"),
    "critic.fsdp.offload_params": ("tests/config/test_key_wiring.py::test_critic_model_and_engine_keys_reach_the_critic", "critic.fsdp.offload_params"),
    "critic.fsdp.offload_optimizer": "tests/train/test_pipelines.py::test_ppo_gae_with_critic_and_warmup",
    "rollout.agent.tools": ("tests/agent/test_agent_pipeline.py::test_two_agentic_steps_with_image_observations", "agent/tool_calls_mean"),
    "rollout.agent.tool_kwargs": ("tests/agent/test_agent_pipeline.py::test_a_tool_from_a_users_file", "times"),
    "rollout.agent.plugins": "tests/agent/test_agent_pipeline.py::test_a_tool_from_a_users_file",
    "rollout.agent.tool_format": "tests/agent/test_agent_pipeline.py::test_agent_keys_reach_the_driver",
    "rollout.agent.answer_tag": "tests/agent/test_agent_pipeline.py::test_agent_keys_reach_the_driver",
    "rollout.agent.observation_role": "tests/agent/test_agent_pipeline.py::test_agent_keys_reach_the_driver",
    "rollout.agent.invalid_call_penalty": "tests/agent/test_agent_pipeline.py::test_agent_keys_reach_the_driver",
    "rollout.agent.tool_workers": "tests/agent/test_agent_pipeline.py::test_agent_keys_reach_the_driver",
    "rollout.max_turns": "tests/agent/test_agent_pipeline.py::test_agent_keys_reach_the_driver",
    "rollout.tool_config_path": "tests/agent/test_classes.py::test_class_files_reach_the_driver",
    "rollout.env_config_path": "tests/agent/test_classes.py::test_class_files_reach_the_driver",
    "rollout.discount": "tests/agent/test_agent_pipeline.py::test_two_agentic_steps_with_image_observations",
    "algorithm.step_advantage_w": "tests/agent/test_agent_pipeline.py::test_two_agentic_steps_with_image_observations",
    "rollout.n": ("tests/engine/test_rollout_engines.py::test_generate_sends_unexpanded_prompts_and_maps_outputs", "n=3"),
    "rollout.temperature": ("tests/engine/test_rollout_engines.py::test_generate_sends_unexpanded_prompts_and_maps_outputs", "temperature"),
    "rollout.top_p": ("tests/engine/test_rollout_engines.py::test_generate_sends_unexpanded_prompts_and_maps_outputs", "top_p"),
    "rollout.top_k": ("tests/engine/test_rollout_engines.py::test_generate_sends_unexpanded_prompts_and_maps_outputs", "top_k"),
    "rollout.seed": "tests/config/test_startup_checks.py::test_seed_none_strings_mean_null",
    "rollout.limit_images": "tests/engine/test_rollout_engines.py::test_engines_are_built_from_rollout_keys",
    "rollout.ignore_eos": "tests/config/test_startup_checks.py::test_ignore_eos_generates_to_the_budget",
    "rollout.micro_batch_size": ("tests/config/test_key_wiring.py::test_lengths_batch_sizes_and_tokenizer_path", "rollout.micro_batch_size"),
    "rollout.trust_remote_code": ("tests/config/test_schema_walk.py::test_derived_keys_follow_their_owner", "DERIVED_KEYS"),
    "reward.reward_function": "tests/reward/test_function.py::test_bad_specs",
    "reward.reward_function_kwargs": "tests/reward/test_boxes.py::test_frames",
    "reward.skip_special_tokens": "tests/config/test_key_wiring.py::test_rollout_reads_skip_special_tokens",
    "reward.model.model_path": "tests/reward/test_models.py::test_rl_steps_with_only_a_reward_model_and_with_both",
    "reward.model.tokenizer_path": "tests/reward/test_models.py::test_reward_model_score_is_its_logit_for_prompt_and_response",
    "reward.model_micro_batch_size": "tests/reward/test_models.py::test_reward_model_score_is_its_logit_for_prompt_and_response",
    "reward.model_weight": "tests/reward/test_models.py::test_rl_steps_with_only_a_reward_model_and_with_both",
    "reward.model.torch_dtype": "tests/reward/test_models.py::test_reward_model_dtype_attention_and_config_keys",
    "reward.model.attn_implementation": "tests/reward/test_models.py::test_reward_model_dtype_attention_and_config_keys",
    "reward.model.override_config": "tests/reward/test_models.py::test_reward_model_dtype_attention_and_config_keys",
    "reward.overlong_buffer.len": "tests/train/test_pipelines.py::test_rlvr_step_with_algorithm_options",
    "reward.overlong_buffer.penalty_factor": ("tests/reward/test_function.py::test_overlong_penalty_by_hand", "overlong_penalty"),
    "reward.repetition_penalty.enable": "tests/reward/test_shaping.py::test_it_lands_in_the_training_score_only",
    "reward.repetition_penalty.ngram_size": "tests/reward/test_shaping.py::test_it_lands_in_the_training_score_only",
    "reward.repetition_penalty.penalty_factor": "tests/reward/test_shaping.py::test_it_lands_in_the_training_score_only",
    "trainer.total_epochs": "tests/config/test_key_wiring.py::test_trainer_keys_for_steps_names_and_checkpoints",
    "trainer.max_steps": "tests/train/test_pipelines.py::test_torchrun_single_process",
    "trainer.project_name": "tests/config/test_key_wiring.py::test_trainer_keys_for_steps_names_and_checkpoints",
    "trainer.experiment_name": "tests/config/test_key_wiring.py::test_trainer_keys_for_steps_names_and_checkpoints",
    "trainer.max_try_make_batch": "tests/algorithms/test_filtering.py::test_fill_batch_running_out_of_rounds_warns_and_counts",
    "trainer.critic_warmup": "tests/test_learning.py::test_ppo_with_gae_critic_learns",
    "trainer.val_freq": "tests/train/test_pipelines.py::test_sft_learns_the_format",
    "trainer.accelerate_config": "tests/engine/test_sharded_engines.py::test_accelerate_config_file_becomes_accelerates_environment",
    "trainer.val_before_train": "tests/train/test_pipelines.py::test_torchrun_single_process",
    "trainer.val_only": "tests/config/test_key_wiring.py::test_val_only_validates_and_trains_nothing",
    "trainer.val_generations_to_log": "tests/train/test_pipelines.py::test_rlvr_two_steps_change_parameters_and_write_metrics",
    "trainer.save_freq": "tests/train/test_checkpoint.py::test_sigkill_mid_save_keeps_the_previous_checkpoint",
    "trainer.save_limit": "tests/train/test_checkpoint.py::test_save_limit_model_only_and_bad_input",
    "actor.checkpoint.async_save": "tests/train/test_checkpoint.py::test_async_save_resumes_exactly_like_a_sync_save",
    "trainer.save_model_only": "tests/train/test_checkpoint.py::test_save_limit_model_only_and_bad_input",
    "trainer.outputs_dir": "tests/train/test_observability.py::test_plot_without_metrics_is_one_line",
    "trainer.save_checkpoint_path": "tests/config/test_key_wiring.py::test_trainer_keys_for_steps_names_and_checkpoints",
    "trainer.load_checkpoint_path": "tests/train/test_checkpoint.py::test_save_limit_model_only_and_bad_input",
    "trainer.find_last_checkpoint": "tests/config/test_key_wiring.py::test_trainer_keys_for_steps_names_and_checkpoints",
    "trainer.resume": "tests/train/test_checkpoint.py::test_sigkill_mid_save_keeps_the_previous_checkpoint",
    "trainer.hf_merge_lora": "tests/config/test_key_wiring.py::test_hf_merge_lora_false_exports_the_base_weights",
    "trainer.samples_freq": "tests/train/test_observability.py::test_tensorboard_console_samples_and_plots",
    "trainer.samples_to_log": "tests/train/test_observability.py::test_tensorboard_console_samples_and_plots",
    "trainer.seed": ("tests/config/test_key_wiring.py::test_ref_model_path_and_trainer_seed", "trainer.seed"),
    "trainer.val_greedy": "tests/train/test_pipelines.py::test_rlvr_two_steps_change_parameters_and_write_metrics",
}


def _default(key):
    obj, parts = PPOConfig(), key.split(".")
    if parts[0] == "critic":
        obj, parts = CriticConfig(), parts[1:]
    for part in parts[:-1]:
        obj = getattr(obj, part)
    return getattr(obj, parts[-1])


def _other_value(key) -> list[str]:
    """Command-line arguments setting `key` to a value of its type other than the default."""
    tp, d = _strip_optional(LEAVES[key]), _default(key)
    if tp is bool:
        return [f"{key}={'false' if d else 'true'}"]
    if typing.get_origin(tp) is dict or tp is dict:
        return [f"{key}.k=1"]
    if typing.get_origin(tp) is list:
        return [f"{key}=[{','.join(map(str, (d or []) + ['x']))}]"]
    if tp is int:
        return [f"{key}={d + 1 if d not in (None, -1, 0) else 3}"]
    if tp is float:
        return [f"{key}={d / 2 if d else 0.5}"]
    return [f"{key}=other_value"]


@functools.cache
def _test_sources() -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(os.path.join(REPO, "tests")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                src = open(path).read()
                lines = src.splitlines()
                for node in ast.walk(ast.parse(src)):
                    if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
                        start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                        out[f"{os.path.relpath(path, REPO)}::{node.name}"] = "\n".join(lines[start - 1:node.end_lineno])
    return out


@pytest.mark.parametrize("key", sorted(LEAVES))
def test_every_key_is_covered_or_refused_or_flagged_at_start_up(key):
    if key in OWNED_ELSEWHERE:
        pytest.skip(f"{key}: built on another branch of issue 15")
    if key in COVERED:
        test, word = COVERED[key] if isinstance(COVERED[key], tuple) else (COVERED[key], key)
        sources = _test_sources()
        assert test in sources, f"{key}: COVERED names {test}, which does not exist"
        assert word in sources[test], f"{key}: {test} does not mention {word!r}"
        return
    args = (["critic.cliprange_value=0.5"] if key.startswith("critic.") else []) + _other_value(key)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            load_config(args)
        except ConfigError as e:
            assert key in str(e), f"{args} raised, but not about {key}: {e}"
            return
    flagged = [str(w.message) for w in record if key in str(w.message)]
    assert flagged, (f"{key}: {args} loads silently; give it an effect and name the test in COVERED, or make a "
                     "changed value a ConfigError / warning at start-up")
    assert all("\n" not in m for m in flagged)  # one line


def test_covered_keys_are_schema_keys():
    assert not set(COVERED) - set(LEAVES) and not OWNED_ELSEWHERE - set(LEAVES)


def test_derived_keys_follow_their_owner():
    """RLLaVA copies these into rollout.*; here a value equal to its owner's is accepted, any other refused."""
    for key, owner in DERIVED_KEYS.items():
        value = _default(owner)
        assert load_config([f"{key}={value}"]) is not None
    with pytest.raises(ConfigError, match="rollout.trust_remote_code=false is read from actor.model.trust_remote_code"):
        load_config(["actor.model.trust_remote_code=true", "rollout.trust_remote_code=false"])
    assert load_config(["rollout.trust_remote_code=false"]).rollout.trust_remote_code is False  # = the owner's
