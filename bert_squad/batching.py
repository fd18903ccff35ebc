"""Which features go into which micro batch, on which rank, in which order, and how each is padded.

Features are grouped by length (random mega-chunks sorted by length, the chunks' batches shuffled), so
a padded batch (to its length bucket, or with `--padding longest` to its longest feature) wastes little. Every
micro batch is whole (the last step wraps around to the epoch's first features), so training sees few
shapes, each of the micro batch's size. The order depends only on (seed, epoch): every rank computes the
same global plan and takes its own share of each step, which keeps ranks in step and makes a resumed run
see exactly the batches the interrupted one would have.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    import datasets


def feature_lengths(features: datasets.Dataset) -> np.ndarray:
    """Each feature's number of tokens, from the offsets of its Arrow column alone: no row becomes Python
    objects, so every rank holds 4 bytes a feature instead of the whole token column."""
    import pyarrow.compute as pc  # loaded with datasets

    return pc.list_value_length(features.with_format("arrow")["input_ids"]).to_numpy()


class BatchPlan:
    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        micro_batch: int,
        world_size: int,
        rank: int,
        seed: int,
        group_by_length: bool = True,
        chunk_steps: int = 32,
        accumulation: int = 1,
    ) -> None:
        self.lengths = np.asarray(lengths)
        self.micro_batch, self.world_size, self.rank = micro_batch, world_size, rank
        self.seed, self.group_by_length, self.chunk_steps = seed, group_by_length, chunk_steps
        step_size = micro_batch * world_size
        # Every rank gets the same number of micro batches, enough for at least one optimizer step of
        # `accumulation` of them: a data set smaller than one global batch is repeated to fill it.
        self.steps = max(-(-len(self.lengths) // step_size), accumulation)

    def __len__(self) -> int:
        return self.steps

    def epoch(self, epoch: int) -> list[list[int]]:
        """This rank's micro batches (lists of feature indices) for `epoch`."""
        rng = np.random.default_rng([self.seed, epoch])
        step_size = self.micro_batch * self.world_size
        order = rng.permutation(len(self.lengths))
        order = np.resize(order, self.steps * step_size)  # wrap around to fill the last step
        steps = order.reshape(self.steps, step_size)
        if self.group_by_length:
            chunk = self.chunk_steps * step_size
            flat = np.concatenate(
                [
                    c[np.argsort(-self.lengths[c], kind="stable")]
                    for c in np.split(order, range(chunk, len(order), chunk))
                ]
            )
            steps = flat.reshape(self.steps, step_size)[rng.permutation(self.steps)]
        # Within a step, consecutive (similar-length) micro batches go to consecutive ranks.
        return [s[self.rank * self.micro_batch : (self.rank + 1) * self.micro_batch].tolist() for s in steps]

    def stream(self, epoch: int, start: int, per_epoch: int, count: int) -> Iterator[list[int]]:
        """`count` micro batches in a row, the first `per_epoch` of each epoch's, from micro batch `start` of
        `epoch` on: one sampler for a DataLoader that spans epochs, so its workers start once per run."""
        while count > 0:
            for batch in self.epoch(epoch)[start:per_epoch][:count]:
                yield batch
                count -= 1
            epoch, start = epoch + 1, 0


def bucket_lengths(max_length: int, most: int = 8, quantum: int = 64) -> list[int]:
    """The lengths training batches are padded to: multiples of `quantum` (64, or a multiple of it that keeps
    them to `most`) below `max_length`, and `max_length`. Few fixed shapes let a compiled step build one graph
    a length and replay it, where padding each batch to its longest gave a new shape almost every step."""
    width = quantum * -(-max_length // (most * quantum))
    return [*range(width, max_length, width), max_length]


class Collator:
    """Pads a list of features as torch tensors: to the shortest of `lengths` that holds the batch's longest
    feature (the batch's longest where `lengths` is None)."""

    KEYS = ("input_ids", "token_type_ids", "attention_mask")  # the model's inputs (a family may lack one)
    LABELS = ("start_positions", "end_positions")

    def __init__(self, pad_id: int, lengths: Sequence[int] | None = None, labels: bool = True) -> None:
        self.pad_id, self.lengths, self.labels = pad_id, sorted(lengths or ()), labels

    @classmethod
    def for_training(cls, pad_id: int, max_length: int, padding: str) -> Collator:
        """Training's, by `padding` (config.PADDINGS): every batch to its length bucket, to its own longest
        feature, or to `max_length`."""
        lengths = {"max-length": [max_length], "buckets": bucket_lengths(max_length), "longest": None}[padding]
        return cls(pad_id, lengths)

    def columns(self, features: datasets.Dataset) -> list[str]:
        """The columns of `features` this collator reads."""
        wanted = self.KEYS + (self.LABELS if self.labels else ())
        return [c for c in wanted if c in features.column_names]

    def padded_length(self, longest: int) -> int:
        """The length a batch whose longest feature has `longest` tokens is padded to."""
        return next((n for n in self.lengths if n >= longest), longest)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        length = self.padded_length(max(len(r["input_ids"]) for r in rows))
        batch = {}
        for key in self.KEYS:
            if key in rows[0]:
                fill = self.pad_id if key == "input_ids" else 0
                batch[key] = torch.tensor([r[key] + [fill] * (length - len(r[key])) for r in rows])
        for key in self.LABELS if self.labels else ():
            batch[key] = torch.tensor([r[key] for r in rows])
        return batch
