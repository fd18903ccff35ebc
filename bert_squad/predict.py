"""`bert-squad predict`: answers for a SQuAD JSON file whose questions need no answers (a test set, a user's
own corpus), written as the official submission expects: `predictions.json` maps each id to its answer.

It takes evaluation's path from the model to answers (`evaluate.predict` on every rank the launcher
started, post-processing on rank 0), so on a labelled file its predictions are `evaluate`'s byte for byte.
"""

import sys
from typing import Any, NamedTuple

from bert_squad import config, task
from bert_squad.config import PostprocessConfig
from bert_squad.data import read_squad
from bert_squad.evaluate import (
    Inference,
    Loaded,
    inference_from_args,
    on_every_rank,
    parser,
    plan_line,
    write_predictions,
)
from bert_squad.files import directory, readable


class Prediction(NamedTuple):
    """`bert-squad predict`'s command line."""

    inference: Inference
    input: str
    postprocess: dict[str, Any]  # the answer options given; the rest are the model's (`task.resolve`)


def parse(argv: list[str]) -> Prediction:
    p = parser(
        "bert-squad predict",
        run.__doc__,
        lambda p: p.add_argument("--input", required=True, help="SQuAD JSON (v1.1 or v2.0 shape); answers optional"),
    )
    config.add_options(p, PostprocessConfig, without=("lang",), unset=True)  # nothing is scored
    args = p.parse_args(argv)
    return Prediction(inference_from_args(args), args.input, config.given(PostprocessConfig, args))


def check(asked: Prediction) -> None:
    """What `run` reads and fills that needs no library, checked before any is loaded: the input, the model's
    directory, the output dir."""
    readable(asked.input, "a SQuAD JSON file")
    asked.inference.model_dir()
    directory(asked.inference.output_dir, "--output-dir ")


def run(asked: Prediction) -> int:
    """`bert-squad predict`: predictions.json ({id: answer}), the n-best and, for a SQuAD 2.0 model,
    null_odds.json in --output-dir, on all ranks the launcher started. Windows and answer rules not given are
    the model's (`task.resolve`)."""
    job, path, postprocess = asked
    examples = read_squad(path, labelled=False)
    model_dir = job.model_dir()
    settings = task.resolve(model_dir, job.windows, postprocess)

    def answer_file(file: Loaded) -> None:
        if file.dist.is_main:
            print(plan_line(file, settings), file=sys.stderr, flush=True)
        result = file.answers(settings)
        if result is not None:
            write_predictions(job.output_dir, result)
            print(f"wrote predictions for {len(examples)} questions to {job.output_dir}")

    on_every_rank(job, model_dir, settings.windows, [examples], answer_file)
    return 0
