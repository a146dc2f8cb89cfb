"""The typed values that flow between the four stages.

    Sample (dataset) -> Trajectory (rollout) -> Batch (tensors, + scores, advantages, log-probs) -> update

A `Trajectory` is a list of segments, each *given* (prompt, tool output: never trained) or *model-written*
(trained). RLVR is `[prompt, response]`; a multi-turn agent appends `[observation, turn]` pairs; hybrid SFT+RL
marks an expert segment `off_policy`. `collate` derives every tensor the trainer needs from the segments, once.
"""

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch


@dataclass
class Sample:
    """One prompt as the dataset yields it (before tokenization)."""

    index: int  # row in the dataset
    messages: list[dict]  # chat messages; image parts as {"type": "image"}
    images: list[Any]  # PIL images, already bounded by data.min_pixels/max_pixels
    ground_truth: Any
    extra: dict = field(default_factory=dict)  # every other field of the record (for reward functions)
    target: str | None = None  # reference response text (SFT), if any
    videos: list[Any] = field(default_factory=list)  # rllava.data.video.Video: frames sampled and sized
    image_sizes: list[tuple[int, int]] = field(default_factory=list)  # (width, height) of each image as stored
    source: str = ""  # the data spec the record came from (data.train_files / val_files), for error messages

    @property
    def prompt(self) -> str:
        """The prompt text as the model saw it: the last user message's text, `<image>` / `<video>` where those
        parts sit (what samples.jsonl shows and what a reward function's `prompt` field holds)."""
        content = next((m["content"] for m in reversed(self.messages) if m.get("role") == "user"), "")
        return content if isinstance(content, str) else "".join(p.get("text", f"<{p['type']}>") for p in content)

    @property
    def where(self) -> str:
        """"train.jsonl record 7": how errors about this sample name it."""
        return f"{self.source} record {self.index}" if self.source else f"record {self.index}"


@dataclass
class Segment:
    token_ids: list[int]
    trained: bool  # written by the policy (in the loss) or given (prompt, observation)
    off_policy: bool = False  # written by someone else (expert) but trained
    logprobs: list[float] | None = None  # rollout engine's sampling log-probs, for trained segments
    version: int | None = None  # asynchronous RL: the update whose weights sampled it (rllava.train.async_rl)


@dataclass
class Trajectory:
    sample: Sample
    group_id: int  # all K samples of one prompt share it
    segments: list[Segment]
    # processor outputs for this trajectory's images and videos: pixel_values, image_grid_thw, pixel_values_videos,
    # video_grid_thw, second_per_grid_ts (Qwen2.5-VL); Batch.model_inputs concatenates each over the rows
    mm_inputs: dict[str, torch.Tensor]
    response: str = ""  # decoded text of the model-written segments (what the reward reads)
    finish_reason: str = "stop"  # "stop" (EOS) or "length" (hit max_response_length)
    # (width, height) of each image as the model saw it, after the processor's resize (grounding rewards)
    model_image_sizes: list[tuple[int, int]] = field(default_factory=list)
    # a demonstration added to the batch for a hybrid's SFT term only: in no group, no reward, no advantage
    sft_only: bool = False
    # agents (rllava.agent): the tool-level reward of each model turn's call, and the episode's state (every
    # image shown, the calls made, the tools' memory) for reward functions
    turn_rewards: list[float] = field(default_factory=list)
    turn_anchors: list[str] = field(default_factory=list)  # per model turn: a digest of what it was written after
    agent: Any = None

    @property
    def num_response_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.trained)

    @property
    def expert(self) -> str | None:
        """A hybrid's expert row: "demonstration" (for the SFT term only), "prefix" (it starts with the expert's
        tokens); None for the policy's own."""
        return "demonstration" if self.sft_only else "prefix" if any(s.off_policy for s in self.segments) else None


# Which stage fills each optional Batch field, for the error when it is read before being set.
_PRODUCED_BY = {"scores": "reward", "advantages": "advantage", "old_logprobs": "old log-prob",
                "ref_logprobs": "reference", "teacher_logprobs": "teacher", "rollout_logprobs": "rollout",
                "token_rewards": "KL-in-reward", "values": "critic", "baseline_scores": "greedy baseline rollout"}


@dataclass
class Batch:
    """Right-padded tensors for B trajectories of length <= T, plus what the stages add."""

    trajectories: list[Trajectory]
    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T] 1 where input_ids[t] was written by the policy (predicted from t-1)
    group_ids: torch.Tensor  # [B]
    rollout_logprobs: torch.Tensor | None = None  # [B, T] from the rollout engine
    scores: torch.Tensor | None = None  # [B] scalar reward per trajectory
    advantages: torch.Tensor | None = None  # [B, T]
    old_logprobs: torch.Tensor | None = None  # [B, T] train engine, policy before this update
    ref_logprobs: torch.Tensor | None = None  # [B, T] frozen reference
    teacher_logprobs: torch.Tensor | None = None  # [B, T] on-policy distillation's teacher(s)
    token_rewards: torch.Tensor | None = None  # [B, T] score at the last token, minus KL when KL is in the reward
    values: torch.Tensor | None = None  # [B, T] critic values V(s_t)
    baseline_scores: torch.Tensor | None = None  # [B] ReMax: reward of the greedy response to the same prompt
    off_policy_mask: torch.Tensor | None = None  # [B, T] 1 on trained tokens an expert wrote; None when none did
    sft_only: torch.Tensor | None = None  # [B] bool: Trajectory.sft_only rows (hybrids); None when there are none
    # agents (None otherwise): on model turn k's tokens, turn_index = k and turn_anchors = the id of what the turn
    # was written after (equal ids: the same observation); turn_rewards: each turn's tool-level reward at its last token
    turn_index: torch.Tensor | None = None  # [B, T] long, -1 off the model's turns
    turn_anchors: torch.Tensor | None = None  # [B, T] long, -1 off the model's turns
    turn_rewards: torch.Tensor | None = None  # [B, T]
    reward_details: list[dict] = field(default_factory=list)  # the reward function's named scores per sample

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def need(self, name: str) -> torch.Tensor:
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"batch.{name} is not set: it is produced by the {_PRODUCED_BY[name]} stage, "
                             "which has not run on this batch")
        return value

    def select(self, idx: list[int]) -> "Batch":
        """Rows `idx` (a micro- or mini-batch), trimmed to the longest selected row."""
        index = torch.tensor(idx, dtype=torch.long)
        length = int(self.attention_mask[index].sum(-1).max())
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("trajectories", "reward_details"):  # lists of rows (no reward details before scoring)
                out[f.name] = [v[i] for i in idx] if v else []
            elif isinstance(v, torch.Tensor):
                out[f.name] = v[index][:, :length] if v.dim() == 2 else v[index]
            else:
                out[f.name] = v
        return Batch(**out)

    def to(self, device) -> "Batch":
        """A copy with every tensor on `device` (trajectories stay on the host)."""
        moved = {f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                 for f in fields(self)}
        moved["trajectories"] = [replace(t, mm_inputs={k: v.to(device) for k, v in t.mm_inputs.items()})
                                 if t.mm_inputs else t for t in self.trajectories]
        return Batch(**moved)

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """Keyword arguments for the model's forward: ids, mask and every row's images and videos (`concat_mm`)."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                **concat_mm([t.mm_inputs for t in self.trajectories])}


def concat_mm(mm_inputs: list[dict[str, torch.Tensor]], keys=None) -> dict[str, torch.Tensor]:
    """Each pixel / grid tensor of several rows' `mm_inputs` concatenated along dim 0 over the rows that have it,
    in row order (only the names in `keys`, when given)."""
    names = sorted({k for m in mm_inputs for k in m if keys is None or k in keys})
    return {k: torch.cat([m[k] for m in mm_inputs if k in m], dim=0) for k in names}


def collate(trajectories: list[Trajectory], pad_token_id: int) -> Batch:
    """Concatenate each trajectory's segments into one row, right-pad, and derive the masks."""
    rows, masks, logps, offs = [], [], [], []
    for t in trajectories:
        ids, mask, lp, off = [], [], [], []
        for s in t.segments:
            ids += s.token_ids
            mask += [1 if s.trained else 0] * len(s.token_ids)
            off += [1 if s.trained and s.off_policy else 0] * len(s.token_ids)
            lp += s.logprobs if (s.trained and s.logprobs is not None) else [0.0] * len(s.token_ids)
        rows.append(ids), masks.append(mask), logps.append(lp), offs.append(off)
    T = max(len(r) for r in rows)

    def padded(lists: list[list], value, dtype: torch.dtype) -> torch.Tensor:  # [B, T], right-padded with `value`
        return torch.tensor([x + [value] * (T - len(x)) for x in lists], dtype=dtype)

    input_ids = padded(rows, pad_token_id, torch.long)
    attention_mask = padded([[1] * len(r) for r in rows], 0, torch.long)
    loss_mask, rollout_logprobs, off_policy_mask = (padded(x, 0, torch.float32) for x in (masks, logps, offs))
    # expert tokens were not sampled: they carry no rollout log-probs and need none
    sampled = [s for t in trajectories for s in t.segments if s.trained and not s.off_policy]
    have_logprobs = bool(sampled) and all(s.logprobs is not None for s in sampled)
    hybrid = any(s.off_policy for t in trajectories for s in t.segments)
    sft_only = torch.tensor([t.sft_only for t in trajectories])
    batch = Batch(trajectories=trajectories, input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask,
                  group_ids=torch.tensor([t.group_id for t in trajectories]),
                  rollout_logprobs=rollout_logprobs if have_logprobs else None,
                  off_policy_mask=off_policy_mask if hybrid else None, sft_only=sft_only if sft_only.any() else None)
    if any(t.turn_rewards for t in trajectories):
        batch.turn_index, batch.turn_anchors, batch.turn_rewards = _turn_tensors(trajectories, T)
    return batch


def _turn_tensors(trajectories: list[Trajectory], T: int):
    """turn_index, turn_anchors, turn_rewards [B, T] of agent trajectories (see Batch)."""
    index = torch.full((len(trajectories), T), -1, dtype=torch.long)
    anchors, rewards, ids = torch.full_like(index, -1), torch.zeros(len(trajectories), T), {}
    for i, t in enumerate(trajectories):
        pos, k = 0, 0
        for s in t.segments:
            n = len(s.token_ids)
            if s.trained and not s.off_policy and k < len(t.turn_rewards):
                index[i, pos:pos + n] = k
                anchors[i, pos:pos + n] = ids.setdefault(t.turn_anchors[k] if k < len(t.turn_anchors) else "", len(ids))
                if n:
                    rewards[i, pos + n - 1] = t.turn_rewards[k]
                k += 1
            pos += n
    return index, anchors, rewards
