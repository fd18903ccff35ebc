"""The benchmarks run end to end (their figures are for people to read; nothing here times anything)."""

import json
import subprocess

import pytest
from helpers import PYTHON, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.bench]


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


def test_preprocessing_bench_compares_worker_counts_and_ends_in_json(tiny_model, sample_train):
    argv = ["--train-file", sample_train, "--model", tiny_model, "--questions", 1200, "--workers", 1, 3,
            "--max-seq-length", 128]
    r = subprocess.run([PYTHON, ROOT / "bench" / "preprocessing.py", *map(str, argv)], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["questions"] >= 1200 and set(result["questions_per_second"]) == {"1", "3"}
    rates = result["questions_per_second"]
    assert result["speedup"]["3"] == pytest.approx(rates["3"] / rates["1"]) and result["one_process_all_cores"] > 0
    cores = result["cores"]
    assert "  1 workers on all cores" in r.stdout and f"  3 workers on {min(3, cores)} core(s)" in r.stdout


def test_gpu_kit_holds_what_the_gpu_host_lacks_and_resolves_there(tmp_path):
    """`make gpu-kit` (needs PyPI): the wheels an offline CPython 3.12 host with its own torch and transformers
    lacks, DeepSpeed built into a pure-Python wheel, the project's own; without one of them it cannot resolve."""
    kit = tmp_path / "gpu-kit"
    r = subprocess.run([PYTHON, ROOT / "bench" / "gpu_kit.py", "--out", kit], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    wheels = {w.name.split("-")[0]: w.name for w in kit.glob("*.whl")}
    assert {"bert_squad", "deepspeed", "datasets", "python_hostlist", "pydantic_core"} <= wheels.keys(), wheels
    assert not {"torch", "transformers", "numpy", "tokenizers"} & wheels.keys(), wheels
    assert wheels["deepspeed"].endswith("-py3-none-any.whl") and "cp312" in wheels["pydantic_core"]
    assert (kit / "tokenizer" / "tokenizer.json").exists()
    assert sum(f.stat().st_size for f in kit.rglob("*") if f.is_file()) < 64 * 2**20
    assert "--no-index" in r.stdout and "resolves for CPython 3.12" in r.stdout
    assert "torch==2.11.0  (host)" in r.stdout and "deepspeed==" in r.stdout
    (kit / wheels["datasets"]).unlink()
    r = subprocess.run([PYTHON, ROOT / "bench" / "gpu_kit.py", "--check", kit], capture_output=True, text=True,
                       cwd=ROOT, timeout=600)
    assert r.returncode != 0 and "the kit does not resolve for the host" in r.stderr and "datasets" in r.stderr


@pytest.mark.cpu
def test_gpu_check_runs_every_section_in_tiny_mode(tmp_path):
    """bench/gpu_check.py end to end on a CPU with tiny shapes, from a kit of the project's wheel alone (built
    offline): installed and imported from the kit's folder, a row per shipped config (fp16 ones refused here
    with the project's reason), fixed padding, the fp32 losses of two runs compared, the gpu tier run."""
    kit, out = tmp_path / "kit", tmp_path / "out"
    built = subprocess.run([PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", kit, ROOT],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    r = subprocess.run([PYTHON, ROOT / "bench" / "gpu_check.py", "--out", out, "--kit", kit, "--tiny"],
                       capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    sections = result["sections"]
    install = sections["install"]
    assert result["mode"] == "tiny" and (install["status"], install["wheels"], install["unmet"]) == ("ok", 1, [])
    assert "gpu-check-" in result["versions"]["bert_squad_from"]  # the kit's copy, not the checkout
    rows = {row["run"]: row for row in result["rows"]}
    configs = sorted(p.stem for p in (ROOT / "bert_squad" / "configs").glob("*.json"))
    assert set(rows) == {*configs, "ds_bf16-fixed-128"}
    for name in ("ds_fp32", "ds_bf16", "ds_bf16-fixed-128"):
        assert rows[name]["status"] == "ok" and rows[name]["samples_per_second"] > 0, rows[name]
    assert rows["ds_bf16-fixed-128"]["batching"] == "fixed 128" and rows["ds_bf16"]["batching"] == "project"
    assert all(rows[c]["status"] == "skipped" and "fp16.enabled needs a GPU" in rows[c]["why"]
               for c in ("ds_fp16", "ds_zero2", "ds_zero3"))
    loss = sections["correctness"]
    assert loss["status"] == "ok" and loss["devices"] == {"device": "cpu", "cpu": "cpu"}
    assert len(loss["losses"]["device"]) == loss["steps"] == 4 and loss["max_relative_difference"] <= loss["tolerance"]
    assert sections["gpu tests"]["status"] == "skipped" and sections["gpu tests"]["counts"]["skipped"] >= 1
    assert sections["compile"]["status"] == "skipped" and sections["throughput"]["status"] == "ok"
    table = (out / "gpu_check.md").read_text()
    assert all(f"| {name} |" in table for name in rows) and "- correctness: ok" in table
    logs = {p.name for p in (out / "logs").iterdir()}
    assert {"ds_fp32.log", "fp32-on-cpu.log", "gpu-tests.log", "install.log"} <= logs


def test_long_context_bench_trains_full_windows_at_each_length_and_ends_in_json(tmp_path):
    """bench/long_context.py on a tiny EuroBERT (8,192 positions, the project's span head): a row per length,
    each from full windows of that length, in its own process; a length past the positions is one line."""
    from tiny_models import build_tiny_model

    model = build_tiny_model("eurobert", tmp_path / "eurobert")
    bench = [PYTHON, ROOT / "bench" / "long_context.py", "--model", model, "--steps", 1]
    r = subprocess.run([*map(str, bench), "--lengths", "512", "8192"], capture_output=True, text=True, cwd=ROOT,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["max_seq_length"] for row in result["rows"]] == [512, 8192] and result["device"] in ("cpu", "cuda")
    for row in result["rows"]:
        assert row["features"] == 1 and row["tokens_per_feature"] == row["max_seq_length"]
        assert row["features_per_second"] > 0 and row["built_features_per_second"] > 0
        assert row["tokens_per_second"] == pytest.approx(row["features_per_second"] * row["max_seq_length"])
        assert row["peak_memory_gib"] >= row["memory_before_steps_gib"] > 0
    assert "length  features/s" in r.stdout and "Token indices sequence length" not in r.stderr
    r = subprocess.run([*map(str, bench), "--lengths", "8193"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        f"long_context: --max-seq-length 8193: {model} takes at most 8192 tokens (its max_position_embeddings)")
