"""`bert-squad predict`: answers for a SQuAD JSON file whose questions need no answers (a test set, a user's
own corpus), written as the official submission expects: `predictions.json` maps each id to its answer.

It takes evaluation's path from the model to answers (`evaluate.predict` on every rank the launcher
started, post-processing on rank 0), so on a labelled file its predictions are `evaluate`'s byte for byte.
"""

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

from bert_squad import config
from bert_squad.config import PostprocessConfig
from bert_squad.data import read_squad
from bert_squad.evaluate import (
    Inference,
    Loaded,
    inference_from_args,
    on_every_rank,
    parser,
    predict,
    write_predictions,
)

if TYPE_CHECKING:  # the libraries load with the model and the features
    pass


class Prediction(NamedTuple):
    """`bert-squad predict`'s command line."""

    inference: Inference
    input: str
    postprocess: PostprocessConfig


def parse(argv: list[str]) -> Prediction:
    p = parser(
        "bert-squad predict",
        run.__doc__,
        lambda p: p.add_argument("--input", required=True, help="SQuAD JSON (v1.1 or v2.0 shape); answers optional"),
    )
    config.add_options(p, PostprocessConfig, without=("lang",))  # nothing is scored
    args = p.parse_args(argv)
    return Prediction(inference_from_args(args), args.input, config.from_args(PostprocessConfig, args))


def run(asked: Prediction) -> int:
    """`bert-squad predict`: predictions.json ({id: answer}), the n-best and, for a SQuAD 2.0 model,
    null_odds.json in --output-dir, on all ranks the launcher started."""
    job, path, postprocess = asked
    examples = read_squad(path, labelled=False)

    def task(file: Loaded) -> None:
        # "No answer" competes where the model was trained for it (train records this), else where the file is v2.0.
        version_2 = getattr(file.module.config, "version_2_with_negative", examples.version_2)
        asked = dataclasses.replace(examples, version_2=version_2)
        result = predict(file.module, asked, file.features, file.device, file.pad_id, postprocess, file.dist)
        if result is not None:
            write_predictions(job.output_dir, result)
            print(f"wrote predictions for {len(examples)} questions to {job.output_dir}")

    on_every_rank(job, [examples], task)
    return 0
