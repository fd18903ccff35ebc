"""Length-grouped batch plans, and a train set smaller than one of their global batches."""

import json

import numpy as np
import pytest
from helpers import run_bert_squad, train_args

from bert_squad.batching import BatchPlan, Collator, bucket_lengths, feature_lengths


def lengths(n=1000, seed=0):
    return np.random.default_rng(seed).integers(40, 385, n)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_feature_once_per_epoch_and_ranks_disjoint(world):
    ls = lengths(1001)
    plans = [BatchPlan(ls, 8, world, r, seed=1) for r in range(world)]
    per_rank = [p.epoch(0) for p in plans]
    assert len({len(b) for b in per_rank}) == 1  # same number of batches on every rank
    assert {len(b) for batches in per_rank for b in batches} == {8}  # the last one filled too
    flat = [i for batches in per_rank for b in batches for i in b]
    assert set(flat) == set(range(1001))
    assert len(flat) - 1001 < 8 * world  # at most one step wraps around
    for step in zip(*per_rank):  # one optimizer step: disjoint features across ranks
        ids = [i for b in step for i in b]
        assert len(ids) == len(set(ids))


def test_feature_lengths_are_the_token_counts_in_memory_on_disk_and_after_a_selection(tmp_path):
    """Read from the Arrow column's offsets, they are each row's number of tokens wherever the rows are, and in
    the selection's order when one reorders them."""
    import datasets

    rows = [list(range(n)) for n in lengths(50)]
    in_memory = datasets.Dataset.from_dict({"input_ids": rows, "other": [[0]] * 50})
    in_memory.to_parquet(tmp_path / "f.parquet")
    on_disk = datasets.Dataset.from_parquet(str(tmp_path / "f.parquet"), cache_dir=str(tmp_path / "cache"))
    for ds in (in_memory, on_disk):
        assert feature_lengths(ds).tolist() == [len(r) for r in rows]
        assert feature_lengths(ds.select([7, 3, 49])).tolist() == [len(rows[7]), len(rows[3]), len(rows[49])]


def test_plan_depends_only_on_seed_and_epoch():
    ls = lengths()
    a, b = BatchPlan(ls, 16, 2, 1, seed=5), BatchPlan(ls, 16, 2, 1, seed=5)
    assert a.epoch(3) == b.epoch(3)
    assert a.epoch(3) != a.epoch(4)
    assert a.epoch(0) != BatchPlan(ls, 16, 2, 1, seed=6).epoch(0)


def test_a_stream_crosses_epochs_as_its_epochs_read_one_after_another():
    """The one sampler a run's DataLoader takes: from a position in an epoch, across epoch boundaries, each
    epoch cut to its whole optimizer steps; a position at an epoch's end (a checkpoint there) goes on with
    the next epoch."""
    plan = BatchPlan(lengths(300), 16, 1, 0, seed=3)
    per_epoch = len(plan) - 1  # whole optimizer steps of 2 micro batches leave the odd one out
    expected = plan.epoch(2)[5:per_epoch] + plan.epoch(3)[:per_epoch] + plan.epoch(4)[:7]
    assert list(plan.stream(2, 5, per_epoch, len(expected))) == expected
    assert list(plan.stream(2, per_epoch, per_epoch, 3)) == plan.epoch(3)[:3]


def test_grouping_cuts_padding():
    ls = lengths(4000)

    def padded(plan):
        return sum(len(b) * max(ls[i] for i in b) for b in plan.epoch(0))

    grouped, shuffled = BatchPlan(ls, 16, 1, 0, seed=0), BatchPlan(ls, 16, 1, 0, seed=0, group_by_length=False)
    assert padded(grouped) < 0.7 * padded(shuffled)
    assert padded(grouped) >= ls.sum()


def test_collator_pads_to_the_batch_or_to_the_shortest_length_that_holds_it():
    rows = [
        {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "start_positions": 1, "end_positions": 2},
        {"input_ids": [4], "attention_mask": [1], "start_positions": 0, "end_positions": 0},
    ]
    b = Collator(pad_id=0)(rows)
    assert b["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]] and b["attention_mask"].tolist()[1] == [1, 0, 0]
    assert Collator(pad_id=0, lengths=[8])(rows)["input_ids"].shape == (2, 8)
    assert Collator(pad_id=0, lengths=[6, 2, 4])(rows)["input_ids"].shape == (2, 4)
    assert Collator(pad_id=0, lengths=[2])(rows)["input_ids"].shape == (2, 3)  # none holds it: its longest


@pytest.mark.parametrize(
    "max_length, buckets",
    [
        (384, [64, 128, 192, 256, 320, 384]),
        (512, [64, 128, 192, 256, 320, 384, 448, 512]),
        (100, [64, 100]),
        (1024, [128, 256, 384, 512, 640, 768, 896, 1024]),
        (40, [40]),
    ],
)
def test_buckets_are_at_most_8_multiples_of_64_and_the_max_length(max_length, buckets):
    assert bucket_lengths(max_length) == buckets
    assert all(len(bucket_lengths(n)) <= 8 for n in range(1, 5000))


def test_an_epoch_of_the_sample_at_384_trains_on_few_shapes_of_the_micro_batch(sample_train, tiny_model):
    """One epoch of the shipped sample at 384/128, grouped by length as training groups it, is fed in at most 8
    shapes under length buckets, every one of the micro batch (16). Fixed padding gives one, and padding each batch
    to its longest as many as the batches' longest features."""
    from bert_squad.config import WindowConfig
    from bert_squad.data import read_squad
    from bert_squad.features import build_features
    from bert_squad.model import load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    features = build_features(read_squad(sample_train), tokenizer, WindowConfig(384, 128, 64), None, train=True)
    lengths = feature_lengths(features)
    plan = BatchPlan(lengths, 16, 1, 0, seed=42)
    for padding, most in (("buckets", 8), ("max-length", 1), ("longest", None)):
        collate = Collator.for_training(tokenizer.pad_token_id, 384, padding)
        rows = features.select_columns(collate.columns(features))
        shapes = [tuple(collate([rows[i] for i in batch])["input_ids"].shape) for batch in plan.epoch(0)]
        assert {n for n, _ in shapes} == {16}, shapes
        if most:
            assert 1 <= len(set(shapes)) <= most, shapes
        else:  # each batch to its own longest feature: many shapes, no padding past the longest
            assert [s for _, s in shapes] == [int(lengths[batch].max()) for batch in plan.epoch(0)]
            assert len(set(shapes)) > 8


@pytest.mark.slow
def test_train_set_smaller_than_one_global_batch_trains(tiny_model, sample_train, tmp_path):
    doc = json.loads(sample_train.read_text())
    para = doc["data"][0]["paragraphs"][0]
    small = {"version": "1.1", "data": [{"title": "t", "paragraphs": [dict(para, qas=para["qas"][:2])]}]}
    train = tmp_path / "small.json"
    train.write_text(json.dumps(small))
    out = tmp_path / "out"
    r = run_bert_squad(*train_args(tiny_model, train, out, "--max-steps", 2, cache=tmp_path / "c", windows=[]))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fewer than one global batch of 16" in r.stdout
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == 2
