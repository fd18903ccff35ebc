"""The benchmarks run end to end (their figures are for people to read; nothing here times anything)."""

import importlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, run_in_checkout

pytestmark = [pytest.mark.slow, pytest.mark.bench]


def bench(script, *args, timeout=600):
    """bench/`script` run with `args` to its end from the checkout, its output captured as text."""
    return run_in_checkout(PYTHON, ROOT / "bench" / script, *args, timeout=timeout)


def throughput(model, train_file, max_seq_length, cache_dir):
    """bench/throughput.py's two 4-step runs of `model` at `max_seq_length` tokens."""
    args = ["--model", model, "--train-file", train_file, "--max-seq-length", max_seq_length]
    return bench("throughput.py", *args, "--steps", 4, "--cache-dir", cache_dir)


@pytest.mark.cpu
def test_throughput_compares_both_batchings_and_ends_in_json(tiny_model, sample_train, tmp_path):
    r = throughput(tiny_model, sample_train, 256, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["samples_per_second"] > 0 and result["fixed_padding_samples_per_second"] > 0
    assert result["speedup_vs_fixed_padding"] == pytest.approx(
        result["samples_per_second"] / result["fixed_padding_samples_per_second"]
    )
    assert (result["device"], result["precision"], result["max_seq_length"]) == ("cpu", "fp32", 256)
    assert result["padding"] == "longest"  # the project's default on a CPU
    assert "--padding max-length" in r.stdout and "project batching" in r.stdout and "fixed 256 padding" in r.stdout
    share = result["real_token_share"]  # a length bucket holds each batch's longest, the maximum every bucket
    assert 0 < share["max_length"] <= share["bucket"] <= share["longest"] <= 1, share


def test_throughput_failing_run_is_one_line_not_a_traceback(tiny_model, sample_train, tmp_path):
    r = throughput(tiny_model, sample_train, 48, tmp_path)
    assert r.returncode != 0
    assert (
        "--max-seq-length 48 leaves no room for context" in r.stderr
        and "throughput: the grouped run failed" in r.stderr
    )
    assert "Traceback" not in r.stderr


@pytest.mark.cpu
def test_vs_trainer_sets_the_projects_default_beside_the_trainer_at_its_best(tiny_model, sample_train, tmp_path):
    """One command, both sides: the project naming no config or padding (the CPU's choices), the Trainer grouped by
    length in bf16 where this CPU computes bf16 faster than fp32 (the project's rule, timed by each side), each
    with its rates and peak memory."""
    from bert_squad import choices, perf

    args = ["--model", tiny_model, "--train-file", sample_train, "--steps", 4, "--log-every", 2, "--seq", 128]
    r = bench("vs_trainer.py", *args, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    project, trainer = json.loads(r.stdout.strip().splitlines()[-1])
    assert (project["run"], project["padding"], trainer["run"], trainer["steps"]) == (
        "project",
        "longest",
        "trainer",
        4,
    )
    speedup = perf.bf16_speedup() if choices.cpu_computes("bf16", choices.this_cpuinfo()) else 0
    if not 0.8 < speedup < 1.25:  # nearer 1, three timings (this one, each side's) may fall either way
        assert project["precision"] == trainer["precision"] == ("bf16" if speedup > 1 else "fp32"), speedup
    assert all(
        side["median_window_samples_per_second"] > 0 and side["peak_memory_gib"] > 0 for side in (project, trainer)
    )
    assert "the project trains " in r.stdout and "x the Trainer's samples/s" in r.stdout


def test_random_bert_base_has_the_bert_base_shape(tiny_model, tmp_path):
    import importlib.util

    from transformers import AutoConfig

    spec = importlib.util.spec_from_file_location("throughput", ROOT / "bench" / "throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.random_bert_base(tiny_model, tmp_path / "bert-base-random")
    cfg = AutoConfig.from_pretrained(out)
    assert (
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.intermediate_size,
        cfg.max_position_embeddings,
    ) == (12, 768, 12, 3072, 512)
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()


def test_scaling_model_table():
    """bench/scaling.py's step-time model: more nodes never give fewer samples/s while each GPU keeps its
    batch; accumulation amortises an exposed all-reduce; at a fixed global batch the knee comes."""
    r = bench("scaling.py", "--json", timeout=60)
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
    r = bench("checkpoint_costs.py", "--model", tiny_model, "--configs", "zero2_bf16", "--ranks", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = json.loads(r.stdout.strip().splitlines()[-1])["rows"]
    assert row["config"] == "zero2_bf16" and row["checkpoint_mb"] > 0 and row["universal_mb"] > 0
    assert {"write_s", "crc_s", "convert_s"} <= row.keys()


def test_preprocessing_bench_compares_worker_counts_and_ends_in_json(tiny_model, sample_train):
    argv = [
        "--train-file",
        sample_train,
        "--model",
        tiny_model,
        "--questions",
        1200,
        "--workers",
        1,
        3,
        "--max-seq-length",
        128,
    ]
    r = bench("preprocessing.py", *argv)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["questions"] >= 1200 and set(result["questions_per_second"]) == {"1", "3"}
    rates = result["questions_per_second"]
    assert result["speedup"]["3"] == pytest.approx(rates["3"] / rates["1"]) and result["one_process_all_cores"] > 0
    cores = result["cores"]
    assert "  1 workers on all cores" in r.stdout and f"  3 workers on {min(3, cores)} core(s)" in r.stdout


@pytest.mark.mpi
def test_memory_bench_gives_each_phase_a_row_per_rank_count(tiny_model, sample_train, sample_dev):
    """bench/memory.py at the scale of the sample files: a row per phase and rank count, a peak for every rank
    and one for the node, all positive."""
    argv = ["--train-file", sample_train, "--eval-file", sample_dev, "--model", tiny_model, "--max-steps", 1]
    argv += ["--train-questions", 1, "--eval-questions", 1, "--ranks", 1, 2]
    r = bench("memory.py", *argv, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])["rows"]
    assert [(row["phase"], row["ranks"]) for row in rows] == [("train", 1), ("train", 2), ("eval", 1), ("eval", 2)]
    for row in rows:
        assert len(row["rank_peak_rss_mib"]) == row["ranks"] and min(row["rank_peak_rss_mib"]) > 0, row
        assert row["node_pss_mib"] > 0 and row["questions"] > 0, row
    assert len(r.stdout.strip().splitlines()) == 1 + len(rows) + 1  # the header, a line a row, the JSON


def test_gpu_kit_holds_what_the_gpu_host_lacks_and_resolves_there(tmp_path):
    """`make gpu-kit` (needs PyPI): against the H100 host's own package list (bench/gpu_host.txt), the wheels an
    offline CPython 3.12 host with its own torch and transformers lacks, DeepSpeed built into a pure-Python wheel,
    the project's own; what the host holds at a version the requirements accept (pyarrow 25.0.1 for datasets'
    pyarrow>=24, tqdm, fsspec, rich) stays out, so the kit keeps within 16 MiB; without one of its wheels the
    project cannot resolve."""
    gpu_kit = bench_module("gpu_kit")
    kit = tmp_path / "gpu-kit"
    r = bench("gpu_kit.py", "--out", kit)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    wheels = {w.name.split("-")[0]: w.name for w in kit.glob("*.whl")}
    assert {"bert_squad", "deepspeed", "datasets", "python_hostlist", "pydantic_core", "dill"} <= wheels.keys(), wheels
    assert not {"pyarrow", "tqdm", "fsspec", "rich", "torch", "transformers", "numpy", "tokenizers"} & wheels.keys()
    assert wheels["deepspeed"].endswith("-py3-none-any.whl") and "cp312" in wheels["pydantic_core"]
    assert (kit / "tokenizer" / "tokenizer.json").exists()
    assert gpu_kit.KIT_MAX_MIB == 16
    assert sum(f.stat().st_size for f in kit.rglob("*") if f.is_file()) <= gpu_kit.KIT_MAX_MIB * 2**20
    assert re.search(r"MiB \(with the checkout's [\d.]+ MiB: (\d+\.\d)\)", r.stdout)
    assert "--no-index" in r.stdout and "resolves for CPython 3.12" in r.stdout
    assert "torch==2.11.0  (host)" in r.stdout and "pyarrow==25.0.1  (host)" in r.stdout
    assert "deepspeed==" in r.stdout and "pandas==3.0.6  (host)" in r.stdout
    padding = kit / "tokenizer" / "padding.bin"
    padding.write_bytes(b"\0" * (gpu_kit.KIT_MAX_MIB * 2**20))  # past 16 MiB, far from the 64 of the runner
    r = bench("gpu_kit.py", "--check", kit)
    assert r.returncode != 0 and "within 16 MiB" in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    padding.unlink()
    (kit / wheels["datasets"]).unlink()
    r = bench("gpu_kit.py", "--check", kit)
    assert r.returncode != 0 and "the kit does not resolve for the host" in r.stderr and "datasets" in r.stderr


def bench_module(name):
    """A script of bench/ as a module (they import each other by name, from bench/)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def project_wheel(kit):
    built = subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", kit, ROOT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    return kit


def section_lines(lines):
    """The section names of gpu_check's result lines (`[   12 s] install: ok (...)`), in order."""
    return [m[1] for m in (re.match(r"\[ *\d+ s\] (\S+): ", line) for line in lines) if m]


@pytest.mark.cpu
def test_gpu_check_plans_the_host_the_trainer_and_the_compiled_rows_first_within_its_budget(tmp_path):
    """--dry-run on this CPU plans a GPU call by the sections' estimates: install, the host, the Trainer, then the
    two compiled goal rows, all within the budget; with --only, the host and the Trainer still run."""
    r = bench("gpu_check.py", "--dry-run", "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr[-3000:]
    planned = [line.split()[0] for line in r.stdout.splitlines() if line.split()[-1:] == ["runs"]]
    assert planned[:5] == ["install", "host", "hf-trainer", "ds_bf16-compile", "ds_bf16-fixed-384-compile"]
    spent, budget = map(int, re.search(r"^(\d+) s of the (\d+) s budget$", r.stdout, re.M).groups())
    assert spent <= budget == 570 and not (tmp_path / "out").exists()
    r = bench("gpu_check.py", "--dry-run", "--out", tmp_path / "out", "--only", "ds_zero3")
    planned = [line.split()[0] for line in r.stdout.splitlines() if line.split()[-1:] == ["runs"]]
    assert planned == ["install", "host", "hf-trainer", "ds_zero3"]


def test_gpu_check_reads_each_gpu_of_nvidia_smi(tmp_path):
    """nvidia-smi's CSV as an H100 host printed it: a {field: value} a GPU, units kept."""
    gpu_check = bench_module("gpu_check")
    text = (
        "name, memory.total [MiB], driver_version, clocks.max.sm [MHz]\n"
        "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04, 1980 MHz\n"
    )
    assert gpu_check.read_smi(text) == [
        {
            "name": "NVIDIA H100 80GB HBM3",
            "memory.total [MiB]": "81559 MiB",
            "driver_version": "580.159.04",
            "clocks.max.sm [MHz]": "1980 MHz",
        }
    ]
    assert gpu_check.read_smi(text + text.splitlines()[1]) == gpu_check.read_smi(text) * 2
    assert gpu_check.read_smi("") == []


def test_gpu_check_runs_every_section_in_tiny_mode(tmp_path):
    """bench/gpu_check.py end to end on a CPU with tiny shapes, from a kit of the project's wheel alone (built
    offline): each section's line printed as it ends (the first while the rest still runs), the table last;
    three files, none deeper than the host's runner brings back; the sections in their order (the Trainer peer,
    the two goal rows, the gpu tier right after them, then the rest); a row per shipped config and for --tf32
    (DeepSpeed's fp16 section refused here with the project's reason) recording the optimizer the engine built,
    its skipped steps, its precision path, its window and its ratio to the Trainer row; the fp32 losses of two
    runs compared; the gpu tier run."""
    kit, out = project_wheel(tmp_path / "kit"), tmp_path / "out"
    proc = subprocess.Popen(
        [PYTHON, ROOT / "bench" / "gpu_check.py", "--out", out, "--kit", kit, "--tiny"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if section_lines(lines) == ["install"]:  # read while the process runs: it had printed no more
                assert proc.poll() is None and list(json.loads((out / "gpu_check.json").read_text())["sections"]) == [
                    "install"
                ]
        assert proc.wait(timeout=900) == 0, "\n".join(lines[-60:])
    finally:
        proc.kill()
    result = json.loads((out / "gpu_check.json").read_text())
    sections = result["sections"]
    assert (
        section_lines(lines)
        == list(sections)
        == [
            "install",
            "host",
            "hf-trainer",
            "ds_bf16-compile",
            "ds_bf16-fixed-128-compile",
            "ds_bf16",
            "ds_bf16-fixed-128",
            "gpu-tests",
            "correctness",
            "ds_fp16",
            "ds_zero2",
            "ds_fp32",
            "ds_fp32-tf32",
            "ds_zero3",
        ]
    )
    table_at = lines.index(f"# bench/gpu_check.py on cpu: tiny mode, {result['seconds']:.0f} s")
    assert table_at > max(i for i, line in enumerate(lines) if section_lines([line]))
    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert sorted(map(str, files)) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    assert all(len(f.parts) <= 3 and re.fullmatch(r"[A-Za-z0-9._-]+", f.name) for f in files)
    install = sections["install"]
    assert result["mode"] == "tiny" and (install["status"], install["wheels"], install["unmet"]) == ("ok", 1, [])
    assert result["host_packages"]["torch"].startswith("2.") and install["host_packages"] > 10
    assert "gpu-check-" in result["versions"]["bert_squad_from"]  # the kit's copy, not the checkout
    rows = {row["run"]: row for row in result["rows"]}
    configs = sorted(p.stem for p in (ROOT / "bert_squad" / "configs").glob("*.json"))
    assert set(rows) == {"hf-trainer", *configs, "ds_bf16-fixed-128", "ds_fp32-tf32"}
    assert_tiny_rows(rows)
    loss = sections["correctness"]
    assert loss["status"] == "ok" and loss["devices"] == {"device": "cpu", "cpu": "cpu"}
    assert len(loss["losses"]["device"]) == loss["steps"] == 4 and loss["max_relative_difference"] <= loss["tolerance"]
    assert sections["gpu-tests"]["status"] == "skipped" and sections["gpu-tests"]["counts"]["skipped"] >= 1
    assert sections["ds_bf16-fixed-128-compile"]["status"] == sections["ds_bf16-compile"]["status"] == "skipped"
    machine = sections["host"]  # this CPU: its model, its cores, and its time per tiny op
    assert machine["status"] == "ok" and machine["cpu"] and machine["cores"] >= machine["cores_usable"] >= 1
    assert machine["launch_device"] == "cpu" and machine["launch_us"] > 0
    table = (out / "gpu_check.md").read_text()
    assert "| samples/s | x Trainer |" in table and "- correctness: ok" in table and "\nhost: " in table
    assert all(f"| {name} | {row['config']} |" in table for name, row in rows.items())
    assert all(f"| {row['x_trainer']:.2f}x |" in table for row in rows.values() if row["status"] == "ok")
    log = (out / "gpu_check.log").read_text()
    ran = ("pip list", "install", "probe", "hf-trainer", "ds_fp32", "fp32-on-cpu", "gpu-tests")
    assert all(f"===== {name}: $" in log for name in ran)
    assert re.search(r"===== ds_fp32-tf32: \$ .* --tf32$", log, re.M) and "hf_trainer.py" in log


def assert_tiny_rows(rows):
    """The rows of a tiny gpu_check on a CPU: the Trainer's set up as run_qa.py sets it up (fixed padding, bf16
    autocast, torch's fused AdamW in Accelerate's wrapper); the project's autocast configs run, DeepSpeed's
    fp16 section is refused; each measured row's samples/s over the Trainer's is its ratio."""
    peer = rows["hf-trainer"]
    assert peer["status"] == "ok" and peer["batching"] == "fixed 128" and peer["x_trainer"] == 1.0, peer
    assert peer["precision_path"] == "bf16: AdamW in AcceleratedOptimizer under bfloat16 autocast", peer
    for name in ("ds_bf16", "ds_bf16-fixed-128", "ds_fp16", "ds_fp32", "ds_fp32-tf32"):
        row = rows[name]
        assert row["status"] == "ok" and row["samples_per_second"] > 0, row
        assert row["optimizer"] == "torch.optim.adamw.AdamW", row
        # fp16's loss scale starts at 2^16: a first step may overflow and be skipped (counted); no other path skips
        assert row["skipped_steps"] == 0 or (name == "ds_fp16" and row["skipped_steps"] <= 2), row
        assert row["window"]["of"] == len(row["window"]["samples_per_second_per_window"]) - 1 >= 1, row
        assert row["x_trainer"] == pytest.approx(row["samples_per_second"] / peer["samples_per_second"]), row
    assert rows["ds_bf16"]["precision_path"] == "bf16: AdamW under bfloat16 autocast"
    assert rows["ds_fp16"]["precision_path"] == "fp16: AdamW under float16 autocast"
    assert (rows["ds_fp32-tf32"]["config"], rows["ds_fp32-tf32"]["precision_path"]) == ("ds_fp32 --tf32", "fp32: AdamW")
    assert rows["ds_bf16-fixed-128"]["batching"] == "fixed 128" and rows["ds_bf16"]["batching"] == "project"
    for name in ("ds_zero2", "ds_zero3"):
        row = rows[name]
        assert row["status"] == "skipped" and "fp16.enabled needs a GPU" in row["why"] and row["x_trainer"] is None


def test_the_trainer_peer_refuses_bad_input_in_one_line(tiny_model, sample_train, tmp_path):
    """bench/hf_trainer.py, the peer row's script: no model folder, a length with no room for context (the
    project's own check, as its rows get it), a missing data file: one line each, exit 1, no traceback."""
    cases = {
        ("--model", tmp_path, "--train-file", sample_train): f"hf_trainer: {tmp_path} is no model folder",
        ("--model", tiny_model, "--train-file", sample_train, "--max-seq-length", 40): (
            "hf_trainer: --max-seq-length 40 leaves no room for context"
        ),
        ("--model", tiny_model, "--train-file", tmp_path / "none.json"): f"hf_trainer: {tmp_path / 'none.json'}",
    }
    for args, line in cases.items():
        r = bench("hf_trainer.py", "--out", tmp_path / "out", *args, timeout=300)
        assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(line), r.stderr[-2000:]
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_gpu_check_stops_after_install_when_the_hosts_versions_fall_short(tmp_path):
    """A host whose packages miss a requirement of the kit's (here the project's rich floor, the host's list
    read from a file: this environment's own `pip list` with rich 12): the install section fails naming it,
    and nothing else is started."""
    rich = re.search(r"^\s*(rich>=\S+)", (ROOT / "setup.cfg").read_text(), flags=re.M).group(1)
    freeze = subprocess.run(
        [PYTHON, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, timeout=120
    ).stdout
    host = tmp_path / "host.txt"
    host.write_text(re.sub(r"^rich==\S+$", "rich==12.6.0", freeze, flags=re.M))
    assert "rich==12.6.0" in host.read_text()
    out = tmp_path / "out"
    r = bench("gpu_check.py", "--out", out, "--kit", project_wheel(tmp_path / "kit"), "--tiny", "--host-packages", host)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((out / "gpu_check.json").read_text())
    install = result["sections"].pop("install")
    assert install["status"] == "failed" and install["unmet"] == [f"bert_squad needs {rich}, finds 12.6.0"]
    assert result["rows"] == [] and {s["status"] for s in result["sections"].values()} == {"not run"}
    assert f"install: failed (the host's versions fall short: bert_squad needs {rich}, finds 12.6.0)" in r.stdout
    assert section_lines(r.stdout.splitlines())[1:] == list(result["sections"])


def test_a_cut_section_leaves_no_process_and_a_later_one_that_cannot_fit_is_not_started(tmp_path):
    """gpu_check's budget, for real: a command still running when it runs out is stopped with everything it
    started (a grandchild included), and a section whose estimate no longer fits is recorded as not run."""
    gpu_check = bench_module("gpu_check")
    check = gpu_check.Check(tmp_path / "out", "tiny", tmp_path, budget=5)
    pid_file = tmp_path / "grandchild.pid"
    spawn = (
        f"import subprocess, time; p = subprocess.Popen(['sleep', '300']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)"
    )
    code, text = check.call("sleeper", [PYTHON, "-c", spawn])
    assert code == 124 and "the 5 s budget of bench/gpu_check.py ran out" in text
    grandchild = Path("/proc") / pid_file.read_text()
    for _ in range(50):  # killed; gone, or a zombie until init reaps it
        if not grandchild.exists() or (grandchild / "stat").read_text().split(") ")[1][0] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"{grandchild} still runs: {(grandchild / 'stat').read_text()}")
    check.section("late", 60, lambda: pytest.fail("a section that cannot fit was started"))
    assert check.result["sections"]["late"]["status"] == "not run"


def test_the_shipped_steps_cost_the_host_what_a_plain_torch_step_does(tmp_path):
    """bench/step_cost.py counts the aten ops, host reads and device synchronizes of the project's real training
    steps on BERT-base's structure (199 parameter tensors): ds_bf16 and ds_fp32 dispatch at most 10 % more ops
    than the hand-written torch step of their precision, read from the device at most once a step, and never
    wait for its whole queue."""
    out = tmp_path / "rows.json"
    r = bench("step_cost.py", "ds_bf16", "ds_fp32", "--json", out, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {row["run"]: row for row in json.loads(out.read_text())}
    assert rows.keys() == {"plain torch, bf16", "plain torch, fp32", "ds_bf16", "ds_fp32"}
    for name in ("ds_bf16", "ds_fp32"):
        assert rows[name]["x_floor"] <= 1.10 and rows[name]["host_reads"] <= 1, rows[name]
        assert rows[name]["synchronizes"] == 0, rows[name]
    assert rows["plain torch, bf16"]["ops"] > 1000  # a whole step of twelve layers was counted


@pytest.mark.cpu  # two ranks on one host: its CPU
def test_stop_checks_counts_the_looks_of_a_stopped_run(tiny_model, sample_train):
    args = ["--model", tiny_model, "--train-file", sample_train, "--signal-at-step", "3", "--max-seq-length", "64"]
    r = bench("stop_checks.py", *args, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["steps"] > 3 and result["reduction_steps"][-1] == result["steps"]
    assert result["reductions"] == len(result["reduction_steps"]) and result["reductions"] <= result["steps"]
    assert f"{result['steps']} steps, {result['reductions']} reductions" in r.stdout


def test_ctrl_c_times_the_second_one_and_the_run_ends_by_it(tiny_model, sample_train):
    r = bench("ctrl_c.py", "--model", tiny_model, "--train-file", sample_train)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["returncode"] == -2 and result["seconds"] > 0
    assert f"second Ctrl-C to the end of the run: {result['seconds']:.3f} s (exit -2)" in r.stdout


def test_long_context_bench_trains_full_windows_at_each_length_and_ends_in_json(tmp_path):
    """bench/long_context.py on a tiny EuroBERT (8,192 positions, the project's span head): a row per length,
    each from full windows of that length, in its own process; a length past the positions is one line."""
    from tiny_models import build_tiny_model

    model = build_tiny_model("eurobert", tmp_path / "eurobert")
    long_context = ("long_context.py", "--model", model, "--steps", 1)
    r = bench(*long_context, "--lengths", "512", "8192", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["max_seq_length"] for row in result["rows"]] == [512, 8192] and result["device"] in ("cpu", "cuda")
    for row in result["rows"]:
        assert row["features"] == 1 and row["tokens_per_feature"] == row["max_seq_length"]
        assert row["features_per_second"] > 0 and row["built_features_per_second"] > 0
        assert row["tokens_per_second"] == pytest.approx(row["features_per_second"] * row["max_seq_length"])
        assert row["peak_memory_gib"] >= row["memory_before_steps_gib"] > 0
    assert "length  features/s" in r.stdout and "Token indices sequence length" not in r.stderr
    r = bench(*long_context, "--lengths", "8193")
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        f"long_context: --max-seq-length 8193: {model} takes at most 8192 tokens (its max_position_embeddings)"
    )
