"""The memory planner: the device memory of one configured RL step, planned without weights and without a GPU,
phase by phase; `auto` sizes each micro-batch to the largest that fits (auto.py). The library's (a run resolves
`actor.ppo_micro_batch_size=auto` with it before its first step); `python -m rllava.commands.memory` prints it.

The policy is built from its config.json under torch's FakeTensorMode (tensors with shapes and dtypes, no
storage), with the config's training switches (frozen parts, LoRA, gradient checkpointing), and each phase of
one step runs on it under torch's `MemTracker`, which adds up every live tensor and keeps the peak by kind
(parameters, gradients, optimizer state, activations, temporaries). The forward passes are rllava's own
(`rllava.model.forward._token_logprobs` on a Batch of the planned shapes): the chunked LM head
(actor.logprob_chunk_size), padding_free and shared_prefix run as configured.

  rollout       HF engine: a prefill forward (no grad) of one generate call's prompts, and its KV cache, counted
                from the config: 2 (K, V) x layers x kv_heads x head_dim x dtype bytes per token, for
                rollout.micro_batch_size prompts x rollout.n samples x (max_prompt_length + max_response_length).
                vLLM / SGLang: the engine's reservation, rollout.vllm.gpu_memory_utilization (SGLang:
                rollout.sglang.mem_fraction_static) x --gpu-memory, beside what the trainer keeps on the device
                (not its weights and gradients with actor.fsdp.offload_params), and one weight-sync bucket
                (rollout.bucket_size MB: the policy reaches the engine a bucket at a time). Outside the rollout
                the engine sleeps (vLLM sleep(level=1), SGLang release_memory_occupation): none of it is on the device.
  old log-prob  a forward without grad of one micro-batch: actor.log_prob_micro_batch_size sequences, or with
                actor.model.dynamic_batching as many full-length ones as actor.log_prob_max_token_len_per_gpu holds.
  ref log-prob  with a KL (algorithm.use_kl_loss, use_kl_in_reward): the same on the frozen reference (a copy of
                the starting weights, resident in every phase; for LoRA without ref.model_path the policy itself,
                adapters off), ref.log_prob_micro_batch_size (or ref.log_prob_max_token_len_per_gpu) sequences.
  teacher log-prob  algorithm.distill with a sampled-token loss (k1, k3): the same on each teacher (its own
                config; every teacher resident in every phase, as the reference; engine=vllm|sglang not planned).
  update        a forward + backward of one micro-batch (actor.ppo_micro_batch_size, or
                actor.ppo_max_token_len_per_gpu tokens), beside the gradients of the mini-batch's earlier
                micro-batches where it has several.
  optimizer     gradient clipping and torch.optim.AdamW's step (foreach kernels, as on CUDA): 2 states per
                trainable parameter, in the parameters' dtype; none on the device with actor.fsdp.enable_cpu_offload
                (the step runs on the host), outside the update with actor.fsdp.offload_optimizer.

FSDP2 (actor.strategy fsdp / fsdp2; auto with --world-size > 1, or on a GPU with actor.fsdp.enable_cpu_offload /
offload_params, RLLaVA's offload switches, as rllava runs it): rllava's own `shard_model` shards the model over
a fake process group of --world-size ranks (FSDP2's mixed precision and reshard_after_forward as configured; the
reference sharded too) and torch's `FSDPMemTracker` tracks it; each rank plans its share of the
batch (train_batch_size x n / N rows, mini-batches likewise). With either offload switch the shards, their
gradients and Adam's states are on the host (CPUOffloadPolicy): tracked, but not counted on the device. For HF
generate every unit is gathered for the whole rollout, as rllava does. DeepSpeed plans as FSDP2 (ZeRO-3's sharding).
actor.model.ulysses_size=N (--world-size a multiple of N): the training passes run rllava.model.ulysses on the
fake group, each rank's decoder on 1/N of every sequence beside the all-to-all's buffers (the rollout is whole).

Every phase holds the weights, and the optimizer state a previous step left. Every sequence is as long as the
config allows, every prompt holds one square image as large as data.max_pixels and max_prompt_length allow
(Qwen-VL: one token per merged (patch x 2)^2 pixels; the image's tokens count in the prompt's length), and the
rollout.n samples of a prompt share it; padding_free therefore saves nothing here (no sequence is short). Not
counted: the CUDA context and the allocator's cache and fragmentation (~1-2 GiB on a real GPU), the generate
loop's own transients, a critic, the exact KL's in-update buffers (named under the table).

Modules: planner (the phases), auto (micro-batches sized to a budget), fake (the fake mode), torch_private (all
torch private APIs).
"""
