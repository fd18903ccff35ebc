"""The benchmarks run end to end (their figures are for people to read; nothing here times anything)."""

import json
import subprocess

import pytest
from helpers import PYTHON, ROOT

pytestmark = pytest.mark.slow


def throughput(*args):
    return subprocess.run([PYTHON, ROOT / "bench" / "throughput.py", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)


@pytest.mark.cpu
def test_throughput_compares_both_batchings_and_ends_in_json(tiny_model, sample_train, tmp_path):
    r = throughput("--model", tiny_model, "--train-file", sample_train, "--max-seq-length", 256, "--steps", 4,
                   "--cache-dir", tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["samples_per_second"] > 0 and result["fixed_padding_samples_per_second"] > 0
    assert result["speedup_vs_fixed_padding"] == pytest.approx(
        result["samples_per_second"] / result["fixed_padding_samples_per_second"])
    assert (result["device"], result["precision"], result["max_seq_length"]) == ("cpu", "fp32", 256)
    assert "--pad-to-max-length" in r.stdout and "project batching" in r.stdout and "fixed 256 padding" in r.stdout


def test_throughput_failing_run_is_one_line_not_a_traceback(tiny_model, sample_train, tmp_path):
    r = throughput("--model", tiny_model, "--train-file", sample_train, "--max-seq-length", 48, "--steps", 4,
                   "--cache-dir", tmp_path)
    assert r.returncode != 0
    assert "--max-seq-length 48 leaves no room for context" in r.stderr and "throughput: the grouped run failed" in r.stderr
    assert "Traceback" not in r.stderr


def test_random_bert_base_has_the_bert_base_shape(tiny_model, tmp_path):
    import importlib.util

    from transformers import AutoConfig

    spec = importlib.util.spec_from_file_location("throughput", ROOT / "bench" / "throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.random_bert_base(tiny_model, tmp_path / "bert-base-random")
    cfg = AutoConfig.from_pretrained(out)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size,
            cfg.max_position_embeddings) == (12, 768, 12, 3072, 512)
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()


def test_scaling_model_table():
    """bench/scaling.py's step-time model: more nodes never give fewer samples/s while each GPU keeps its
    batch; accumulation amortises an exposed all-reduce; at a fixed global batch the knee comes."""
    r = subprocess.run([PYTHON, ROOT / "bench" / "scaling.py", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    curves = {}
    for row in rows:
        curves.setdefault((row["system"], row["model"]), []).append(row)
    assert len(curves) == 4 and all([r["nodes"] for r in c] == [1, 2, 4, 8, 16, 32, 64] for c in curves.values())
    for (system, model), curve in curves.items():
        for column in ("no overlap", "no overlap, acc 4", "overlap", "ZeRO-2"):
            rates = [r[column] for r in curve]
            assert rates == sorted(rates) and len(set(rates)) == len(rates), (system, model, column, rates)
        last = curve[-1]
        assert last["no overlap, acc 4 efficiency"] > last["no overlap efficiency"], (system, model)
        # Overlap hides what it can; ZeRO-2's all-gather after the step it cannot.
        assert last["no overlap efficiency"] <= last["overlap efficiency"], (system, model)
        assert last["ZeRO-2 efficiency"] <= last["overlap efficiency"], (system, model)
        strong = [r["global 1024 efficiency"] for r in curve]
        assert strong == sorted(strong, reverse=True), (system, model, strong)
    # 64 LUMI nodes share 1024 samples as 2 per GCD: the all-reduce no longer hides behind the backward pass.
    assert curves["LUMI-G", "BERT-base"][-1]["global 1024 efficiency"] < 0.8


def test_checkpoint_costs_end_in_json(tiny_model, tmp_path):
    """One ZeRO-2 checkpoint on one rank: its write and CRC seconds from the marker, its conversion."""
    r = subprocess.run([PYTHON, ROOT / "bench" / "checkpoint_costs.py", "--model", tiny_model, "--configs",
                        "zero2_bf16", "--ranks", "1"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout.strip().splitlines()[-1])["rows"]
    assert row["config"] == "zero2_bf16" and row["checkpoint_mb"] > 0 and row["universal_mb"] > 0
    assert {"write_s", "crc_s", "convert_s"} <= row.keys()
