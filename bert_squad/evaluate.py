"""Evaluation: logits on every rank's share of the eval features, post-processing once on rank 0.

Eval features are sorted by length and cut into the same batches whatever the world size; rank r
runs batches r, r + W, ... So each batch has the same shape and content as in a single-process run,
and the gathered predictions are byte-identical to it. Every rank runs the same number of forward
passes (a rank out of batches repeats the shortest one and drops its output): under ZeRO-3 each
forward gathers the parameters from all ranks, so a rank that stopped early would hang the others.
"""

import json
from pathlib import Path

import torch

from bert_squad import cache, config, distributed, model, outputs
from bert_squad.batching import Collator
from bert_squad.data import read_squad
from bert_squad.features import build_features, check_tokenizer
from bert_squad.files import writable_directory, write_json_atomic
from bert_squad.metrics import score
from bert_squad.postprocess import postprocess_predictions
from bert_squad.squad import to_articles

EVAL_BATCH = 64


def predict_logits(module, features, device, pad_id, dist=None, batch_size=EVAL_BATCH):
    """Start/end logits per feature (trimmed to its length), complete on rank 0, None elsewhere."""
    rank, world = (dist.rank, dist.world_size) if dist else (0, 1)
    lengths = [len(ids) for ids in features["input_ids"]]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    collate = Collator(pad_id, labels=False)
    inputs = features.select_columns(collate.columns(features))
    was_training = module.training
    module.eval()
    mine = {}
    rounds = -(-len(batches) // world)
    with torch.no_grad():
        for i in range(rank, rounds * world, world):
            b = batches[min(i, len(batches) - 1)]  # past the end: a dummy pass whose output is dropped
            cols = inputs[b]
            rows = [dict(zip(cols, values)) for values in zip(*cols.values())]
            batch = {k: v.to(device, non_blocking=True) for k, v in collate(rows).items()}
            out = module(**batch)
            start, end = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            if i >= len(batches):
                continue
            for j, f in enumerate(b):
                mine[f] = (start[j, :lengths[f]], end[j, :lengths[f]])
    module.train(was_training)
    parts = distributed.gather_to_rank0(mine, dist) if dist else [mine]
    if parts is None:
        return None
    merged = {i: v for part in parts for i, v in part.items()}
    return [merged[i][0] for i in range(len(lengths))], [merged[i][1] for i in range(len(lengths))]


def predict(module, examples, features, device, pad_id, postprocess, dist=None):
    """`(predictions, nbest, null_odds)` for `examples` on rank 0 (None elsewhere); `postprocess` is a
    `config.PostprocessConfig`. The one path from a model to answers: evaluation and answering share it."""
    logits = predict_logits(module, features, device, pad_id, dist)
    if logits is None:
        return None
    meta = features.select_columns(["example_id", "offset_mapping"]).to_list()
    return postprocess_predictions(
        examples.records, meta, *logits, version_2_with_negative=examples.version_2,
        max_answer_length=postprocess.max_answer_length,
        null_score_diff_threshold=postprocess.null_score_diff_threshold)


def evaluate(module, examples, features, device, pad_id, postprocess, dist, output_dir=None):
    """Metrics on rank 0 (None elsewhere); with `output_dir`, also the prediction files."""
    result = predict(module, examples, features, device, pad_id, postprocess, dist)
    if result is None:
        return None
    predictions, nbest, null_odds = result
    metrics = score(to_articles(examples.records, examples.version_2), predictions, na_probs=null_odds)
    if output_dir is not None:
        out = Path(output_dir)
        write_json_atomic(out / outputs.PREDICTIONS, predictions)
        write_json_atomic(out / outputs.NBEST, nbest)
        if null_odds is not None:
            write_json_atomic(out / outputs.NULL_ODDS, null_odds)
        write_json_atomic(out / outputs.EVAL_METRICS, dict(metrics, eval_file=examples.source,
                                                           questions=len(examples)))
    return metrics


def parse(argv):
    p = config.ArgumentParser(prog="bert-squad evaluate", description=run.__doc__)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--eval-file", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--cache-dir", default=None)
    config.add_options(p, config.WindowConfig)
    config.add_options(p, config.PostprocessConfig)
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    return args, config.from_args(config.WindowConfig, args), config.from_args(config.PostprocessConfig, args)


def run(parsed):
    """`bert-squad evaluate`: score a saved model on an eval file, on all ranks the launcher started."""
    args, windows, postprocess = parsed
    cache_dir = cache.resolve_cache_dir(args.cache_dir)
    model_dir = cache.find_model(args.model_dir, cache_dir)
    examples = read_squad(args.eval_file)
    tokenizer = model.load_tokenizer(model_dir)
    check_tokenizer(tokenizer, examples.records[0], windows)
    module = model.load_qa_model(model_dir)
    writable_directory(args.output_dir, "--output-dir ")
    dist = distributed.detect()
    with distributed.process_group(dist) as device:
        module.to(device)
        features = build_features(examples, tokenizer, windows, cache_dir, train=False, dist=dist)
        metrics = evaluate(module, examples, features, device, tokenizer.pad_token_id, postprocess, dist,
                           output_dir=args.output_dir)
    if metrics is not None:
        print(json.dumps(metrics))
    return 0
