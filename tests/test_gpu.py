"""The GPU tier: what only a CUDA or ROCm GPU runs (fp16, the NCCL/RCCL backend, one GPU per rank). Every
test here is marked `gpu` and skips with the reason on a CPU host; on a GPU host run it alone with

    python -m pytest -m gpu tests/

It needs neither mpirun nor Slurm: one process, or one per GPU (two at most) started by hand with the
variables the job script gives its ranks.
"""

import json
import math
import os
import re

import pytest
from helpers import PYTHON, ROOT, gpu_count, ranks_by_hand, run_bert_squad, skip_for_hardware, train_args

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _visible_gpus_variable():
    """The variable a rank narrows to its own GPU: ROCR_VISIBLE_DEVICES on ROCm, CUDA_VISIBLE_DEVICES else."""
    import torch

    return "ROCR_VISIBLE_DEVICES" if torch.version.hip else "CUDA_VISIBLE_DEVICES"


@pytest.mark.parametrize("config", ["ds_fp16", "ds_bf16", "ds_zero2"])
def test_one_gpu_trains_evaluates_and_exports(config, tiny_model, sample_train, sample_dev, tmp_path):
    """The shipped GPU configs (fp16 with its loss scaler, bf16, ZeRO-2 in fp16) on one GPU through NCCL:
    losses finite, the run's precision and device recorded, predictions for every question, an export that
    loads and answers."""
    import torch

    from bert_squad.answer import Answerer

    if config == "ds_bf16" and not torch.cuda.is_bf16_supported():
        skip_for_hardware(f"{torch.cuda.get_device_name(0)} has no bf16")
    out = tmp_path / "out"
    steps = ["--eval-file", sample_dev, "--deepspeed_config", config, "--max-steps", 6, "--learning-rate", "1e-3"]
    r = run_bert_squad(*train_args(tiny_model, sample_train, out, *steps, "--log-every", 1, cache=tmp_path / "cache"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"^rank 0/1 .* device cuda:0 backend nccl ", r.stdout, re.M), r.stdout[:2000]
    losses = [float(x) for x in re.findall(r"^step \d+/6 loss (\S+)", r.stdout, re.M)]
    assert len(losses) == 6 and all(map(math.isfinite, losses)), losses
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["precision"] == ("bf16" if config == "ds_bf16" else "fp16")
    assert metrics["engine"]["optimizer"] == "torch.optim.adamw.AdamW"  # torch's: no DeepSpeed op built here
    assert metrics["device"] == torch.cuda.get_device_name(0) and metrics["peak_memory_gib"] > 0
    assert (
        len(json.loads((out / "predictions.json").read_text()))
        == json.loads((out / "eval_metrics.json").read_text())["questions"]
    )
    context = "Ada Novak was born in Lugano in 1834. She studied physics at the university."
    [best] = Answerer.from_pretrained(out, device="cuda").answer("Where was Ada Novak born?", context)
    assert best.text and context[best.start : best.end] == best.text


def test_the_config_is_checked_for_the_gpu_the_run_is_for():
    """torch's AdamW takes capturable=True on a GPU, and DeepSpeed's fp16 weights run there: what a CPU run refuses
    in one line (tests/test_dsconfig.py) a GPU run takes, the optimizer built and stepped on the rank's GPU."""
    import torch

    from bert_squad import dsconfig

    adamw = {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "fused": True, "capturable": True}}
    for name in ("ds_fp32", "ds_zero2"):
        cfg = dict(dsconfig.load(name), optimizer=adamw)
        assert dsconfig.settings(cfg, name, world_size=1, device=torch.device("cuda", 0)).needs == ()


def test_each_rank_binds_its_own_gpu_from_the_visible_list(tiny_model, sample_train, tmp_path):
    """The job script's rank command (RANK_SH in slurm/job.sh) narrows CUDA_VISIBLE_DEVICES (ROCm:
    ROCR_VISIBLE_DEVICES) to the rank's own GPU, so each rank sees one device, cuda:0, and NCCL gets one
    GPU per rank. Ranks: one per GPU here, two at most; started by hand as srun would."""
    template = (ROOT / "slurm" / "job.sh").read_text()
    rank_sh = re.search(r"^RANK_SH='(.*?)'$", template, re.M | re.S).group(1)
    variable, ranks = _visible_gpus_variable(), min(2, gpu_count())
    visible = os.environ.get(variable) or ",".join(map(str, range(gpu_count())))
    out = tmp_path / "out"
    steps = ["--deepspeed_config", "ds_bf16", "--max-steps", 3, "--no-eval"]
    train = train_args(tiny_model, sample_train, out, *steps, cache=tmp_path / "cache")
    common = {
        "BERT_SQUAD_GPU_ENV": variable,
        variable: visible,
        "BERT_SQUAD_REPO": str(ROOT),
        "PATH": f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}",
    }

    def as_srun_starts(rank, ranks, port):  # srun's variables: the job script's rank command derives the rest
        slurm = {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NTASKS": str(ranks)}
        return {**common, **slurm, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}

    rank_cmd = ["bash", "-c", rank_sh, "bert-squad-rank", *train]
    with ranks_by_hand(rank_cmd, tmp_path, ranks, env_of=as_srun_starts) as started:
        assert [proc.wait(timeout=600) for proc in started] == [0] * ranks, [proc.seen() for proc in started]
        for rank, proc in enumerate(started):
            assert re.search(
                rf"^rank {rank}/{ranks} .* local_rank {rank} device cuda:0 backend nccl ", proc.stdout, re.M
            ), proc.seen()
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == ranks and len(set(metrics["weights_sha256_per_rank"])) == 1
