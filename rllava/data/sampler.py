"""Batches of dataset indices with an explicit (epoch, position) state.

Epoch e visits the indices in the order `torch.randperm(n, generator=Generator().manual_seed(seed + e))`, so
every epoch reshuffles, and a run resumed from `state_dict()` sees exactly the batches an uninterrupted run
would, without storing the permutation.
"""

import torch

from rllava.data.records import DataError


class EpochSampler:
    """`next_batch()` walks the epochs forever; iterating yields the rest of the current epoch (a fresh epoch once this
    one is used up), so it also serves as a DataLoader `batch_sampler`. `len()` is the number of batches per epoch."""

    def __init__(self, n: int, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool = True):
        if batch_size < 1:
            raise DataError(f"batch size must be >= 1, got {batch_size} (data.train_batch_size)")
        if n < 1 or (drop_last and n < batch_size):
            raise DataError(f"the dataset has {n} records, fewer than one batch of {batch_size} "
                            "(data.train_batch_size); lower the batch size or add records")
        self.n, self.batch_size, self.shuffle, self.seed, self.drop_last = n, batch_size, shuffle, seed, drop_last
        self.epoch, self.position = 0, 0  # position = batches already taken from this epoch
        self._order: tuple[int, list[int]] | None = None  # (epoch, its permutation), computed once per epoch

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def epoch_order(self, epoch: int) -> list[int]:
        """All n indices in the order epoch `epoch` visits them."""
        if not self.shuffle:
            return list(range(self.n))
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._order = (epoch, torch.randperm(self.n, generator=generator).tolist())
        return self._order[1]

    def next_batch(self) -> list[int]:
        """The next batch, moving on to a freshly shuffled epoch when this one is used up."""
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position * self.batch_size
        self.position += 1
        return self.epoch_order(self.epoch)[start:start + self.batch_size]

    def __iter__(self):
        if self.position >= len(self):
            self.epoch, self.position = self.epoch + 1, 0
        epoch = self.epoch
        while self.epoch == epoch and self.position < len(self):
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        missing = [k for k in ("epoch", "position") if k not in state]
        if missing:
            raise DataError(f"sampler state has no {', '.join(missing)} (got keys: {', '.join(state)})")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self):
            raise DataError(f"sampler state epoch={epoch}, position={position} does not fit {len(self)} batches "
                            f"per epoch ({self.n} records, batch size {self.batch_size}); did the dataset change?")
        self.epoch, self.position = epoch, position
