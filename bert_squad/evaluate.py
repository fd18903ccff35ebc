"""Evaluation: logits on every rank's share of the eval features, post-processing once on rank 0.

Eval features are sorted by length and cut into the same batches whatever the world size; rank r
runs batches r, r + W, ... So each batch has the same shape and content as in a single-process run,
and the gathered predictions are byte-identical to it. Every rank runs the same number of forward
passes (a rank out of batches repeats the shortest one and drops its output): under ZeRO-3 each
forward gathers the parameters from all ranks, so a rank that stopped early would hang the others.
"""

import argparse
import contextlib
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import numpy as np

from bert_squad import cache, config, model, outputs, runtime, task
from bert_squad.config import ModelConfig, PostprocessConfig, PreprocessConfig, SpeedConfig, WindowConfig
from bert_squad.data import Examples, read_squad
from bert_squad.errors import UserError
from bert_squad.features import build_features, check_tokenizer
from bert_squad.files import PathLike, directory, readable, writable_directory, write_json_atomic
from bert_squad.metrics import score
from bert_squad.postprocess import Predictions, postprocess_predictions
from bert_squad.squad import to_articles

if TYPE_CHECKING:  # the libraries load with the model and the features, after the command's inputs are checked
    import datasets
    import torch
    from transformers import PreTrainedModel

    from bert_squad import report
    from bert_squad.distributed import DistEnv

EVAL_BATCH = SpeedConfig.per_device_eval_batch_size  # the option's default, for the `Answerer`


def predict_logits(
    module: "PreTrainedModel",
    features: "datasets.Dataset",
    device: "torch.device",
    pad_id: int,
    dist: Optional["DistEnv"] = None,
    batch_size: int = EVAL_BATCH,
    autocast: Optional["torch.dtype"] = None,
    display: Optional["report.Display"] = None,
) -> Optional[tuple[list[np.ndarray], list[np.ndarray]]]:
    """Start/end logits per feature (trimmed to its length), complete on rank 0, None elsewhere; the forward
    under `autocast` to that dtype where given (a training run's evaluation on a GPU: `train.eval_autocast`);
    with a `display`, rank 0 shows its progress there (`report.InferenceProgress`)."""
    import torch  # heavy: loaded with the model, after the command's inputs are checked

    from bert_squad import distributed, report
    from bert_squad.batching import feature_lengths

    rank, world = (dist.rank, dist.world_size) if dist else (0, 1)
    lengths = feature_lengths(features)
    # Longest first, ties in feature order: the same batches whatever the world size.
    order = np.argsort(-lengths, kind="stable").tolist()
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    # Rank r runs batches r, r + W, ...: so every rank knows which features, in which order, each rank's
    # logits hold, and nothing but the logits needs to travel.
    shares = [np.array([f for b in batches[r::world] for f in b], dtype=np.int64) for r in range(world)]
    widths = [int(lengths[share].sum()) for share in shares]
    rounds = -(-len(batches) // world)  # every rank's forward passes (see the module's docstring)
    progress = report.InferenceProgress(rounds, rank == 0 and display is not None, display or report.Display())
    with torch.autocast(device.type, dtype=autocast) if autocast else contextlib.nullcontext(), progress:
        mine = _forward(module, features, device, pad_id, batches, rank, world, lengths, widths[rank], progress)
    mine = torch.from_numpy(mine)
    parts = distributed.gather_padded_to_rank0(mine, widths, dist) if dist else [mine]
    if parts is None:
        return None
    # Rank r's logits lie end to end in its share's order: each feature's are the next lengths[f] of them.
    start_logits: list[np.ndarray] = [np.empty(0, np.float32)] * len(lengths)
    end_logits = list(start_logits)
    for part, share in zip(parts, shares):
        logits, stops = part.numpy(), np.cumsum(lengths[share]).tolist()
        for f, stop in zip(share.tolist(), stops):
            start_logits[f], end_logits[f] = logits[:, stop - lengths[f] : stop]  # views, not copies
    return start_logits, end_logits


def _forward(
    module: "PreTrainedModel",
    features: "datasets.Dataset",
    device: "torch.device",
    pad_id: int,
    batches: list[list[int]],
    rank: int,
    world: int,
    lengths: np.ndarray,
    width: int,
    progress: "report.InferenceProgress",
) -> np.ndarray:
    """This rank's batches through the model: its features' start logits (row 0) and end logits (row 1),
    each trimmed to the feature's length and laid end to end in the order they ran (`width` in all). Every rank
    runs the same number of forward passes (see the module's docstring)."""
    import torch  # heavy: loaded with the model, after the command's inputs are checked

    from bert_squad.batching import Collator

    collate = Collator(pad_id, labels=False)
    inputs = features.select_columns(collate.columns(features))
    mine = np.empty((2, width), dtype=np.float32)
    at, was_training, rounds = 0, module.training, -(-len(batches) // world)
    module.eval()
    with torch.no_grad():
        for i in range(rank, rounds * world, world):
            b = batches[min(i, len(batches) - 1)]  # past the end: a dummy pass whose output is dropped
            cols = inputs[b]
            rows = [dict(zip(cols, values)) for values in zip(*cols.values())]
            batch = {k: v.to(device, non_blocking=True) for k, v in collate(rows).items()}
            out = module(**batch)
            start, end = out.start_logits.float().cpu().numpy(), out.end_logits.float().cpu().numpy()
            progress.advance()
            if i >= len(batches):
                continue
            for j, f in enumerate(b):
                mine[:, at : at + lengths[f]] = start[j, : lengths[f]], end[j, : lengths[f]]
                at += lengths[f]
    module.train(was_training)
    return mine


def predict(
    module: "PreTrainedModel",
    examples: Examples,
    features: "datasets.Dataset",
    device: "torch.device",
    pad_id: int,
    postprocess: PostprocessConfig,
    dist: Optional["DistEnv"] = None,
    autocast: Optional["torch.dtype"] = None,
    display: Optional["report.Display"] = None,
    batch_size: int = EVAL_BATCH,
) -> Optional[Predictions]:
    """The answers to `examples` on rank 0 (None elsewhere). The one path from a model to answers: evaluation
    and answering share it. `display`: where rank 0 shows the forward passes' progress (None: nowhere);
    `batch_size`: the features one forward pass takes."""
    logits = predict_logits(module, features, device, pad_id, dist, batch_size, autocast, display)
    if logits is None:
        return None
    meta = features.select_columns(["example_id", "offset_mapping"]).to_list()
    return postprocess_predictions(
        examples.records,
        meta,
        *logits,
        version_2_with_negative=examples.version_2,
        max_answer_length=postprocess.max_answer_length,
        n_best_size=postprocess.n_best_size,
        null_score_diff_threshold=postprocess.null_score_diff_threshold,
    )


def write_predictions(output_dir: PathLike, result: Predictions) -> None:
    """The prediction files of `predict`'s result: what evaluation and `bert-squad predict` both write."""
    predictions, nbest, null_odds = result
    out = Path(output_dir)
    write_json_atomic(out / outputs.PREDICTIONS, predictions)
    write_json_atomic(out / outputs.NBEST, nbest)
    if null_odds is not None:
        write_json_atomic(out / outputs.NULL_ODDS, null_odds)


def score_predictions(
    result: Optional[Predictions], examples: Examples, lang: Optional[str], output_dir: Optional[PathLike] = None
) -> Optional[dict[str, Any]]:
    """The metrics of `predict`'s answers to `examples`, scored with `lang`'s rules: on rank 0, the one whose
    `result` is not None (None elsewhere). With `output_dir`, also the prediction files and the metrics."""
    if result is None:
        return None
    predictions, _, null_odds = result
    # A v2.0 model's null odds on a v1.1 file are written, not scored: v1.1's metrics have no threshold to search.
    na_probs = null_odds if examples.version_2 else None
    metrics = score(to_articles(examples.records, examples.version_2), predictions, na_probs=na_probs, lang=lang)
    if output_dir is not None:
        write_predictions(output_dir, result)
        write_json_atomic(
            Path(output_dir) / outputs.EVAL_METRICS, dict(metrics, eval_file=examples.source, questions=len(examples))
        )
    return metrics


@dataclass(frozen=True)
class Inference:
    """What `evaluate` and `predict` share: the model, the window options given (the rest come from the model's
    task settings: `task.resolve`), how features are built, and where the files go."""

    model: ModelConfig
    windows: dict[str, Any]
    preprocess: PreprocessConfig
    output_dir: str
    batch_size: int  # --per-device-eval-batch-size
    debug: bool = False  # --debug: DeepSpeed's info logging where ranks meet through it (`on_every_rank`)

    def model_dir(self) -> Path:
        """The model's directory: the given one, or a hub name's snapshot in the cache."""
        return cache.find_model(self.model.model_dir, cache.resolve_cache_dir(self.model.cache_dir))


class Evaluation(NamedTuple):
    """`bert-squad evaluate`'s command line."""

    inference: Inference
    eval_files: list[str]
    postprocess: list[dict[str, Any]]  # the answer options given, one for each eval file (each its --lang)


def parser(
    prog: str, description: Optional[str], inputs: Callable[[argparse.ArgumentParser], Any]
) -> config.ArgumentParser:
    """The options `evaluate` and `predict` share; `inputs` adds the command's own input option. The window
    options default to the model's (`task.resolve`)."""
    p = config.ArgumentParser(prog=prog, description=description)
    config.add_options(p, ModelConfig)
    inputs(p)
    p.add_argument("--output-dir", required=True, help="where the predictions (and their metrics) go")
    config.add_options(p, WindowConfig, unset=True)
    config.add_options(p, PreprocessConfig)
    config.add_options(p, SpeedConfig, only=("per_device_eval_batch_size",))
    return p


def inference_from_args(args: argparse.Namespace) -> Inference:
    """The shared options of `parser`'s namespace, as their groups (their checks run here)."""
    return Inference(
        config.from_args(ModelConfig, args),
        config.given(WindowConfig, args),
        config.from_args(PreprocessConfig, args),
        args.output_dir,
        config.from_args(SpeedConfig, args).per_device_eval_batch_size,
        args.debug,
    )


def parse(argv: list[str]) -> Evaluation:
    p = parser(
        "bert-squad evaluate",
        run.__doc__,
        lambda p: p.add_argument(
            "--eval-file", required=True, nargs="+", help="SQuAD JSON; several: a row for each and their mean"
        ),
    )
    config.add_options(p, PostprocessConfig, several=("lang",), unset=True)
    args = p.parse_args(argv)
    given = config.given(PostprocessConfig, args)
    langs = given.pop("lang", [None])
    if len(langs) not in (1, len(args.eval_file)):
        raise UserError(f"--lang: give one language, or one for each of the {len(args.eval_file)} --eval-file")
    each = [{**given, **({"lang": lang} if lang else {})} for lang in langs * (len(args.eval_file) // len(langs))]
    return Evaluation(inference_from_args(args), args.eval_file, each)


class Loaded(NamedTuple):
    """One file's questions made ready on this rank: what a task runs the model over."""

    position: int  # the file's place among the command's files
    module: "PreTrainedModel"
    examples: Examples
    features: "datasets.Dataset"
    device: "torch.device"
    pad_id: int
    dist: "DistEnv"
    batch_size: int

    def answers(self, settings: task.Settings) -> Optional[Predictions]:
        """`predict` over this file's features with `settings`' answer rules, progress shown, "no answer" competing
        where `settings.no_answer` says for this file: the answers to its examples on rank 0, None elsewhere."""
        from bert_squad import report  # loads torch: with the model, after the command's inputs are checked

        asked = dataclasses.replace(self.examples, version_2=settings.no_answer(self.examples.version_2))
        return predict(
            self.module,
            asked,
            self.features,
            self.device,
            self.pad_id,
            settings.postprocess,
            self.dist,
            display=report.Display(),
            batch_size=self.batch_size,
        )


FileWork = Callable[[Loaded], Any]  # what runs on every rank for each file


def on_every_rank(
    job: Inference, model_dir: Path, windows: WindowConfig, files: Sequence[Examples], work: FileWork
) -> list[Any]:
    """Load the model in `model_dir` (`Inference.model_dir`), then on every rank the launcher started build the
    features of each file's examples in `windows` and run `work`: the results, in file order. Several ranks meet
    in DeepSpeed's process group (set up as a command sets it up, `runtime.prepare_deepspeed`); one process loads
    no DeepSpeed and starts no group."""
    from bert_squad import distributed  # torch's: loaded with the model, after the command's inputs are checked

    cache_dir = cache.resolve_cache_dir(job.model.cache_dir)
    tokenizer = model.load_tokenizer(model_dir)
    for examples in files:
        check_tokenizer(tokenizer, examples.records[0], windows)
    module = model.load_qa_model(model_dir)
    model.check_window(module, windows.max_seq_length, model_dir)
    writable_directory(job.output_dir, "--output-dir ")
    dist = distributed.detect()
    if dist.world_size > 1:
        runtime.prepare_deepspeed(job.debug)
    results = []
    with distributed.process_group(dist) if dist.world_size > 1 else distributed.alone() as device:
        module.to(device)
        for i, examples in enumerate(files):
            workers = job.preprocess.preprocessing_workers
            features = build_features(examples, tokenizer, windows, cache_dir, train=False, dist=dist, workers=workers)
            loaded = Loaded(i, module, examples, features, device, tokenizer.pad_token_id, dist, job.batch_size)
            results.append(work(loaded))
    return results


def plan_line(file: Loaded, settings: task.Settings) -> str:
    """What a file's inference is about to do: its questions, their windows and the answer rules, and where
    each setting came from."""
    examples = file.examples
    no_answer = settings.no_answer_text(examples.version_2)
    return f"{examples.source}: {len(examples)} questions, {len(file.features)} features; {settings.line}; {no_answer}"


def output_dirs(output_dir: PathLike, paths: Sequence[PathLike]) -> list[Path]:
    """Where each eval file's predictions go: --output-dir itself for one file, a folder named after each
    file (its name without .json) for several."""
    if len(paths) == 1:
        return [Path(output_dir)]
    names = [Path(p).stem for p in paths]
    if len(set(names)) < len(names):
        raise UserError(
            f"--eval-file: two files named {next(n for n in names if names.count(n) > 1)}.json: "
            f"their predictions would share one folder of --output-dir"
        )
    return [Path(output_dir) / name for name in names]


def check(asked: Evaluation) -> None:
    """What `run` reads and fills that needs no library, checked before any is loaded: the eval files, the
    model's directory, the output dir."""
    for path in asked.eval_files:
        readable(path, "a SQuAD JSON file")
    asked.inference.model_dir()
    directory(asked.inference.output_dir, "--output-dir ")


def run(asked: Evaluation) -> int:
    """`bert-squad evaluate`: score a saved model on one or more eval files, on all ranks the launcher started.
    Windows and answer rules not given are the model's (`task.resolve`)."""
    job, eval_files, postprocess = asked
    outs = output_dirs(job.output_dir, eval_files)
    files = [read_squad(path) for path in eval_files]
    model_dir = job.model_dir()
    settings = [task.resolve(model_dir, job.windows, given) for given in postprocess]

    def score_file(file: Loaded) -> Optional[dict[str, Any]]:
        out, chosen = outs[file.position], settings[file.position]
        if file.dist.is_main:
            out.mkdir(parents=True, exist_ok=True)
            print(plan_line(file, chosen), file=sys.stderr, flush=True)
        result = file.answers(chosen)
        return score_predictions(result, file.examples, chosen.postprocess.lang, output_dir=out)

    results = on_every_rank(job, model_dir, settings[0].windows, files, score_file)
    if results[0] is None:  # not rank 0
        return 0
    if len(files) > 1:
        print(table(eval_files, [s.postprocess.lang for s in settings], results))
    print(
        json.dumps(results[0] if len(files) == 1 else {"files": dict(zip(eval_files, results)), "mean": mean(results)})
    )
    return 0


def _exact(result: dict[str, Any]) -> float:
    """Exact match, as v1.1 (exact_match) or v2.0 (exact) names it."""
    return result["exact_match"] if "exact_match" in result else result["exact"]


def mean(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The mean exact match and F1 over several eval files' metrics."""
    return {"exact_match": sum(map(_exact, results)) / len(results), "f1": sum(r["f1"] for r in results) / len(results)}


def table(paths: Sequence[PathLike], langs: Sequence[Optional[str]], results: Sequence[dict[str, Any]]) -> str:
    """A row per eval file, then their mean: the cross-lingual table."""
    rows = [(str(p), lang or "squad", r) for p, lang, r in zip(paths, langs, results)] + [("mean", "", mean(results))]
    width = max(len(p) for p, _, _ in rows)
    lines = [f"{'eval file':<{width}}  {'lang':<5}  {'EM':>6}  {'F1':>6}"]
    lines += [f"{p:<{width}}  {lang:<5}  {_exact(r):6.2f}  {r['f1']:6.2f}" for p, lang, r in rows]
    return "\n".join(lines)
