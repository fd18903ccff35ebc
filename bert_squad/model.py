"""Model and tokenizer: resolved from a local directory or the project cache, never from the network
at run time; exported in Hugging Face format so `pipeline("question-answering", model=dir)` loads it.
"""

import os
import shutil
from pathlib import Path

from bert_squad import cache
from bert_squad.errors import UserError

OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


def go_offline():
    """Everything comes from local files now: stop the HF libraries from trying the network."""
    for var in OFFLINE_VARS:
        os.environ[var] = "1"


def load_tokenizer(model_dir):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as err:
        raise UserError(f"{model_dir}: cannot load a tokenizer ({str(err).splitlines()[0]})") from None
    if not tok.is_fast:
        raise UserError(f"{model_dir}: needs a fast tokenizer (tokenizer.json) for offset mappings")
    if tok.padding_side != "right":
        raise UserError(f"{model_dir}: tokenizer pads on the left; SQuAD windows assume right padding")
    return tok


def load_qa_model(model_dir):
    """A question-answering model; an encoder checkpoint gets a new span head (that is fine-tuning)."""
    import transformers
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    try:
        config = AutoConfig.from_pretrained(str(model_dir))
    except (OSError, ValueError) as err:
        raise UserError(f"{model_dir}: not a model directory ({str(err).splitlines()[0]})") from None
    # Loading an encoder into a QA head is expected; don't alarm users with the "newly initialized" warning.
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        return AutoModelForQuestionAnswering.from_pretrained(str(model_dir), config=config,
                                                             attn_implementation="sdpa")
    except ValueError:
        return AutoModelForQuestionAnswering.from_pretrained(str(model_dir), config=config)
    except OSError as err:
        raise UserError(f"{model_dir}: cannot load model weights ({str(err).splitlines()[0]})") from None
    finally:
        transformers.logging.set_verbosity(verbosity)


def gathered_state_dict(engine):
    """The whole model's weights on rank 0 (None elsewhere under ZeRO-3); every rank must call it.

    Under ZeRO-3 each rank holds a slice of every parameter and `state_dict()` returns empty tensors;
    DeepSpeed gathers them layer by layer onto rank 0 (whatever stage3_gather_16bit_weights_on_model_save
    says: the export always needs them)."""
    if engine.zero_optimization_partition_weights():
        return engine._zero3_consolidated_16bit_state_dict()
    return engine.module.state_dict()


def export(module, state, tokenizer, out_dir):
    """Write model (fp32 safetensors of `state`) and tokenizer beside each other, each file replaced atomically."""
    out_dir = Path(out_dir)
    tmp = out_dir / f".export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    state = {k: v.detach().float().cpu().contiguous() for k, v in state.items()}
    module.save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    for f in tmp.iterdir():
        os.replace(f, out_dir / f.name)
    tmp.rmdir()


def download(name, cache_dir):
    """Fetch model and tokenizer from the hub into the cache (login node)."""
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    target = cache.model_dir(cache_dir, name)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    hub_cache = str(Path(cache_dir) / "hub")
    AutoTokenizer.from_pretrained(name, cache_dir=hub_cache).save_pretrained(str(tmp))
    AutoModelForQuestionAnswering.from_pretrained(name, cache_dir=hub_cache).save_pretrained(str(tmp))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target
