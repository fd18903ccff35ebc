"""Helpers the tests share, imported by name (`from helpers import ...`): paths, the real CLI run as a
process that cannot outlive its test, tiny-run arguments, configs, real data beside the checkout, and
the checks several tests make (the same weights, a free port)."""

import contextlib
import functools
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import preloaded
import pytest

ROOT = Path(__file__).resolve().parents[1]


SHARED_SQUAD = ROOT.parent / "shared" / "data" / "squad"


PYTHON = sys.executable


def sample_path(name):
    """A file of the shipped sample (tools/make_sample.py generates it)."""
    return ROOT / "bert_squad" / "sample" / name


@functools.cache
def gpu_count():
    """CUDA or ROCm devices torch sees here (ROCm builds answer through torch.cuda too)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


HARDWARE_CAUSE = "this host's hardware: "


def skip_for_hardware(reason):
    """Skip because of what this machine is (no GPU, a GPU, no bf16): the one cause of a skip that a run which
    must run everything accepts (conftest.py); every other cause fails such a run."""
    pytest.skip(HARDWARE_CAUSE + reason)


def shared_squad(name):
    """A file of ../shared/data/squad, or skip (tests that call it are in the `oracle` tier)."""
    path = SHARED_SQUAD / name
    if not path.exists():
        pytest.skip(f"{path} is absent (real SQuAD data lives in ../shared beside the clone)")
    return path


SHARED_XQUAD = ROOT.parent / "shared" / "data" / "xquad"
XQUAD_LANGS = ("ar", "de", "zh")  # the XQuAD languages ../shared holds


def shared_xquad(lang):
    """XQuAD's file for `lang` in ../shared/data/xquad, or skip (tests that call it are in the `oracle` tier)."""
    path = SHARED_XQUAD / f"xquad.{lang}.json"
    if not path.exists():
        pytest.skip(f"{path} is absent (XQuAD lives in ../shared beside the clone)")
    return path


# The keys of SQuAD v2.0's official script, in its order; with no-answer probabilities, the best thresholds follow.
V2_KEYS = [
    "exact",
    "f1",
    "total",
    "HasAns_exact",
    "HasAns_f1",
    "HasAns_total",
    "NoAns_exact",
    "NoAns_f1",
    "NoAns_total",
]
V2_BEST_KEYS = ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def random_predictions(squad, seed):
    """Answers a model might give on real data: references, context slices, "", confidences."""
    rng = random.Random(seed)
    preds, na = {}, {}
    for article in squad["data"]:
        for para in article["paragraphs"]:
            ctx = para["context"]
            for q in para["qas"]:
                r = rng.random()
                if r < 0.3 and q["answers"]:
                    preds[q["id"]] = rng.choice(q["answers"])["text"]
                elif r < 0.45:
                    preds[q["id"]] = ""
                else:
                    i = rng.randrange(len(ctx))
                    preds[q["id"]] = ctx[i : i + rng.randrange(1, 60)]
                na[q["id"]] = round(rng.random(), 2)  # rounded: ties, as real confidences have
    return preds, na


def decode_spans(examples, tokenizer, win, features):
    """Character spans of the labelled tokens, recomputed from the tokenizer's offsets."""
    from bert_squad.features import _tokenize

    batch = {"question": [r["question"] for r in examples.records], "context": [r["context"] for r in examples.records]}
    enc = _tokenize(batch, tokenizer, win)
    assert len(enc["input_ids"]) == len(features)
    spans = []
    for i, feat in enumerate(features):
        s, e = feat["start_positions"], feat["end_positions"]
        ex = examples.records[enc["overflow_to_sample_mapping"][i]]
        assert feat["example_index"] == enc["overflow_to_sample_mapping"][i]
        if s:
            assert enc.sequence_ids(i)[s] == 1 and enc.sequence_ids(i)[e] == 1
            spans.append((ex, ex["context"][enc["offset_mapping"][i][s][0] : enc["offset_mapping"][i][e][1]]))
    return spans


def ds_config(tmp_path, shipped, drop=(), **sections):
    """A shipped DeepSpeed config with `drop`ped and replaced top-level sections, written into `tmp_path`."""
    cfg = json.loads((ROOT / "configs" / f"{shipped}.json").read_text())
    for key in drop:
        cfg.pop(key)
    cfg.update(sections)
    path = tmp_path / f"{shipped}-{'-'.join([*drop, *sections]) or 'as-shipped'}.json"
    path.write_text(json.dumps(cfg))
    return path


def zero_on_cpu(tmp_path, stage, bf16=False):
    """ds_zero2 or ds_zero3 as shipped, its fp16 (which needs a GPU) swapped for fp32 or bf16: ZeRO on the
    CPU. ZeRO-3 partitions every parameter (threshold 0), even the tiny model's smallest ones."""
    sections = {"bf16": {"enabled": True}} if bf16 else {}
    if stage == 3:
        zero = json.loads((ROOT / "configs" / "ds_zero3.json").read_text())["zero_optimization"]
        sections["zero_optimization"] = dict(zero, stage3_param_persistence_threshold=0)
    return ds_config(tmp_path, f"ds_zero{stage}", drop=["fp16"], **sections)


class Started:
    """A process a test starts: its own process group, stdout and stderr in files (nothing to block on),
    and the whole group killed on the way out of the `with`, whatever happened inside it; with `umask`, the
    process's own (as `umask 027; cmd` in a shell sets it), else this one's."""

    def __init__(self, cmd, folder, env=None, cwd=ROOT, umask=None):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.cmd, self.stdout_file, self.stderr_file = list(map(str, cmd)), folder / "stdout", folder / "stderr"
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        with open(self.stdout_file, "wb") as out, open(self.stderr_file, "wb") as err:
            if preloaded.can_fork(self.cmd, env, cwd):
                self.proc = preloaded.start(self.cmd[1:], env, self.stdout_file, self.stderr_file, umask)
                return
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=cwd,
                env=env,
                start_new_session=True,
                umask=-1 if umask is None else umask,
            )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    @property
    def stdout(self):
        return self.stdout_file.read_text(errors="replace")

    @property
    def stderr(self):
        return self.stderr_file.read_text(errors="replace")

    def seen(self):
        return f"{' '.join(self.cmd)}\n--- stdout:\n{self.stdout[-3000:]}\n--- stderr:\n{self.stderr[-3000:]}"

    def wait_for(self, pattern, timeout=300):
        """Until stdout matches `pattern` (a regex); fails with the output when the process ends first or
        the deadline passes. Returns the match."""
        deadline = time.monotonic() + timeout
        while not (found := re.search(pattern, self.stdout)):
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before printing {pattern!r}: {self.seen()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not printed within {timeout}s: {self.seen()}")
            time.sleep(0.1)
        return found

    def wait(self, timeout):
        """The exit code; fails with the output if the process is still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout}s: {self.seen()}") from None

    def kill(self):
        """SIGKILL to the whole group (a launcher's ranks too), then reap the leader."""
        for send in (os.killpg, os.kill):  # the group, and its leader if a fork has not made its group yet
            with contextlib.suppress(ProcessLookupError):
                send(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)


def run_in_checkout(*cmd, timeout=600, **kwargs):
    """`cmd` (a script, a console script) run to its end from the checkout's root, its output captured as text."""
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, cwd=ROOT, timeout=timeout, **kwargs)


def run_bert_squad(*args, launcher=(), env=None, timeout=600, cwd=ROOT, umask=None):
    """Run the real CLI (optionally under a launcher such as mpirun) to its end; its group is killed after."""
    return run_python("-m", "bert_squad", *args, launcher=launcher, env=env, timeout=timeout, cwd=cwd, umask=umask)


def run_python(*args, launcher=(), env=None, timeout=600, cwd=ROOT, umask=None):
    """`python *args` (optionally under a launcher such as mpirun) to its end, under `umask` where given; its
    group is killed after."""
    import tempfile

    env = {**launcher_env(launcher), **(env or {})}
    with (
        tempfile.TemporaryDirectory(prefix="bert-squad-run-") as folder,
        Started([*launcher, PYTHON, *args], folder, env=env, cwd=cwd, umask=umask) as proc,
    ):
        code = proc.wait(timeout)
        return subprocess.CompletedProcess(proc.cmd, code, proc.stdout, proc.stderr)


MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]


def launcher_env(launcher):
    """mpirun's ranks on one host meet at MASTER_PORT, by default a fixed port that test sessions running
    side by side on a shared machine would collide on: a free one instead."""
    return {"MASTER_PORT": str(free_port())} if launcher else {}


def put_in_hub_cache(hub_cache, repo_id, model_dir, revision="0" * 40):
    """`model_dir`'s files as hub model `repo_id` in a Hugging Face hub cache, in the documented layout
    (refs/main names the snapshot; files are blobs linked from it), as `snapshot_download` leaves it."""
    import hashlib

    repo = Path(hub_cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def free_port():
    """A port nothing listens on now, for a run's rendezvous and a test Slurm's daemons: from the session's own
    block (PORTS_VAR, which tests/run.sh sets from tests/lines.py, so that no two sessions side by side take one
    port between its check here and its listening there), else from 10000-19999: below the jobs' own ports
    (distributed.job_port) and the kernel's ephemeral range, where any outgoing connection (a rank's own to the
    rendezvous included) could take it before it is listened on."""
    low, high = map(int, os.environ.get(PORTS_VAR, "10000-19999").split("-"))
    while True:
        port = random.SystemRandom().randrange(low, high + 1)  # not the seeded global one: runs in-process seed it
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port


PORTS_VAR = "BERT_SQUAD_TEST_PORTS"


def holders(port: int) -> str:
    """Every socket of this host on `port`, with its process (`ss`), and the kernel's range of ephemeral ports:
    what a rendezvous that did not meet found there."""
    filt = f"sport = :{port} or dport = :{port}"
    r = subprocess.run(["ss", "-tanp", filt], capture_output=True, text=True, timeout=30)
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return f"ephemeral ports: {'-'.join(ephemeral)}\n{r.stdout}{r.stderr}"


def window_args(seq=128, stride=32, query=24):
    """The window options of a run: tokens a window, the step between a context's windows, the question's
    tokens at most; None leaves one to the CLI's default. The defaults are the tiny model's short windows."""
    given = zip(("--max-seq-length", "--doc-stride", "--max-query-length"), (seq, stride, query))
    return [str(part) for option, value in given if value is not None for part in (option, value)]


TINY_WINDOWS = window_args()


def train_args(model, train, out, *extra, cache=None, windows=TINY_WINDOWS):
    """A training run's usual arguments: the model and its training file, the output dir and the feature cache
    (each only where given: a sweep or a job may choose them), the windows, then `extra` (steps, config,
    evaluation: each test's own; an option given again there wins)."""
    given = ["--model", str(model), "--train-file", str(train)]
    return [*given, *_where(out, cache), *map(str, windows), *map(str, extra)]


def inference_args(command, model_dir, questions, out, *extra, cache=None, windows=TINY_WINDOWS):
    """`evaluate`'s or `predict`'s usual arguments: the command, the saved model, its questions (`evaluate`'s
    --eval-file, one file or a list; `predict`'s --input), the output dir, the feature cache where given, the
    windows, then `extra`."""
    files = [str(f) for f in (questions if isinstance(questions, list) else [questions])]
    given = ["--model-dir", str(model_dir), "--eval-file" if command == "evaluate" else "--input", *files]
    return [command, *given, *_where(out, cache), *map(str, windows), *map(str, extra)]


def _where(out, cache):
    """--output-dir and --cache-dir, each only where given."""
    return [*(["--output-dir", str(out)] if out else []), *(["--cache-dir", str(cache)] if cache else [])]


def rank_env(rank, ranks, port):
    """The variables a launcher such as torchrun gives rank `rank` of `ranks` on this host, meeting at `port`."""
    return dict(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


@contextlib.contextmanager
def ranks_by_hand(cmd, folder, ranks=2, env_of=rank_env):
    """`ranks` processes of `cmd` started by hand as a launcher would start them, each told its rank and where
    they meet (`env_of(rank, ranks, a free port)`), its output in `folder`/rankN; all killed on the way out.
    Each carries the port as `.port`."""
    port = free_port()
    with contextlib.ExitStack() as stack:
        started = [
            stack.enter_context(Started(cmd, Path(folder) / f"rank{rank}", env=env_of(rank, ranks, port)))
            for rank in range(ranks)
        ]
        for rank in started:
            rank.port = port
        yield started


def wait_ranks(started, timeout):
    """Every rank's exit code, once all have ended; fails after `timeout` seconds with every rank's output and
    the sockets on their port (`holders`): a rank that waits on the others says little of why alone."""
    deadline = time.monotonic() + timeout
    while any(rank.proc.poll() is None for rank in started):
        if time.monotonic() > deadline:
            seen = "\n".join(
                f"=== rank {i}: {'running' if r.proc.poll() is None else f'exit {r.proc.returncode}'}: {r.seen()}"
                for i, r in enumerate(started)
            )
            raise AssertionError(
                f"ranks still running after {timeout}s\n{seen}\n=== port {started[0].port}:\n{holders(started[0].port)}"
            )
        time.sleep(0.5)
    return [rank.proc.returncode for rank in started]


def run_ranks_by_hand(*args, folder, ranks=2, timeout=600):
    """`python -m bert_squad *args` on `ranks` ranks started by hand (`ranks_by_hand`), run to their end
    (`wait_ranks`): the first non-zero exit code of the ranks (else 0), rank 0's stdout, and every rank's stderr."""
    with ranks_by_hand([PYTHON, "-m", "bert_squad", *args], folder, ranks) as started:
        codes = wait_ranks(started, timeout)
        stderr = "".join(rank.stderr for rank in started)
        return subprocess.CompletedProcess(started[0].cmd, next(filter(None, codes), 0), started[0].stdout, stderr)


def assert_same_weights(a, b):
    """Two saved models (directories with model.safetensors) hold the same tensors, bit for bit."""
    import torch  # heavy: only the tests that train import it
    from safetensors.torch import load_file

    x, y = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
    assert x.keys() == y.keys(), sorted(set(x) ^ set(y))
    different = [k for k in x if not torch.equal(x[k], y[k])]
    assert not different, f"{a} and {b} differ in {different[:5]}"


def assert_span_head_export(directory):
    """A model saved with the project's span head is in Hugging Face format and says what it is: its config
    names the modelling file written beside the weights, which is span_head.py's source and one line more."""
    from bert_squad import span_head

    directory = Path(directory)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["EuroBertForQuestionAnswering"]
    assert config["auto_map"] == {"AutoModelForQuestionAnswering": f"{span_head.MODULE}.EuroBertForQuestionAnswering"}
    source = (directory / f"{span_head.MODULE}.py").read_text()
    assert source.startswith(Path(span_head.__file__).read_text())
    assert source.endswith("EuroBertForQuestionAnswering = for_model_type('eurobert')\n")
