"""`bert-squad predict`: answers for a SQuAD JSON file whose questions need no answers (a test set, a user's
own corpus), written as the official submission expects: `predictions.json` maps each id to its answer.

It takes evaluation's path from the model to answers (`evaluate.predict` on every rank the launcher
started, post-processing on rank 0), so on a labelled file its predictions are `evaluate`'s byte for byte.
"""

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

import torch

from bert_squad import config
from bert_squad.config import PostprocessConfig
from bert_squad.data import Examples, read_squad
from bert_squad.distributed import DistEnv
from bert_squad.evaluate import Inference, inference_from_args, on_every_rank, parser, predict, write_predictions

if TYPE_CHECKING:  # the libraries load with the model and the features
    import datasets
    from transformers import PreTrainedModel


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

    def task(
        i: int,
        module: "PreTrainedModel",
        examples: Examples,
        features: "datasets.Dataset",
        device: torch.device,
        pad_id: int,
        dist: DistEnv,
    ) -> None:
        # "No answer" competes where the model was trained for it (train records this), else where the file is v2.0.
        version_2 = getattr(module.config, "version_2_with_negative", examples.version_2)
        result = predict(
            module, dataclasses.replace(examples, version_2=version_2), features, device, pad_id, postprocess, dist
        )
        if result is not None:
            write_predictions(job.output_dir, result)
            print(f"wrote predictions for {len(examples)} questions to {job.output_dir}")

    on_every_rank(job, [examples], task)
    return 0
