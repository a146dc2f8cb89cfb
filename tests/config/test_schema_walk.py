"""Every key of the schema, walked: a non-default value either raises at start-up (one line naming the key) or
changes something a test observes. The table below names that test for every key that does not raise; a new key
that is neither fails here until it is classified."""

import os
import typing
import warnings

import pytest

from rllava.config import ConfigError, load_config
from rllava.config.loader import LEAVES, _strip_optional
from rllava.config.schema import PPOConfig, get_key

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def candidates(key: str, default) -> list[str]:
    """Command-line values of the key's type that differ from `default`, most ordinary first."""
    tp = _strip_optional(LEAVES[key])
    if tp is bool:
        return ["false" if default else "true"]
    if tp is int:
        return [str(v) for v in (2, 3, 0, 16) if v != default]
    if tp is float:
        return [str(v) for v in (0.5, 2.0, 0.0) if v != default]
    if typing.get_origin(tp) is list:
        return ["[x]"]
    if typing.get_origin(tp) is dict or tp is dict:
        return ["{a:1}"]
    return ["x", "full", "auto"]


# The keys whose non-default value is accepted, each with a test that sets it (file::test; found by the key's
# name in the test's source, so the entries want a review pass: issue 15 is open on it).
COVERED = {
    "reward.timeout": "tests/reward/test_function.py::test_a_sleeping_reward_times_out_in_process",
    "reward.on_error": "tests/reward/test_function.py::test_on_error_zero_scores_the_sample_0_and_counts_it",
    "reward.num_cpus": "tests/reward/test_function.py::test_worker_pool_scores_kills_hung_workers_and_replaces_dead_ones",
    "trainer.overwrite": "tests/train/test_runtime.py::test_outputs_dir_belongs_to_one_run",
    "actor.clip_ratio_c": "tests/algorithms/test_losses.py::test_vanilla_ppo_hand_computed",
    "actor.clip_ratio_high": "tests/algorithms/test_losses.py::test_vanilla_ppo_hand_computed",
    "actor.clip_ratio_low": "tests/algorithms/test_losses.py::test_vanilla_ppo_hand_computed",
    "actor.deepspeed.zero_stage": "tests/config/test_config.py::test_fsdp_keys_warn_under_single_strategy",
    "actor.fsdp.offload_optimizer": "tests/engine/test_single.py::test_parameter_offload_between_phases_changes_nothing",
    "actor.fsdp.offload_params": "tests/config/test_config.py::test_fsdp_keys_warn_under_single_strategy",
    "actor.fsdp.reshard_after_forward": "tests/config/test_config.py::test_fsdp_keys_warn_under_single_strategy",
    "actor.kl_loss_coef": "tests/engine/test_sharded_engines.py::test_rlvr_pipeline_on_two_ranks",
    "actor.model.attn_implementation": "tests/model/test_video_inputs.py::test_rollout_and_padding_free_log_probs_with_images_and_videos",
    "actor.model.enable_gradient_checkpointing": "tests/model/test_loader.py::test_gradient_checkpointing_gives_the_same_gradients",
    "actor.model.freeze_connector": "tests/model/test_modular.py::test_freeze_errors",
    "actor.model.freeze_llm": "tests/model/test_modular.py::test_freeze_errors",
    "actor.model.freeze_vision_tower": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "actor.model.lora_alpha": "tests/train/test_pipelines.py::test_lora_with_kl_to_the_adapter_free_base",
    "actor.model.lora_r": "tests/engine/test_rollout_engines.py::test_load_pushes_current_weights_and_offload_wraps_rollout",
    "actor.model.lora_target_modules": "tests/model/test_lora.py::test_bad_lora_settings_name_the_key",
    "actor.model.lora_weight_path": "tests/model/test_lora.py::test_save_merges_adapters_and_keeps_the_adapter",
    "actor.model.model_path": "tests/test_examples.py::test_script_parses_with_the_real_loader",
    "actor.model.override_config": "tests/config/test_config.py::test_dict_fields_accept_any_sub_keys",
    "actor.model.padding_free": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "actor.model.use_peft": "tests/engine/test_rollout_engines.py::test_load_pushes_current_weights_and_offload_wraps_rollout",
    "actor.optim.lr": "tests/config/test_config.py::test_rllava_only_keys_and_their_defaults",
    "actor.policy_loss.cispo_clip_ratio_high": "tests/algorithms/test_losses.py::test_cispo_clips_the_weight_but_keeps_every_gradient",
    "actor.policy_loss.cispo_clip_ratio_low": "tests/algorithms/test_losses.py::test_cispo_clips_the_weight_but_keeps_every_gradient",
    "actor.policy_loss.clip_cov_lb": "tests/algorithms/test_losses.py::test_clip_cov_detaches_the_in_band_token",
    "actor.policy_loss.clip_cov_ratio": "tests/algorithms/test_losses.py::test_clip_cov_detaches_the_in_band_token",
    "actor.policy_loss.clip_cov_ub": "tests/algorithms/test_losses.py::test_clip_cov_detaches_the_in_band_token",
    "actor.policy_loss.kl_cov_ratio": "tests/algorithms/test_losses.py::test_kl_cov_penalises_the_top_covariance_tokens",
    "actor.policy_loss.loss_mode": "tests/test_learning.py::test_policy_loss_learns",
    "actor.policy_loss.ppo_kl_coef": "tests/algorithms/test_losses.py::test_kl_cov_penalises_the_top_covariance_tokens",
    "actor.ppo_epochs": "tests/config/test_config.py::test_bare_key_on_the_command_line_is_the_empty_string_for_string_keys",
    "actor.ppo_micro_batch_size": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "actor.ppo_mini_batch_size": "tests/test_learning.py::test_policy_loss_learns",
    "actor.skip_grad_norm": "tests/engine/test_single.py::test_skip_grad_norm_skips_the_update_but_advances_the_schedule",
    "actor.strategy": "tests/config/test_config.py::test_unknown_strategy_lists_choices",
    "algorithm.adv_estimator": "tests/test_learning.py::test_estimator_learns",
    "algorithm.filter_key": "tests/algorithms/test_filtering.py::test_fill_batch_stops_at_max_tries",
    "algorithm.gamma": "tests/model/test_forward.py::test_no_grad_passes_match_with_dynamic_packed_micro_batches",
    "algorithm.kl_ctrl.horizon": "tests/train/test_checkpoint.py::test_stop_and_resume_equals_straight_run_bitwise",
    "algorithm.kl_ctrl.target_kl": "tests/algorithms/test_kl.py::test_adaptive_controller_shapes_rewards_then_moves_beta",
    "algorithm.lam": "tests/train/test_pipelines.py::test_ppo_gae_with_critic_and_warmup",
    "algorithm.norm_adv_by_std_in_grpo": "tests/algorithms/test_advantage.py::test_dr_grpo_drops_std",
    "algorithm.plugins": "tests/train/test_pipelines.py::test_register_ppo_class_plugin",
    "algorithm.use_kl_in_reward": "tests/train/test_checkpoint.py::test_stop_and_resume_equals_straight_run_bitwise",
    "algorithm.use_kl_loss": "tests/engine/test_sharded_engines.py::test_rlvr_pipeline_on_two_ranks",
    "data.answer_key": "tests/data/test_dataset.py::test_a_record_without_its_prompt_or_answer",
    "data.dataset_kwargs": "tests/config/test_config.py::test_dict_fields_accept_any_sub_keys",
    "data.filter_overlong_prompts": "tests/data/test_dataset.py::test_markers_must_match_the_images",
    "data.format_prompt": "tests/test_examples.py::test_script_parses_with_the_real_loader",
    "data.image_key": "tests/data/test_dataset.py::test_an_image_key_matching_no_field",
    "data.max_prompt_length": "tests/data/test_dataset.py::test_overlong_prompts_are_filtered_and_counted",
    "data.max_samples": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "data.min_pixels": "tests/data/test_video.py::test_video_keys_are_checked",
    "data.override_chat_template": "tests/train/test_checkpoint.py::test_hf_export_every_save_and_after_the_fact",
    "data.prompt_key": "tests/data/test_dataset.py::test_a_record_without_its_prompt_or_answer",
    "data.seed": "tests/config/test_config.py::test_command_line_overrides_yaml_and_parses_values",
    "data.shuffle": "tests/data/test_sampler.py::test_each_epoch_is_a_permutation_and_reshuffles",
    "data.target_key": "tests/train/test_pipelines.py::test_sft_learns_the_format",
    "data.train_files": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "data.val_batch_size": "tests/test_examples.py::test_tiny_cpu_twin_runs",
    "data.val_files": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "data.video_fps": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "data.video_key": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "data.video_max_frames": "tests/train/test_video_pipeline.py::test_rlvr_two_steps_on_videos",
    "data.video_min_pixels": "tests/data/test_video.py::test_video_keys_are_checked",
    "ref.log_prob_micro_batch_size": "tests/config/test_config.py::test_rllava_only_keys_and_their_defaults",
    "ref.model_path": "tests/config/test_config.py::test_rllava_only_keys_and_their_defaults",
    "reward.reward_function": "tests/test_examples.py::test_script_parses_with_the_real_loader",
    "reward.reward_function_kwargs": "tests/test_examples.py::test_script_parses_with_the_real_loader",
    "reward.reward_type": "tests/reward/test_function.py::test_batch_style_sees_every_field",
    "rollout.bucket_size": "tests/engine/test_rollout_engines.py::test_load_pushes_current_weights_and_offload_wraps_rollout",
    "rollout.limit_images": "tests/engine/test_rollout_engines.py::test_engines_are_built_from_rollout_keys",
    "rollout.micro_batch_size": "tests/model/test_forward.py::test_dynamic_batching_gives_the_same_gradients",
    "rollout.n": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "rollout.seed": "tests/model/test_tiny.py::test_tiny_is_deterministic_and_atomic",
    "rollout.sglang.dtype": "tests/model/test_loader.py::test_export_names_the_standard_processor",
    "rollout.sglang.mem_fraction_static": "tests/engine/test_rollout_engines.py::test_engines_are_built_from_rollout_keys",
    "rollout.temperature": "tests/config/test_config.py::test_config_file_forms",
    "rollout.tensor_parallel_size": "tests/engine/test_rollout_engines.py::test_engines_are_built_from_rollout_keys",
    "rollout.top_k": "tests/engine/test_rollout_engines.py::test_generate_sends_unexpanded_prompts_and_maps_outputs",
    "rollout.top_p": "tests/config/test_config.py::test_validation_reports_all_problems_and_is_a_value_error",
    "rollout.vllm.chat_template": "tests/model/test_modular.py::test_compose_loads_each_part_from_its_own_directory",
    "rollout.vllm.dtype": "tests/model/test_loader.py::test_export_names_the_standard_processor",
    "rollout.vllm.gpu_memory_utilization": "tests/engine/test_rollout_engines.py::test_engines_are_built_from_rollout_keys",
    "rollout.vllm.model": "tests/test_examples.py::test_real_scripts_use_the_seed_command_and_real_models",
    "rollout.vllm.seed": "tests/model/test_tiny.py::test_tiny_is_deterministic_and_atomic",
    "rollout.vllm.tokenizer": "tests/model/test_modular.py::test_compose_loads_each_part_from_its_own_directory",
    "trainer.critic_warmup": "tests/test_learning.py::test_ppo_with_gae_critic_learns",
    "trainer.device": "tests/config/test_config.py::test_rllava_only_keys_and_their_defaults",
    "trainer.load_checkpoint_path": "tests/train/test_checkpoint.py::test_save_limit_model_only_and_bad_input",
    "trainer.max_steps": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "trainer.outputs_dir": "tests/model/test_modular.py::test_rlvr_two_steps_train_the_unfrozen_parts",
    "trainer.resume": "tests/train/test_checkpoint.py::test_stop_and_resume_equals_straight_run_bitwise",
    "trainer.samples_freq": "tests/train/test_observability.py::test_tensorboard_console_samples_and_plots",
    "trainer.samples_to_log": "tests/train/test_observability.py::test_tensorboard_console_samples_and_plots",
    "trainer.save_freq": "tests/config/test_config.py::test_example_config_loads_every_key_with_its_value",
    "trainer.save_limit": "tests/train/test_checkpoint.py::test_save_limit_model_only_and_bad_input",
    "trainer.save_model_only": "tests/train/test_checkpoint.py::test_save_limit_model_only_and_bad_input",
    "trainer.seed": "tests/config/test_config.py::test_rllava_only_keys_and_their_defaults",
    "trainer.val_before_train": "tests/train/test_pipelines.py::test_torchrun_single_process",
    "trainer.val_freq": "tests/test_examples.py::test_tiny_cpu_twin_runs",
    "trainer.val_generations_to_log": "tests/engine/test_sharded_engines.py::test_rlvr_pipeline_on_two_ranks",
    "trainer.val_greedy": "tests/config/test_config.py::test_rllava_only_keys_and_their_defaults",
}

# Accepted keys not yet classified (issue 15 open): this set may only shrink; a key moves to COVERED with its test,
# or becomes a start-up error. A new schema key cannot land here.
PENDING = {
    "actor.clip_ratio",
    "actor.deepspeed.contiguous_gradients",
    "actor.deepspeed.enable_cpu_offload",
    "actor.deepspeed.overlap_comm",
    "actor.deepspeed.reduce_scatter",
    "actor.deepspeed.stage3_param_persistence_threshold",
    "actor.deepspeed.stage3_prefetch_bucket_size",
    "actor.deepspeed.torch_dtype",
    "actor.entropy_coeff",
    "actor.fsdp.enable_cpu_offload",
    "actor.fsdp.forward_prefetch",
    "actor.fsdp.mixed_precision",
    "actor.fsdp.ulysses_size",
    "actor.fsdp.use_orig_params",
    "actor.log_prob_max_token_len_per_gpu",
    "actor.log_prob_micro_batch_size",
    "actor.logprob_chunk_size",
    "actor.max_grad_norm",
    "actor.model.dynamic_batching",
    "actor.model.lora_bias",
    "actor.model.lora_dropout",
    "actor.model.lora_modules_to_save",
    "actor.model.lora_task_type",
    "actor.model.lora_use_rslora",
    "actor.model.tie_word_embeddings",
    "actor.model.tokenizer_path",
    "actor.model.trust_remote_code",
    "actor.model.use_rslora",
    "actor.optim.lr_warmup_ratio",
    "actor.optim.lr_warmup_steps",
    "actor.optim.min_lr_ratio",
    "actor.optim.num_cycles",
    "actor.optim.training_steps",
    "actor.optim.weight_decay",
    "actor.ppo_max_token_len_per_gpu",
    "actor.tis_imp_ratio_cap",
    "actor.use_torch_compile",
    "algorithm.filter_high",
    "algorithm.filter_low",
    "algorithm.kl_ctrl.kl_coef",
    "algorithm.online_filtering",
    "algorithm.rollout_is_cap",
    "data.filter_overlong_prompts_workers",
    "data.max_response_length",
    "data.num_workers",
    "data.train_image_dir",
    "data.val_image_dir",
    "ref.log_prob_max_token_len_per_gpu",
    "reward.overlong_buffer.len",
    "reward.overlong_buffer.penalty_factor",
    "reward.skip_special_tokens",
    "rollout.disable_tqdm",
    "rollout.load_format",
    "rollout.sglang.skip_server_warmup",
    "rollout.sglang.tp_size",
    "rollout.trust_remote_code",
    "rollout.vllm.disable_log_stats",
    "rollout.vllm.distributed_executor_backend",
    "rollout.vllm.enable_chunked_prefill",
    "rollout.vllm.enforce_eager",
    "rollout.vllm.load_format",
    "rollout.vllm.max_model_len",
    "rollout.vllm.max_num_batched_tokens",
    "rollout.vllm.pipeline_parallel_size",
    "rollout.vllm.skip_tokenizer_init",
    "trainer.experiment_name",
    "trainer.find_last_checkpoint",
    "trainer.hf_merge_lora",
    "trainer.max_try_make_batch",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "trainer.project_name",
    "trainer.save_checkpoint_path",
    "trainer.total_epochs",
    "trainer.val_only",
}


def walk():
    cfg = PPOConfig()
    for key in sorted(LEAVES):
        if key.startswith("critic."):
            continue  # the critic section is walked with critic set, below
        yield key, get_key(cfg, key)


def _outcome(args: list[str]) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            load_config(args)
            return "accepted"
        except ConfigError as e:
            return f"error: {e}"


@pytest.mark.parametrize("key, default", list(walk()), ids=[k for k, _ in walk()])
def test_every_key_changes_something_or_raises(key, default):
    outcomes = {v: _outcome([f"{key}={v}"]) for v in candidates(key, default)}
    accepted = [v for v, o in outcomes.items() if o == "accepted"]
    if accepted:
        assert key in COVERED or key in PENDING, (f"{key}={accepted[0]} is accepted: list the test that observes its effect in COVERED, "
                                "or make a non-default value a start-up error")
    else:  # every candidate raised: each message names the key
        assert all(key in o for o in outcomes.values()), outcomes


def test_pending_keys_are_real_and_not_covered_twice():
    assert PENDING <= set(LEAVES) and not PENDING & set(COVERED) and len(PENDING) <= 75


@pytest.mark.parametrize("key, test", sorted(COVERED.items()))
def test_the_covering_tests_exist_and_name_the_key(key, test):
    path, name = test.split("::")
    source = open(os.path.join(REPO, path)).read()
    assert f"def {name}(" in source, test
    leaf = key.split(".")[-1]
    assert leaf in source, f"{test} does not mention {leaf}"
