#!/usr/bin/env python
"""Everything the project measures on a GPU host, in one command of under 10 minutes that needs nothing but
the checkout and the wheel kit beside it (`make gpu-kit` -> gpu-kit/; docs/measurements/gpu-host.md):

    python3 bench/gpu_check.py --out DIR            # on a CUDA host
    python bench/gpu_check.py --out DIR --tiny      # tiny shapes, the same plumbing (the test suite, on a CPU)

Sections, in the order of what they are worth, each started only where its estimate fits in what is left of
BUDGET_S (else recorded as not run):
1. install: the host's versions (`pip list --format=freeze`, or --host-packages FILE) into the report; the
   kit's wheels into a folder of their own (pip --no-index --no-deps --target), first on PYTHONPATH from then
   on; every requirement of what the kit installed checked against the kit and the host's versions
   (bench/gpu_kit.py's `unmet`). One unmet stops the command here, with the list.
2. host: the machine the figures come from, so that two calls can be compared: the CPU's model and cores,
   each GPU as nvidia-smi gives it (name, driver, clocks, power limit), and a launch-latency probe (the host's
   time per tiny kernel, queued back to back). It runs in every call, --only or not.
3. hf-trainer, the peer: Hugging Face's Trainer set up as run_qa.py sets it up (bench/hf_trainer.py), on the
   same model, data, batch and length at fixed padding. It runs in every call, --only or not: each row after
   it states its ratio to it (`x_trainer`).
4. ds_bf16 with --compile (CUDA graphs, one a length bucket), with the project's batching and with fixed
   padding: the goal's figures, each row with its compile time, graphs, shapes, graph breaks and graphs left
   out of CUDA graphs. BERT-base with random weights (bench/throughput.py's model, BERT's vocabulary from the
   kit) on the shipped sample at 384 tokens, stride 128, one DataLoader over every epoch, no export. Logged
   every `log_every` steps; the figure is the median window after the first (warm-up and compiles), the
   peer's too.
5. ds_bf16 eager, with the project's batching and with fixed padding.
6. the `gpu` test tier (tests/test_gpu.py).
7. correctness: the shipped sample trained in fp32 (a small BERT without dropout, the same weights, order and
   fixed padding) on the device and on this host's CPU: every step's loss agrees within LOSS_RTOL.
8. ds_fp16 and ds_zero2 rows; then ds_fp32, ds_fp32 with --tf32, and ds_zero3.

Every row records the optimizer class the engine built, the wrapper around it (DeepSpeed's; Accelerate's for
the peer), the steps skipped for an fp16 overflow, the precision path and the window. What comes back fits a
runner that returns at most 8 files two folders down: DIR/gpu_check.json and DIR/gpu_check.md, rewritten
after every section (a kill leaves what was done), and DIR/gpu_check.log, every command's output in turn.
Each section's result line is printed as it ends; the table last. A command cut at the budget has its whole
process group killed. Exit 1 when a section failed. Tiny mode (the default where torch sees no GPU): a
2-layer model, 128 tokens, a few steps, no --compile (minutes of C++ builds on a CPU); a config the project
refuses on this host (DeepSpeed's fp16 section on a CPU) is skipped with the project's reason. `--dry-run`
prints the sections and their estimates, in order, and runs nothing.
"""

import argparse
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

import gpu_kit
import throughput

ROOT = throughput.ROOT
SAMPLE = ROOT / "bert_squad" / "sample" / "train-v1.1.json"
BUDGET_S = 570  # the GPU host allows 10 minutes a command; this leaves 30 s to bring the files back
LOSS_RTOL = 1e-3  # fp32 on a GPU and on a CPU differ by rounding only
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
TINY = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)
FILES = {"json": "gpu_check.json", "table": "gpu_check.md", "log": "gpu_check.log"}
PEER = "hf-trainer"  # Hugging Face's Trainer as run_qa.py sets it up (bench/hf_trainer.py): in every call
HOST = "host"  # the machine: in every call too
ALWAYS = (HOST, PEER)
# Seconds each section takes on one H100, start-up included: whether it still fits in what is left decides if it
# starts. From what each took in the three calls of 2026-11-27 with the shipped configs
# (docs/measurements/h100-2026-11-27/); the peer's includes building the two random models before it. The two
# compiled rows are guesses, not yet measured: 2026-11-27's --compile row (inductor's default mode, one shape)
# took 82 s; CUDA graphs add a recording a shape, and the project's batching compiles up to 6 shapes at 384.
# By these a first call runs the peer, the compiled and eager goal rows, the correctness check and ds_fp16
# (561 s), and a second, `--only gpu-tests ds_zero2 ds_fp32 ds_fp32-tf32 ds_zero3`, the rest (434 s).
ESTIMATE_S = {
    "install": 15,
    HOST: 10,
    PEER: 58,
    "compile": 210,
    "compile-fixed": 90,
    "ds_bf16": 51,
    "ds_bf16-fixed": 44,
    "gpu-tests": 116,
    "correctness": 41,
    "ds_fp16": 42,
    "ds_zero2": 53,
    "ds_fp32": 37,
    "ds_fp32-tf32": 36,
    "ds_zero3": 109,
}
# Per mode: the measured model's shape (BertConfig fields), the correctness model's, tokens per window, steps
# of the peer and the two goal rows and of the others, the log interval (a window), the correctness run's
# steps, and each section's estimate.
MODES = {
    "gpu": dict(
        model={},
        small=dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024),
        seq=384,
        goal_steps=400,
        steps=300,
        log_every=100,
        loss_steps=8,
        estimate=ESTIMATE_S,
    ),
    "tiny": dict(
        model=TINY,
        small=TINY,
        seq=128,
        goal_steps=6,
        steps=4,
        log_every=2,
        loss_steps=4,
        estimate=dict.fromkeys(ESTIMATE_S, 0),
    ),
}
VERSIONS = (
    "import json, platform, torch, transformers, deepspeed, datasets, hostlist, bert_squad; "
    "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, "
    "'cuda': torch.version.cuda, 'transformers': transformers.__version__, "
    "'deepspeed': deepspeed.__version__, 'datasets': datasets.__version__, 'bert_squad_from': "
    "bert_squad.__file__, 'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}))"
)
# The host's CPU, and its time per tiny kernel: LAUNCHES in-place adds of one element queued back to back on the
# device (after 100 to warm up), then a wait for them. At batch 16 a step is bound by how fast the host issues
# kernels, so this tells two machines apart where the GPU's own figures do not.
LAUNCHES = 20000
PROBE = f"""
import json, os, platform, time, torch
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
           platform.processor())
device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.zeros(1, device=device)
def launches(n):
    for _ in range(n):
        x.add_(1)
    if device == "cuda":
        torch.cuda.synchronize()
launches(100)
began = time.perf_counter()
launches({LAUNCHES})
seconds = time.perf_counter() - began
print(json.dumps(dict(cpu=cpu, cores=os.cpu_count(), cores_usable=len(os.sched_getaffinity(0)),
                      launch_device=device, launch_us=seconds / {LAUNCHES} * 1e6)))
"""
# What nvidia-smi is asked of each GPU (--format=csv: a header line, then a line a GPU, units beside the values).
SMI_FIELDS = (
    "name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,power.max_limit,"
    "memory.total"
)


class Check:
    """The run's results so far, written out and printed after every section; its commands, each in its own
    process group, their output appended to one log."""

    def __init__(self, out: Path, mode: str, work: Path, budget: float = BUDGET_S):
        self.out, self.mode, self.work, self.budget = out, mode, work, budget
        out.mkdir(parents=True, exist_ok=True)
        self.log = out / FILES["log"]
        self.log.write_text("")
        self.started, self.env = time.monotonic(), dict(os.environ)
        self.result = {
            "mode": mode,
            "budget_s": budget,
            "versions": {},
            "host_packages": {},
            "sections": {},
            "rows": [],
        }

    def call(self, name: str, cmd: list, env: Optional[dict] = None, cwd: Path = ROOT) -> tuple:
        """(exit code, output) of one command, its output appended to the log; 124 when the budget ran out,
        and then its whole process group (data loader workers, compile workers, pytest's runs) is killed."""
        start = self.log.stat().st_size
        with open(self.log, "a") as f:
            print(f"\n===== {name}: $", *cmd, file=f, flush=True)
            proc = subprocess.Popen(
                list(map(str, cmd)),
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(self.env, **(env or {})),
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=max(self.left(), 1))
            except subprocess.TimeoutExpired:
                code = 124
                print(f"stopped: the {self.budget:.0f} s budget of bench/gpu_check.py ran out", file=f, flush=True)
            finally:
                kill_group(proc)
        with open(self.log, errors="replace") as f:
            f.seek(start)
            return code, f.read()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.started)

    def section(self, name: str, estimate: float, body: Callable[[], dict]) -> None:
        """Run `body` (which returns the section's record) if `estimate` seconds fit in what is left."""
        if self.left() < estimate:
            return self.record(
                name, "not run", why=f"needs about {estimate:.0f} s, {max(self.left(), 0):.0f} s of the budget left"
            )
        began = time.monotonic()
        info = body()
        self.record(name, seconds=round(time.monotonic() - began, 1), **info)

    def record(self, name: str, status: str, **info) -> None:
        self.result["sections"][name] = dict(status=status, **info)
        if "row" in info:
            row = info["row"]  # the section's record and the table's row alike
            row["status"] = status
            self.result["rows"].append(row)
            row["x_trainer"] = x_trainer(self.result["rows"])
        self.save()
        detail = summary(name, self.result["sections"][name])
        print(
            f"[{time.monotonic() - self.started:5.0f} s] {name}: {status}" + (f" ({detail})" if detail else ""),
            flush=True,
        )

    def stop(self, names: list, why: str) -> None:
        for name in names:
            self.record(name, "not run", why=why)

    def save(self) -> None:
        self.result["seconds"] = round(time.monotonic() - self.started, 1)
        for key, text in (("json", json.dumps(self.result, indent=2)), ("table", markdown(self.result))):
            tmp = self.out / f".{FILES[key]}.tmp"
            tmp.write_text(text + "\n")
            tmp.replace(self.out / FILES[key])


def x_trainer(rows: list) -> Optional[float]:
    """The last row's samples/s over the peer's in this call; None where either did not measure."""
    peer = next((r for r in rows if r["run"] == PEER and r["status"] == "ok"), None)
    last = rows[-1]
    return last["samples_per_second"] / peer["samples_per_second"] if peer and last["status"] == "ok" else None


def kill_group(proc: subprocess.Popen) -> None:
    """The process and everything it started in its session: TERM, then KILL after 5 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def host_versions(check: Check, given: Optional[Path]) -> dict:
    """{name: version} of the host's Python packages, before the kit is on the path: `pip list` there, or the
    same list read from `given`."""
    if given:
        return gpu_kit.read_versions(given.read_text())
    code, text = check.call("pip list", [sys.executable, "-m", "pip", "list", "--format=freeze"])
    return gpu_kit.read_versions(text) if code == 0 else {}


def install(check: Check, kit: Path, site: Path, host_file: Optional[Path]) -> dict:
    """The kit's wheels into `site`, first on the path of every later command; requirements and imports checked."""
    host = check.result["host_packages"] = host_versions(check, host_file)
    wheels = sorted(Path(kit).glob("*.whl"))
    if not wheels:
        return dict(status="skipped", why=f"no wheels in {kit}: this environment is used", unmet=[])
    code, text = check.call(
        "install", [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", site, *wheels]
    )
    if code:
        return dict(status="failed", why=last_line(text), unmet=[])
    check.env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    unmet = gpu_kit.unmet(site, host)
    code, text = check.call("versions", [sys.executable, "-c", VERSIONS], cwd=site)
    if code == 0:
        check.result["versions"] = json.loads(text.strip().splitlines()[-1])
    return dict(
        status="failed" if unmet or code else "ok",
        wheels=len(wheels),
        unmet=unmet,
        host_packages=len(host),
        why=last_line(text) if code and not unmet else None,
    )


def host(check: Check) -> dict:
    """The machine: CPU model and cores, the time per tiny kernel, and each GPU as nvidia-smi gives it."""
    code, text = check.call("probe", [sys.executable, "-c", PROBE])
    if code:
        return dict(status="failed", why=last_line(text))
    facts = json.loads(text.strip().splitlines()[-1])
    if not shutil.which("nvidia-smi"):
        return dict(status="ok", **facts, gpus=[], smi="no nvidia-smi on the PATH")
    code, text = check.call("nvidia-smi", ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv"])
    return dict(
        status="ok", **facts, gpus=read_smi(text) if code == 0 else [], smi=None if code == 0 else last_line(text)
    )


def read_smi(text: str) -> list:
    """nvidia-smi's --format=csv answer as one {field: value} a GPU ("clocks.max.sm [MHz]": "1980 MHz")."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    header = [field.strip() for field in lines[0].split(",")] if lines else []
    return [dict(zip(header, (value.strip() for value in line.split(",")))) for line in lines[1:]]


def run_metrics(check: Check, name: str, cmd: list, out: Path, env: Optional[dict] = None) -> tuple:
    """(the train_metrics.json a run wrote into `out`, or None; its output; its exit code)."""
    code, text = check.call(name, cmd, env=env)
    metrics = None if code else json.loads((out / "train_metrics.json").read_text())
    return metrics, text, code


def train(
    check: Check,
    name: str,
    args: argparse.Namespace,
    fixed: bool,
    log_every: int,
    extra: tuple = (),
    env: Optional[dict] = None,
) -> tuple:
    """One training run of bench/throughput.py's command (no export): run_metrics' triple."""
    out = check.work / name
    return run_metrics(check, name, throughput.command(args, out, fixed, log_every) + list(extra), out, env)


def window(logs: list, log_every: int) -> dict:
    """The median window (by samples/s) of those after the first, which holds the warm-up."""
    later = sorted(logs[1:] or logs, key=lambda w: w["samples_per_second"])
    chosen = later[(len(later) - 1) // 2]  # the lower median: a window that was measured
    return {
        "steps": f"{chosen['step'] - log_every + 1}-{chosen['step']}",
        "log_every": log_every,
        "of": len(later),
        "samples_per_second_per_window": [round(w["samples_per_second"], 1) for w in logs],
        "chosen": chosen,
    }


def measure(
    check: Check, name: str, config: str, args: argparse.Namespace, fixed: bool = False, extra: tuple = ()
) -> dict:
    """One row of the table: a training run of the project, its median window, and what the engine built."""
    run_args = argparse.Namespace(**{**vars(args), "deepspeed_config": config})
    row = dict(
        run=name,
        config=config + "".join(f" {flag}" for flag in extra),
        batching=f"fixed {args.max_seq_length}" if fixed else "project",
        steps=args.steps,
    )
    return as_row(check, row, args.log_every, *train(check, name, run_args, fixed, args.log_every, extra))


def peer(check: Check, args: argparse.Namespace) -> dict:
    """The peer's row: Hugging Face's Trainer as run_qa.py sets it up, same model, data, length and steps."""
    out = check.work / PEER
    cmd = [sys.executable, Path(__file__).with_name("hf_trainer.py"), "--model", args.model, "--out", out]
    cmd += ["--train-file", args.train_file, "--max-seq-length", args.max_seq_length]
    cmd += ["--steps", args.steps, "--log-every", args.log_every]
    row = dict(run=PEER, config="Trainer, as run_qa.py", batching=f"fixed {args.max_seq_length}", steps=args.steps)
    return as_row(check, row, args.log_every, *run_metrics(check, PEER, cmd, out))


def as_row(check: Check, row: dict, log_every: int, metrics: Optional[dict], text: str, code: int) -> dict:
    """A section's record of one measured run: its row with the median window and what trained it."""
    if not metrics:  # the project refuses what this host cannot run (exit 2, one line): a skip in tiny mode
        return dict(
            status="skipped" if code == 2 and check.mode == "tiny" else "failed",
            why=last_line(text),
            row=dict(row, why=last_line(text)),
        )
    engine, win = metrics["engine"], window(metrics["logs"], log_every)
    rates = win.pop("chosen")
    path = (
        f"{metrics['precision']}: {engine['optimizer'].rsplit('.', 1)[-1]}"
        + (f" in {engine['optimizer_wrapper']}" if engine["optimizer_wrapper"] else "")
        + (f" under {engine['autocast']} autocast" if engine["autocast"] else "")
    )
    row.update(
        device=metrics["device"],
        precision=metrics["precision"],
        precision_path=path,
        optimizer=engine["optimizer"],
        optimizer_wrapper=engine["optimizer_wrapper"],
        skipped_steps=engine["skipped_steps"],
        window=win,
        batch=metrics["train_batch_size"],
        peak_memory_gib=metrics["peak_memory_gib"],
        # --compile's cost: seconds, graphs against the shapes trained on, graph breaks, graphs out of CUDA graphs
        compile=metrics.get("compile") and dict(metrics["compile"], shapes=len(metrics["shapes"])),
        **{k: rates[k] for k in ("samples_per_second", "tokens_per_second", "tflops_per_device", "mfu")},
    )
    return dict(status="ok", row=row)


def correctness(check: Check, args: argparse.Namespace) -> dict:
    """fp32 on the device and on this host's CPU, same weights, data, order and padding: per-step losses."""
    losses, devices = {}, {}
    for where, env in (("device", {}), ("cpu", {"CUDA_VISIBLE_DEVICES": ""})):
        metrics, text, _code = train(check, f"fp32-on-{where}", args, fixed=True, log_every=1, env=env)
        if not metrics:
            return dict(status="failed", why=f"the {where} run: {last_line(text)}")
        losses[where] = [w["loss"] for w in metrics["logs"]]
        devices[where] = metrics["device"]
    a, b = losses["device"], losses["cpu"]
    worst = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=float("inf"))
    ok = len(a) == len(b) == args.steps and worst <= LOSS_RTOL
    return dict(
        status="ok" if ok else "failed",
        devices=devices,
        steps=args.steps,
        losses=losses,
        max_relative_difference=worst,
        tolerance=LOSS_RTOL,
    )


def gpu_tests(check: Check) -> dict:
    code, text = check.call(
        "gpu-tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_gpu.py"]
    )
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", last_line(text))}
    status = "failed" if code else "ok" if counts.get("passed") else "skipped"
    return dict(status=status, counts=counts, summary=last_line(text))


def summary(name: str, s: dict) -> str:
    """A section's record in a few words, for its line and the table's list."""
    if s.get("row") and s["status"] == "ok":
        r, w = s["row"], s["row"]["window"]
        mfu = f", MFU {r['mfu']:.1%}" if r["mfu"] is not None else ""
        c = r.get("compile")
        compiled = (
            f"; compiled in {c['seconds']:.0f} s, {c['graphs']} graphs for {c['shapes']} shapes, "
            f"{c['graph_breaks']} graph breaks, {c['cudagraph_skips']} left out of CUDA graphs"
            if c
            else ""
        )
        return (
            f"{r['samples_per_second']:.1f} samples/s ({times(r['x_trainer'])} the Trainer's){mfu}, steps "
            f"{w['steps']} (median of {w['of']} windows), {r['precision_path']}, {r['skipped_steps']} skipped "
            f"steps{compiled}"
        )
    if name == HOST and s["status"] == "ok":
        gpus = "; ".join(", ".join(gpu.values()) for gpu in s["gpus"]) or s["smi"]
        return (
            f"{s['cpu']}, {s['cores']} cores ({s['cores_usable']} usable); {s['launch_us']:.1f} us a tiny kernel "
            f"on the {s['launch_device']}; {gpus}"
        )
    if name == "correctness" and "devices" in s:
        return (
            f"fp32 on {s['devices']['device']} against {s['devices']['cpu']}, {s['steps']} steps: largest "
            f"relative loss difference {s['max_relative_difference']:.1e} (tolerance {s['tolerance']:g})"
        )
    if s.get("unmet"):
        return "the host's versions fall short: " + "; ".join(s["unmet"])
    if name == "install" and s["status"] == "ok":
        return f"{s['wheels']} wheels; {s['host_packages']} host packages read, every requirement met"
    return s.get("why") or s.get("summary") or ""


def times(ratio: Optional[float]) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def markdown(result: dict) -> str:
    """The table of the throughput rows, then one line per section."""
    v = result["versions"]
    lines = [
        f"# bench/gpu_check.py on {v.get('device', 'an unknown device')}: {result['mode']} mode, "
        f"{result.get('seconds', 0):.0f} s",
        "",
        ", ".join(f"{k} {v[k]}" for k in ("python", "torch", "cuda", "transformers", "deepspeed", "datasets") if k in v)
        or "versions unknown: the install section did not finish",
        "",
        f"host: {summary(HOST, result['sections'][HOST])}" if HOST in result["sections"] else "host: not recorded",
        "",
        "| run | config | batching | precision path | batch | window | samples/s | x Trainer | tokens/s "
        "| TFLOP/s/device | MFU | skipped steps | peak memory GiB | status |",
        "| --- | --- | --- | --- | --: | --- | --: | --: | --: | --: | --: | --: | --: | --- |",
    ]
    for r in result["rows"]:
        if r["status"] == "ok":
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
            lines.append(
                f"| {r['run']} | {r['config']} | {r['batching']} | {r['precision_path']} | {r['batch']} | steps "
                f"{r['window']['steps']} of {r['steps']} | {r['samples_per_second']:.1f} | {times(r['x_trainer'])} "
                f"| {r['tokens_per_second']:.0f} | {r['tflops_per_device']:.2f} | {mfu} | {r['skipped_steps']} "
                f"| {r['peak_memory_gib']:.2f} | ok |"
            )
        else:
            lines.append(
                f"| {r['run']} | {r['config']} | {r['batching']} |" + " |" * 10 + f" {r['status']}: {r['why']} |"
            )
    lines.append("")
    for name, s in result["sections"].items():
        detail = summary(name, s)
        lines.append(f"- {name}: {s['status']}" + (f" ({detail})" if detail else ""))
    return "\n".join(lines)


def plan(check: Check, seq: int, base: Optional[argparse.Namespace], small: Optional[argparse.Namespace]) -> list:
    """(name, estimated seconds, body) of every section after install, in the order of what they are worth:
    the host, the peer, the goal's two bf16 rows compiled and eager, the gpu tier, the correctness check, the
    other 16-bit rows, fp32 without and with TF32, ZeRO-3."""
    mode = MODES[check.mode]
    est = mode["estimate"]
    goal = base and argparse.Namespace(**{**vars(base), "steps": mode["goal_steps"]})

    def row(name: str, config: str, kind: str = "", args=None, fixed: bool = False, extra: tuple = ()) -> tuple:
        return name, est[kind or name], lambda: measure(check, name, config, args or base, fixed, extra)

    def compiled(name: str, kind: str, fixed: bool) -> tuple:
        if check.mode == "gpu":
            return row(name, "ds_bf16", kind, goal, fixed, extra=("--compile",))
        why = "tiny mode: inductor builds C++ for minutes on a CPU (tests/test_train.py compiles there)"
        return name, est[kind], lambda: dict(status="skipped", why=why)

    return [
        (HOST, est[HOST], lambda: host(check)),
        (PEER, est[PEER], lambda: peer(check, goal)),
        compiled("ds_bf16-compile", "compile", fixed=False),
        compiled(f"ds_bf16-fixed-{seq}-compile", "compile-fixed", fixed=True),
        row("ds_bf16", "ds_bf16", args=goal),
        row(f"ds_bf16-fixed-{seq}", "ds_bf16", "ds_bf16-fixed", goal, fixed=True),
        ("gpu-tests", est["gpu-tests"], lambda: gpu_tests(check)),
        ("correctness", est["correctness"], lambda: correctness(check, small)),
        row("ds_fp16", "ds_fp16"),
        row("ds_zero2", "ds_zero2"),
        row("ds_fp32", "ds_fp32"),
        row("ds_fp32-tf32", "ds_fp32", extra=("--tf32",)),
        row("ds_zero3", "ds_zero3"),
    ]


def dry_run(check: Check, seq: int, only: Optional[list]) -> int:
    """Print each section a call would start, by its estimate against what is left of the budget, and run none."""
    left = check.budget
    for name, estimate, _ in [
        ("install", MODES[check.mode]["estimate"]["install"], None),
        *plan(check, seq, None, None),
    ]:
        if only and name not in only and name not in ("install", *ALWAYS):
            continue
        runs = estimate <= left
        left -= estimate if runs else 0
        print(f"{name:28} {estimate:4.0f} s  {'runs' if runs else 'not run: does not fit'}")
    print(f"{check.budget - left:.0f} s of the {check.budget} s budget")
    return 0


def models(check: Check, kit: Path, seq: int) -> tuple:
    """The arguments of the measured runs (BERT-base, or tiny) and of the correctness runs (a small BERT)."""
    shape = MODES[check.mode]
    tokenizer = kit / gpu_kit.TOKENIZER if (kit / gpu_kit.TOKENIZER).is_dir() else throughput.minilm_dir()
    base = argparse.Namespace(
        model=throughput.random_bert_base(tokenizer, check.work / "model", **shape["model"]),
        train_file=SAMPLE,
        deepspeed_config="ds_fp32",
        max_seq_length=seq,
        steps=shape["steps"],
        log_every=shape["log_every"],
        cache_dir=check.work / "cache",
    )
    small = throughput.random_bert_base(tokenizer, check.work / "small", **shape["small"], **NO_DROPOUT)
    return base, argparse.Namespace(**{**vars(base), "model": small, "steps": shape["loss_steps"]})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help=f"where {', '.join(FILES.values())} go")
    p.add_argument("--kit", type=Path, default=ROOT / "gpu-kit", help="the wheel kit (default: gpu-kit/)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (the default where torch sees no GPU)")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="SECTION",
        help=f"after install, {HOST} and {PEER}, only these sections (names as the report gives them)",
    )
    p.add_argument(
        "--host-packages",
        type=Path,
        metavar="FILE",
        help="the host's `pip list --format=freeze`, read from FILE instead of asking pip",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the sections a call would run by their estimates (GPU mode unless --tiny), run nothing",
    )
    args = p.parse_args()
    import torch  # the host's, before the kit is on the path

    mode = "tiny" if args.tiny or not (torch.cuda.is_available() or args.dry_run) else "gpu"
    seq = MODES[mode]["seq"]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        if args.dry_run:
            return dry_run(Check(Path(tmp) / "out", mode, Path(tmp)), seq, args.only)
        check = Check(args.out, mode, Path(tmp))
        (check.work / "site").mkdir()
        check.section(
            "install",
            MODES[mode]["estimate"]["install"],
            lambda: install(check, args.kit, check.work / "site", args.host_packages),
        )
        if check.result["sections"]["install"]["status"] in ("failed", "not run"):
            check.stop([name for name, *_ in plan(check, seq, None, None)], "install did not succeed: see its line")
        else:
            for name, estimate, body in plan(check, seq, *models(check, args.kit, seq)):
                if not args.only or name in args.only or name in ALWAYS:
                    check.section(name, estimate, body)
    print("\n" + markdown(check.result), flush=True)
    return 1 if any(s["status"] == "failed" for s in check.result["sections"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
