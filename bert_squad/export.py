"""`bert-squad export --checkpoint DIR --output-dir OUT`: the Hugging Face model of any checkpoint.

A run killed before its end leaves only DeepSpeed checkpoints, which no Hugging Face tool opens. This
writes, from one of them, the export a finished run writes (safetensors, the config with the QA head,
the tokenizer), in one process on a CPU, whatever ZeRO stage and number of ranks wrote it. Each
checkpoint holds the model's config and tokenizer itself (`hf/`), so neither the model directory the
run started from (a hub cache may have been purged, or be on another machine) nor the ranks are needed.

The weights are the fp32 ones the run would have exported at that step: under ZeRO (stages 1-3) the
optimizer's fp32 partitions, which DeepSpeed's zero_to_fp32 gathers (`mp_rank_00_model_states.pt` holds the
16-bit copy the model computed with, where a 16-bit section made one); at stage 0 the whole model in
`mp_rank_00_model_states.pt`, fp32 where the run kept fp32 weights (fp32, or torch autocast).
"""

import contextlib
import io
from pathlib import Path
from typing import NamedTuple

import torch

from bert_squad import checkpoint, config, model, task
from bert_squad.errors import UserError
from bert_squad.files import writable_directory

WHOLE_MODEL = "mp_rank_00_model_states.pt"  # DeepSpeed's file of the whole model, ZeRO stages 0-2


class Export(NamedTuple):
    """`bert-squad export`'s command line."""

    checkpoint: str  # a checkpoint, or a run's checkpoints directory for its latest
    output_dir: str


def parse(argv: list[str]) -> Export:
    p = config.ArgumentParser(prog="bert-squad export", description=run.__doc__)
    p.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint (<output-dir>/checkpoints/step<N>), or <output-dir>/checkpoints for its latest",
    )
    p.add_argument("--output-dir", required=True, help="where the model and tokenizer go")
    args = p.parse_args(argv)
    return Export(args.checkpoint, args.output_dir)


def run(asked: Export) -> int:
    """`bert-squad export`: write the Hugging Face model of a checkpoint."""
    found = checkpoint.intact_at(asked.checkpoint)
    hf = found.path / checkpoint.HF_DIR
    if not (hf / "config.json").is_file():
        raise UserError(
            f"{found.path}: holds no model config and tokenizer ({checkpoint.HF_DIR}/): written by an "
            f"older bert-squad; resume it with --resume and let the run finish to export it"
        )
    tokenizer = model.load_tokenizer(hf)
    module = model.empty_qa_model(hf)
    state = weights(found)
    missing = sorted(set(module.state_dict()) - set(state))
    if missing:
        raise UserError(f"{found.path}: its weights lack {missing[0]} of the model its config describes")
    writable_directory(asked.output_dir, "--output-dir ")
    model.export(module, state, tokenizer, task.recorded(hf), Path(asked.output_dir))
    print(f"exported {found.path} to {asked.output_dir}")
    return 0


def weights(found: checkpoint.Resumable) -> dict[str, torch.Tensor]:
    """The model's fp32 weights at the checkpoint (see the module's docstring), on the CPU."""
    path = found.path
    if not found.layout.sharded:
        return torch.load(path / WHOLE_MODEL, map_location="cpu", weights_only=False)["module"]
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # heavy: ZeRO only

    with contextlib.redirect_stdout(io.StringIO()):  # it prints what it reads
        return get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
