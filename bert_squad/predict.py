"""`bert-squad predict`: answers for a SQuAD JSON file whose questions need no answers (a test set, a user's
own corpus), written as the official submission expects: `predictions.json` maps each id to its answer.

It takes evaluation's path from the model to answers (`evaluate.predict` on every rank the launcher
started, post-processing on rank 0), so on a labelled file its predictions are `evaluate`'s byte for byte.
"""

import dataclasses

from bert_squad import config
from bert_squad.data import read_squad
from bert_squad.evaluate import on_every_rank, parser, predict, write_predictions


def parse(argv):
    p = parser("bert-squad predict", run.__doc__,
               lambda p: p.add_argument("--input", required=True,
                                        help="SQuAD JSON (v1.1 or v2.0 shape); answers optional"))
    config.add_options(p, config.PostprocessConfig, without=("lang",))  # nothing is scored
    p.add_argument("--debug", action="store_true")
    args = p.parse_args(argv)
    return args, config.from_args(config.WindowConfig, args), config.from_args(config.PostprocessConfig, args)


def run(parsed):
    """`bert-squad predict`: predictions.json ({id: answer}), the n-best and, for a SQuAD 2.0 model,
    null_odds.json in --output-dir, on all ranks the launcher started."""
    args, windows, postprocess = parsed
    examples = read_squad(args.input, labelled=False)

    def task(i, module, examples, features, device, pad_id, dist):
        # "No answer" competes where the model was trained for it (train records this), else where the file is v2.0.
        version_2 = getattr(module.config, "version_2_with_negative", examples.version_2)
        result = predict(module, dataclasses.replace(examples, version_2=version_2), features, device, pad_id,
                         postprocess, dist)
        if result is not None:
            write_predictions(args.output_dir, result)
            print(f"wrote predictions for {len(examples)} questions to {args.output_dir}")

    on_every_rank(args, windows, [examples], task)
    return 0
