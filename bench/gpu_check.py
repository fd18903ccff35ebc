#!/usr/bin/env python
"""Everything the project measures on a GPU host, in one command of under 10 minutes that needs nothing but
the checkout and the wheel kit beside it (`make gpu-kit` -> gpu-kit/; docs/performance.md):

    python3 bench/gpu_check.py --out DIR            # on a CUDA host
    python bench/gpu_check.py --out DIR --tiny      # tiny shapes, the same plumbing (the test suite, on a CPU)

1. install: the kit's wheels into a folder of their own (pip --no-index --no-deps --target), first on
   PYTHONPATH from then on; every requirement of what it installed is checked against what the host holds
   (bench/gpu_kit.py's `unmet`), and the project and its libraries import from there.
2. throughput: every shipped config (bert_squad/configs) for a fixed number of optimizer steps of BERT-base
   with random weights (bench/throughput.py's model, BERT's vocabulary from the kit) on the shipped sample at
   384 tokens, stride 128, with the project's batching; ds_bf16 again with fixed 384 padding. samples/s,
   tokens/s, TFLOP/s and MFU over the second half of the steps (the project's own meter), peak memory.
3. correctness: the shipped sample trained in fp32 (a small BERT without dropout, the same weights, order and
   fixed padding) on the device and on this host's CPU: every step's loss agrees within LOSS_RTOL.
4. gpu tests: the `gpu` test tier (tests/test_gpu.py).
5. compile: ds_bf16 with --compile, against the row without it.

Each section is written as it ends (ok, failed or skipped, and why) to DIR/gpu_check.json and
DIR/gpu_check.md, so a kill leaves what was done; each command's output is in DIR/logs/. Exit 1 when a
section failed. Tiny mode (the default where torch sees no GPU): a 2-layer model, 128 tokens, 4 steps, no
--compile (minutes of C++ builds on a CPU); a config the project refuses on this host (fp16 on a CPU) is
skipped with the project's reason.
"""

import argparse
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gpu_kit
import throughput

ROOT = throughput.ROOT
CONFIGS = sorted(p.stem for p in (ROOT / "bert_squad" / "configs").glob("*.json"))
SAMPLE = ROOT / "bert_squad" / "sample" / "train-v1.1.json"
BUDGET_S = 570  # the GPU host allows 10 minutes a command; this leaves 30 s to bring the files back
LOSS_RTOL = 1e-3  # fp32 on a GPU and on a CPU differ by rounding only; the log prints the loss to 4 decimals
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)
# Per mode: the measured model's shape (BertConfig fields), the correctness model's, tokens per window, steps.
MODES = {"gpu": dict(model={}, small=dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                                          intermediate_size=1024), seq=384, steps=100, loss_steps=8),
         "tiny": dict(model=TINY, small=TINY, seq=128, steps=4, loss_steps=4)}
VERSIONS = ("import json, platform, torch, transformers, deepspeed, datasets, hostlist, bert_squad; "
            "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, "
            "'cuda': torch.version.cuda, 'transformers': transformers.__version__, "
            "'deepspeed': deepspeed.__version__, 'datasets': datasets.__version__, 'bert_squad_from': "
            "bert_squad.__file__, 'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}))")


class Check:
    """The run's results so far, written out after every section; its commands, each logged to a file."""

    def __init__(self, out, mode, work):
        self.out, self.logs, self.mode, self.work = out, out / "logs", mode, work
        self.logs.mkdir(parents=True, exist_ok=True)
        self.started, self.env = time.monotonic(), dict(os.environ)
        self.result = {"mode": mode, "budget_s": BUDGET_S, "versions": {}, "sections": {}, "rows": []}

    def call(self, name, cmd, env=None, cwd=ROOT):
        """(exit code, output) of one command, its output kept in logs/<name>.log; 124 when the budget ran out."""
        log = self.logs / f"{name}.log"
        with open(log, "w") as f:
            print("$", *cmd, file=f, flush=True)
            try:
                code = subprocess.run(list(map(str, cmd)), stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                                      env=dict(self.env, **(env or {})), timeout=max(self.left(), 1)).returncode
            except subprocess.TimeoutExpired:
                print(f"stopped: the {BUDGET_S} s budget of bench/gpu_check.py ran out", file=f)
                code = 124
        return code, log.read_text(errors="replace")

    def left(self):
        return BUDGET_S - (time.monotonic() - self.started)

    def record(self, name, status, **info):
        self.result["sections"][name] = dict(status=status, **info)
        self.save()

    def save(self):
        self.result["seconds"] = round(time.monotonic() - self.started, 1)
        files = {"gpu_check.json": json.dumps(self.result, indent=2), "gpu_check.md": markdown(self.result)}
        for name, text in files.items():
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text + "\n")
            tmp.replace(self.out / name)


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def install(check, kit, site):
    """The kit's wheels into `site`, first on the path of every later command; requirements and imports checked."""
    wheels = sorted(Path(kit).glob("*.whl"))
    if wheels:
        code, text = check.call("install", [sys.executable, "-m", "pip", "install", "-q", "--no-index",
                                            "--no-deps", "--target", site, *wheels])
        if code:
            return check.record("install", "failed", why=last_line(text))
        check.env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    unmet = gpu_kit.unmet(site) if wheels else []
    code, text = check.call("versions", [sys.executable, "-c", VERSIONS], cwd=site)
    if code == 0:
        check.result["versions"] = json.loads(text.strip().splitlines()[-1])
    status = "failed" if unmet or code else "ok" if wheels else "skipped"
    check.record("install", status, wheels=len(wheels), unmet=unmet,
                 why=last_line(text) if code else None if wheels else f"no wheels in {kit}: this environment is used",
                 summary=f"{len(wheels)} wheels from {kit}")


def train(check, name, args, fixed=False, extra=(), log_every=None, env=None):
    """One training run of bench/throughput.py's command: (its train_metrics.json or None, output, exit code).
    Its output folder (the exported model) goes once read."""
    out = check.work / name
    code, text = check.call(name, throughput.command(args, out, fixed, log_every) + list(extra), env=env)
    metrics = None if code else json.loads((out / "train_metrics.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return metrics, text, code


def measure(check, section, variants, args):
    """Rows of the table: one training run each, figures over the second half of its steps."""
    for name, config, fixed, extra in variants:
        run_args = argparse.Namespace(**{**vars(args), "deepspeed_config": config})
        metrics, text, code = train(check, name, run_args, fixed, extra)
        row = dict(run=name, config=config, batching=f"fixed {args.max_seq_length}" if fixed else "project",
                   compile="--compile" in extra)
        if metrics:
            rates = metrics["last_log"]
            row.update(status="ok", device=metrics["device"], precision=metrics["precision"],
                       batch=metrics["train_batch_size"], peak_memory_gib=metrics["peak_memory_gib"],
                       **{k: rates[k] for k in ("samples_per_second", "tokens_per_second", "tflops_per_device",
                                                "mfu")})
        else:  # the project refuses what this host cannot run (exit 2, one line): a skip in tiny mode
            row.update(status="skipped" if code == 2 and check.mode == "tiny" else "failed", why=last_line(text))
        check.result["rows"].append(row)
        check.save()
    rows = [r for r in check.result["rows"] if r["run"] in {v[0] for v in variants}]
    check.record(section, "failed" if any(r["status"] == "failed" for r in rows) else "ok", runs=len(rows))


def correctness(check, args):
    """fp32 on the device and on this host's CPU, same weights, data, order and padding: per-step losses."""
    losses, devices = {}, {}
    for where, env in (("device", {}), ("cpu", {"CUDA_VISIBLE_DEVICES": ""})):
        metrics, text, code = train(check, f"fp32-on-{where}", args, fixed=True, log_every=1, env=env)
        if not metrics:
            return check.record("correctness", "failed", why=f"the {where} run: {last_line(text)}")
        losses[where] = [float(x) for x in re.findall(r"^step \d+/\d+ loss (\S+)", text, re.M)]
        devices[where] = metrics["device"]
    a, b = losses["device"], losses["cpu"]
    worst = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=float("inf"))
    ok = len(a) == len(b) == args.steps and worst <= LOSS_RTOL
    check.record("correctness", "ok" if ok else "failed", devices=devices, steps=args.steps, losses=losses,
                 max_relative_difference=worst, tolerance=LOSS_RTOL)


def gpu_tests(check):
    code, text = check.call("gpu-tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                                          "tests/test_gpu.py"])
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", last_line(text))}
    status = "failed" if code else "ok" if counts.get("passed") else "skipped"
    check.record("gpu tests", status, counts=counts, summary=last_line(text))


def markdown(result):
    """The table of the throughput rows, then one line per section."""
    v = result["versions"]
    lines = [f"# bench/gpu_check.py on {v.get('device', 'an unknown device')}: {result['mode']} mode, "
             f"{result.get('seconds', 0):.0f} s", "",
             ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "cuda", "transformers", "deepspeed", "datasets")
                       if k in v) or "versions unknown: the install section failed", "",
             "| run | batching | precision | batch | samples/s | tokens/s | TFLOP/s/device | MFU | peak memory GiB "
             "| status |",
             "| --- | --- | --- | --: | --: | --: | --: | --: | --: | --- |"]
    for r in result["rows"]:
        if r["status"] == "ok":
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            lines.append(f"| {r['run']} | {r['batching']} | {r['precision']} | {r['batch']} | "
                         f"{r['samples_per_second']:.1f} | {r['tokens_per_second']:.0f} | "
                         f"{r['tflops_per_device']:.2f} | {mfu} | {r['peak_memory_gib']:.2f} | ok |")
        else:
            lines.append(f"| {r['run']} | {r['batching']} | | | | | | | | {r['status']}: {r['why']} |")
    lines.append("")
    for name, s in result["sections"].items():
        if name == "correctness" and "devices" in s:
            s = dict(s, why=f"fp32 on {s['devices']['device']} against {s['devices']['cpu']}, {s['steps']} steps: "
                            f"largest relative loss difference {s['max_relative_difference']:.1e} "
                            f"(tolerance {s['tolerance']:g})")
        detail = s.get("why") or "; ".join(s.get("unmet") or []) or s.get("summary") or ""
        lines.append(f"- {name}: {s['status']}" + (f" ({detail})" if detail else ""))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="where gpu_check.json, gpu_check.md and logs/ go")
    p.add_argument("--kit", type=Path, default=ROOT / "gpu-kit", help="the wheel kit (default: gpu-kit/)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (the default where torch sees no GPU)")
    args = p.parse_args()
    import torch

    mode = "tiny" if args.tiny or not torch.cuda.is_available() else "gpu"
    shape, seq = MODES[mode], MODES[mode]["seq"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        check, work = Check(args.out, mode, Path(tmp)), Path(tmp)
        (work / "site").mkdir()
        install(check, args.kit, work / "site")
        kit_tokenizer = args.kit / gpu_kit.TOKENIZER
        tokenizer = kit_tokenizer if kit_tokenizer.is_dir() else throughput.minilm_dir()
        base = argparse.Namespace(model=throughput.random_bert_base(tokenizer, work / "model", **shape["model"]),
                                  train_file=SAMPLE, deepspeed_config="ds_fp32", max_seq_length=seq,
                                  steps=shape["steps"], cache_dir=work / "cache")
        rows = [(c, c, False, ()) for c in CONFIGS]  # bf16 and its fixed-padding twin first: the goal's figures
        rows.insert(1 + CONFIGS.index("ds_bf16"), (f"ds_bf16-fixed-{seq}", "ds_bf16", True, ()))
        measure(check, "throughput", rows, base)
        small = throughput.random_bert_base(tokenizer, work / "small", **shape["small"], **NO_DROPOUT)
        correctness(check, argparse.Namespace(**{**vars(base), "model": small, "steps": shape["loss_steps"]}))
        gpu_tests(check)
        if mode == "tiny":  # inductor builds C++ for a CPU model for minutes; tests/test_train.py covers --compile
            check.record("compile", "skipped", why="tiny mode: --compile is measured on a GPU only")
        else:
            measure(check, "compile", [("ds_bf16-compile", "ds_bf16", False, ("--compile",))], base)
    print(markdown(check.result))
    return 1 if any(s["status"] == "failed" for s in check.result["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
