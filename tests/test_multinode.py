"""A real multi-node Slurm (tests/slurm_cluster.py: `multinode_cluster`): node1, node2 are network
namespaces on a private bridge, each with its own slurmd and hostname. These tests prove that jobs,
Open MPI and gloo really span the nodes, and that losing a node ends a job instead of hanging it.
"""

import collections
import json
import re
import sys

import pytest
import torch
from helpers import ROOT, Started, ds_config, inference_args, run_bert_squad, window_args, zero_on_cpu
from safetensors.torch import load_file
from slurm_jobs import (
    FP32,
    JOB_WINDOWS,
    LAUNCHERS,
    assert_one_master,
    finished,
    job_env,
    job_train_args,
    resuming_script,
    submit,
    wait_for_log,
    wait_for_requeue,
)

from bert_squad.checkpoint import checkpoint_root, complete_tags
from bert_squad.distributed import job_port

pytestmark = [pytest.mark.slurm, pytest.mark.multinode]


def run_job(cluster, tmp_path, body, options=("--nodes=2", "--ntasks-per-node=2"), timeout=300, env=None):
    """Submit a bash script `body`; returns (scontrol info, output text)."""
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nset -euo pipefail\n{body}\n")
    job, log = submit(cluster, tmp_path, [], env or job_env(tmp_path), options, script=script)
    return finished(cluster, job, log, timeout=timeout)


def assert_ok(info, text):
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{text[-4000:]}"


def test_nodes_reach_each_other_only_on_the_bridge(multinode_cluster, tmp_path):
    """A process in node1's namespace connects to node2's address (the path gloo and Open MPI take)."""
    c = multinode_cluster
    n1, n2 = c.nodes[:2]
    server = (
        "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('{n2.addr}', 23456)); s.listen(); print('ready', flush=True); "
        "conn, peer = s.accept(); print(peer[0], conn.recv(16).decode(), flush=True)"
    )
    with Started(c.netns_cmd(n2.name, sys.executable, "-c", server), tmp_path / "server") as srv:
        srv.wait_for("^ready$", timeout=60)
        client = c.netns_run(
            n1.name,
            sys.executable,
            "-c",
            f"import socket; socket.create_connection(('{n2.name}', 23456), timeout=10).send(b'hello')",
            timeout=60,
        )
        assert client.returncode == 0, client.stderr
        srv.wait_for(rf"(?m)^{re.escape(n1.addr)} hello$", timeout=60)
    # Each node sees its own interfaces only: eth0 with its address, and loopback.
    addrs = c.netns_run(n1.name, "ip", "-o", "-4", "addr").stdout
    assert re.findall(r"inet (\S+)", addrs) == ["127.0.0.1/8", f"{n1.addr}/24"], addrs


def test_srun_hostname_runs_twice_on_each_node(multinode_cluster, tmp_path):
    info, text = run_job(
        multinode_cluster, tmp_path, 'echo "batch on $(hostname) nodes $SLURM_JOB_NODELIST"\nsrun hostname'
    )
    assert_ok(info, text)
    names = [n.name for n in multinode_cluster.nodes]
    assert f"batch on {names[0]} nodes node[1-{len(names)}]" in text, text
    hosts = [line for line in text.splitlines() if not line.startswith("batch")]
    assert collections.Counter(hosts) == {n: 2 for n in names}, text


@pytest.mark.mpi
def test_mpirun_places_two_ranks_on_each_node(multinode_cluster, tmp_path):
    size = 2 * len(multinode_cluster.nodes)
    # One write per line: unbuffered print() writes piece by piece, and the ranks of a node share the file.
    prog = (
        "import os, socket; e = os.environ; "
        "os.write(1, ' '.join(['rank', e['OMPI_COMM_WORLD_RANK'], e['OMPI_COMM_WORLD_SIZE'], "
        "e['OMPI_COMM_WORLD_LOCAL_RANK'], socket.gethostname()]).encode() + bytes([10]))"
    )
    info, text = run_job(multinode_cluster, tmp_path, f'mpirun -np {size} python -c "{prog}"')
    assert_ok(info, text)
    ranks = [line.split()[1:] for line in text.splitlines() if line.startswith("rank ")]
    assert sorted(int(r[0]) for r in ranks) == list(range(size)), text
    assert all(r[1] == str(size) for r in ranks), text
    by_node = collections.defaultdict(list)
    for rank, _, local, host in ranks:
        by_node[host].append((int(rank), int(local)))
    assert sorted(by_node) == [n.name for n in multinode_cluster.nodes], text
    assert all(sorted(local for _, local in v) == [0, 1] for v in by_node.values()), text


GLOO = r"""
import os, pathlib, socket, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from bert_squad.distributed import detect
def say(*words):  # one write per line: the ranks of a node share the output file
    os.write(1, (" ".join(map(str, words)) + "\n").encode())
d = detect()  # rank, size, MASTER_ADDR and port from srun's variables, as the training does
dist.init_process_group("gloo", init_method=f"tcp://{d.master_addr}:{d.master_port}", rank=d.rank,
                        world_size=d.world_size, timeout=timedelta(seconds=float(sys.argv[1])))
t = torch.tensor([d.rank + 1.0])
dist.all_reduce(t)
say("sum", d.rank, socket.gethostname(), t.item(), "master", f"{d.master_addr}:{d.master_port}")
if sys.argv[2] == "loop":
    say("looping", d.rank, socket.gethostname())
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.05)
if sys.argv[2] == "meet":  # hold this step's group open until `count` steps have theirs open: meet DIR COUNT
    folder, count = pathlib.Path(sys.argv[3]), int(sys.argv[4])
    (folder / f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']}.{d.rank}").touch()
    deadline = time.time() + 120
    while len(list(folder.iterdir())) < count * d.world_size and time.time() < deadline:
        time.sleep(0.2)
    dist.all_reduce(t)
    say("met", d.rank, len(list(folder.iterdir())), t.item())
dist.destroy_process_group()
"""


def test_gloo_all_reduce_across_nodes(multinode_cluster, tmp_path):
    (tmp_path / "gloo.py").write_text(GLOO)
    size = 2 * len(multinode_cluster.nodes)
    info, text = run_job(multinode_cluster, tmp_path, f"srun python {tmp_path}/gloo.py 120 once")
    assert_ok(info, text)
    sums = [line.split() for line in text.splitlines() if line.startswith("sum ")]
    assert sorted(int(s[1]) for s in sums) == list(range(size)), text
    assert {s[3] for s in sums} == {str(float(size * (size + 1) // 2))}, text
    assert collections.Counter(s[2] for s in sums) == {n.name: 2 for n in multinode_cluster.nodes}, text


def assert_met(text, groups, of):
    """The log's `groups` 2-rank groups each held their group open until all `of` groups had theirs open."""
    met = sorted(line.split()[:3] for line in text.splitlines() if line.startswith("met "))
    assert met == sorted([["met", "0", str(2 * of)], ["met", "1", str(2 * of)]] * groups), text


def masters(text):
    return {line.split()[-1] for line in text.splitlines() if line.startswith("sum ")}


def test_two_jobs_on_the_same_nodes_rendezvous_apart(multinode_cluster, tmp_path):
    """Two 2-node jobs, one core per node each, run at once on the same nodes, both with their master on
    node1: each one's port comes from its job id (distributed.job_port), so both rendezvous succeed, and
    each job holds its group open until the other has one too."""
    c = multinode_cluster
    (tmp_path / "gloo.py").write_text(GLOO)
    meet = tmp_path / "meet"
    meet.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nsrun python {tmp_path}/gloo.py 120 meet {meet} 2\n")
    submitted = [
        submit(c, tmp_path, [], job_env(tmp_path), ["--nodes=2", "--ntasks-per-node=1"], script=script)
        for _ in range(2)
    ]
    jobs = [job for job, _ in submitted]
    seen = set()
    for info, text in [finished(c, job, log, timeout=300) for job, log in submitted]:
        assert_ok(info, text)
        assert info["NodeList"] == "node[1-2]", info
        assert_met(text, 1, of=2)
        seen |= masters(text)
    assert seen == {f"node1:{job_port(int(job), step=0)}" for job in jobs}, seen


def test_two_steps_of_one_job_on_the_same_nodes_rendezvous_apart(multinode_cluster, tmp_path):
    """One 2-node job runs two 2-rank steps at once on the same nodes (a sweep packed into one allocation),
    both with their master on node1: each step's port comes from the job's id and its own step id, so both
    rendezvous succeed, and each step holds its group open until the other has one too."""
    (tmp_path / "gloo.py").write_text(GLOO)
    meet = tmp_path / "meet"
    meet.mkdir()
    srun = f"srun --exact --nodes=2 --ntasks=2 --cpus-per-task=1 python {tmp_path}/gloo.py 120 meet {meet} 2"
    info, text = run_job(multinode_cluster, tmp_path, f"{srun} &\n{srun} &\nwait %1 && wait %2")
    assert_ok(info, text)
    assert_met(text, 2, of=2)
    job = info["JobId"]
    assert masters(text) == {f"node1:{job_port(int(job), step=step)}" for step in (0, 1)}, text


@pytest.mark.slow
def test_sweep_array_tasks_spread_over_the_nodes(multinode_cluster, tiny_model, sample_train, tmp_path):
    """`bert-squad sweep --submit` of two seeds whose runs each take a whole node (SBATCH_EXCLUSIVE, as a
    run of all of a node's GPUs would): the two array tasks run at once, one on each node."""
    c = multinode_cluster
    runs = tmp_path / "runs"
    windows = window_args(96, 16, None)
    train = job_train_args(
        tiny_model, sample_train, None, "--no-eval", steps=2, cache=tmp_path / "cache", windows=windows
    )
    env = {**c.env, **job_env(tmp_path, SBATCH_EXCLUSIVE="exclusive")}
    proc = c.run(
        sys.executable,
        "-m",
        "bert_squad",
        "sweep",
        "--site",
        "generic",
        "--seeds",
        "1-2",
        "--runs-dir",
        runs,
        "--submit",
        "--",
        *map(str, train),
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    array_job = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    nodes = []
    for task in ("0", "1"):
        info = c.wait(f"{array_job}_{task}", timeout=600)
        log = (runs / "seeds" / f"slurm-{array_job}_{task}.out").read_text()
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{info}\n{log[-3000:]}"
        nodes.append(info["NodeList"])
    assert sorted(nodes) == [n.name for n in c.nodes], nodes
    for seed in (1, 2):
        metrics = json.loads((runs / "seeds" / f"seed={seed}" / "train_metrics.json").read_text())
        assert metrics["steps"] == 2 and metrics["config"]["train"]["seed"] == seed


@pytest.mark.slow
@pytest.mark.parametrize("how", ["crash", "power-loss"])
def test_lost_node_ends_the_job(multinode_cluster, tmp_path, how):
    """The last node is lost while the ranks are in a gloo loop (its slurmd and the job's processes there
    are killed; for a power loss its link goes down first, so no connection is closed): the job ends (the
    gloo timeout is 15 s and slurm_cluster.py's SlurmdTimeout 20 s; the deadline is generous), and the node
    comes back afterwards."""
    c = multinode_cluster
    victim = c.nodes[-1].name
    (tmp_path / "gloo.py").write_text(GLOO)
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nsrun python {tmp_path}/gloo.py 15 loop\n")
    job, log = submit(
        c, tmp_path, [], job_env(tmp_path), ["--nodes=2", "--ntasks-per-node=2", "--no-requeue"], script=script
    )
    try:
        wait_for_log(c, job, log, r"(?s)(looping.*){4}", timeout=300)
        assert c.kill_node(victim, cut_link=how == "power-loss")
        info, text = finished(c, job, log, timeout=600)
        assert info["JobState"] in ("FAILED", "NODE_FAIL", "CANCELLED"), f"{info}\n{text}"
        if how == "crash":  # the survivors hear of it at once
            assert "Connection closed by peer" in text, text
    finally:
        c.run("scancel", job)
        if c.node(victim).proc is None or c.node(victim).proc.poll() is not None:
            c.kill_node(victim)  # whatever survived there
            c.start_node(victim)
        c.wait_all_idle(timeout=180)


def submit_training(c, tmp_path, launcher, args, requeue=False, nodes=None, **script):
    """A job script (slurm/generic.sbatch unless `script=`) on all nodes, 2 ranks each, as test_slurm.py
    submits it to one node; with `requeue` the job requeues itself after a checkpointed stop and appends to
    its log."""
    env = job_env(tmp_path, BERT_SQUAD_LAUNCHER=launcher, BERT_SQUAD_REQUEUE="1" if requeue else "0")
    options = [
        f"--nodes={nodes or len(c.nodes)}",
        "--ntasks-per-node=2",
        *(["--requeue", "--open-mode=append"] if requeue else ["--no-requeue"]),
    ]
    return submit(c, tmp_path, args, env, options, **script)


def assert_spans_nodes(text, size):
    """Each rank reports its local rank: 0, 1 on every node means the ranks are spread 2 per node."""
    locals_ = dict(re.findall(rf"rank (\d+)/{size} pid \d+ local_rank (\d+)", text))
    assert {int(r): int(lr) for r, lr in locals_.items()} == {r: r % 2 for r in range(size)}, text[-4000:]


@pytest.mark.slow
@LAUNCHERS
def test_generic_sbatch_trains_across_two_nodes(
    multinode_cluster, tiny_model, sample_train, sample_dev, tmp_path, launcher
):
    """The checked-in job script, 2 nodes x 2 ranks, training and evaluating the tiny model."""
    c = multinode_cluster
    size = 2 * len(c.nodes)
    out = tmp_path / "model"
    args = job_train_args(tiny_model, sample_train, out, "--eval-file", sample_dev, cache=tmp_path / "cache")
    job, log = submit_training(c, tmp_path, launcher, args)
    info, text = finished(c, job, log)
    assert_ok(info, text)
    assert f"{len(c.nodes)} node(s), {size} rank(s), nodes node[1-{len(c.nodes)}]" in text, text[:2000]
    assert_one_master(text, job, launcher, "node1", size)
    assert_spans_nodes(text, size)
    assert '"exact_match"' in text, text[-3000:]
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert metrics["world_size"] == size and metrics["steps"] == 4
    # Data parallelism held across the nodes: every rank ends with the same weights.
    digests = metrics["weights_sha256_per_rank"]
    assert len(digests) == size and len(set(digests)) == 1, digests
    # The job's evaluation ran on 4 ranks over 2 nodes; one process on the exported model predicts the same.
    single = tmp_path / "single"
    r = run_bert_squad(
        *inference_args("evaluate", out, sample_dev, single, cache=tmp_path / "cache", windows=JOB_WINDOWS)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (single / "predictions.json").read_bytes() == (out / "predictions.json").read_bytes()


def bare_training(launch, tiny_model, sample_train, tmp_path):
    """A job body: `launch python -m bert_squad` training the tiny model 2 steps, with no job script, so
    bert_squad.distributed.detect alone derives rank, MASTER_ADDR and the port from the launcher's variables."""
    args = job_train_args(tiny_model, sample_train, tmp_path / "model", "--no-eval", steps=2, cache=tmp_path / "cache")
    words = " ".join(map(str, args))
    return f"unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK\n{launch} python -m bert_squad {words}"


OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.mark.slow
@LAUNCHERS
def test_bare_launcher_finds_the_master_across_nodes(multinode_cluster, tiny_model, sample_train, tmp_path, launcher):
    """No job script: `mpirun|srun python -m bert_squad` in a 2-node job, ranks on both nodes: the master is
    the first node of the job (mpirun) or of the step (srun), here both node1."""
    size = 2 * len(multinode_cluster.nodes)
    launch = f"mpirun -np {size} --bind-to none" if launcher == "mpirun" else "srun"
    body = bare_training(launch, tiny_model, sample_train, tmp_path)
    info, text = run_job(multinode_cluster, tmp_path, body, timeout=600, env=job_env(tmp_path, **OFFLINE))
    assert_ok(info, text)
    assert_spans_nodes(text, size)
    assert re.search(rf"rank 0/{size} .*launcher {launcher} master node1:\d+", text), text[-3000:]
    assert json.loads((tmp_path / "model" / "train_metrics.json").read_text())["world_size"] == size


@pytest.mark.slow
def test_a_step_on_the_second_node_of_two_meets_there(multinode_cluster, tiny_model, sample_train, tmp_path):
    """`srun -N1 -w node2` inside a 2-node job: both ranks of the step are on node2 and meet there (not on
    node1, the job's first node, where nothing of the step listens), train and exit."""
    body = bare_training("srun --nodes=1 --ntasks=2 --nodelist=node2", tiny_model, sample_train, tmp_path)
    info, text = run_job(multinode_cluster, tmp_path, body, timeout=600, env=job_env(tmp_path, **OFFLINE))
    assert_ok(info, text)
    assert set(re.findall(r"^rank (\d)/2 .* master (\S+)$", text, re.M)) == {
        ("0", f"node2:{job_port(int(info['JobId']), step=0)}"),
        ("1", f"node2:{job_port(int(info['JobId']), step=0)}"),
    }, text[-3000:]
    assert json.loads((tmp_path / "model" / "train_metrics.json").read_text())["world_size"] == 2


def long_training(tiny_model, sample_train, out, steps=100000, config=FP32):
    """A job's training that logs every step and trains until `steps` (by default until a signal or a lost node
    ends it)."""
    return job_train_args(tiny_model, sample_train, out, "--log-every", "1", "--no-eval", steps=steps, config=config)


@pytest.fixture(scope="module")
def constant_lr(tmp_path_factory):
    """ds_fp32 without its schedule: a run's learning rates do not depend on its total steps, so a run
    stopped and resumed to N steps can be held to an uninterrupted run of N steps whatever N the stop gives."""
    return ds_config(tmp_path_factory.mktemp("constant-lr"), "ds_fp32", drop=["scheduler"])


@pytest.fixture(scope="module")
def uninterrupted(multinode_cluster, tiny_model, sample_train, tmp_path_factory, constant_lr):
    """The weights of an uninterrupted 2-node, 4-rank run of `steps` steps (each count trained once)."""
    runs = {}

    def weights(steps):
        if steps not in runs:
            tmp = tmp_path_factory.mktemp(f"uninterrupted-{steps}")
            args = long_training(tiny_model, sample_train, tmp / "model", steps, constant_lr)
            assert_ok(*finished(multinode_cluster, *submit_training(multinode_cluster, tmp, "srun", args)))
            runs[steps] = load_file(tmp / "model" / "model.safetensors")
        return runs[steps]

    return weights


@pytest.mark.slow
@LAUNCHERS
def test_end_of_job_signal_requeues_and_resumes_to_the_same_weights(
    multinode_cluster, tiny_model, sample_train, tmp_path, launcher, constant_lr, uninterrupted
):
    """USR1 to the batch shell on node1 reaches the ranks on node2 through the launcher: all four stop at
    one step and save one checkpoint, the job exits 75 and requeues itself, and the requeued job resumes
    there and ends with the uninterrupted run's weights, bit for bit. The signal goes once step 3 is
    logged; the first run has no end of its own and the requeued one trains 5 steps past the checkpoint
    (slurm_jobs.resuming_script), so where the signal lands decides the total, not a guess of speed."""
    c = multinode_cluster
    out = tmp_path / "model"
    args = [*long_training(tiny_model, sample_train, out, steps=None, config=constant_lr), "--resume", "auto"]
    job, log = submit_training(c, tmp_path, launcher, args, requeue=True, script=resuming_script(tmp_path, out, 5))
    try:
        wait_for_log(c, job, log, r"step 3/")
        c.run("scancel", "--batch", "--signal=USR1", job)
        wait_for_requeue(c, job, log)
        info, text = finished(c, job, log, timeout=600)
    finally:
        c.run("scancel", job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", f"{info}\n{text[-4000:]}"
    assert "USR1 received" in text and f"requeueing job {job}" in text, text[-4000:]
    stopped_at = int(re.search(r"checkpoint at step (\d+) saved; exiting with 75", text).group(1))
    assert stopped_at >= 3, text[-4000:]
    assert re.search(rf"resumed from \S+/step0*{stopped_at} at step {stopped_at}\b", text), text[-4000:]
    # One checkpoint, written by all four ranks at the same step.
    (tag,) = complete_tags(checkpoint_root(out))
    assert {f"rng_rank{r}.pt" for r in range(4)} <= {p.name for p in (checkpoint_root(out) / tag).iterdir()}
    assert_spans_nodes(text, 2 * len(c.nodes))
    assert json.loads((out / "train_metrics.json").read_text())["steps"] == stopped_at + 5
    weights, reference = load_file(out / "model.safetensors"), uninterrupted(stopped_at + 5)
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[k], reference[k]) for k in weights)


@pytest.mark.slow
@pytest.mark.parametrize("launcher, config", [("mpirun", "ds_fp32"), ("srun", "zero2_bf16")])
def test_training_job_ends_when_a_node_is_lost_and_resumes_on_the_other(
    multinode_cluster, tiny_model, sample_train, tmp_path, launcher, config
):
    """Power loss of the last node mid-training (the job's process-group timeout is 600 s): Slurm ends
    the job as NODE_FAIL once the node misses SlurmdTimeout, whatever the launcher; no hang. The same
    command on the remaining node, 2 ranks instead of 4, resumes from the last checkpoint and finishes:
    ds_fp32's optimizer state loads as it is, ZeRO-2's shards through a universal checkpoint."""
    c = multinode_cluster
    victim = c.nodes[-1].name
    out = tmp_path / "model"
    args = [*long_training(tiny_model, sample_train, out), "--checkpoint-every", "5", "--resume", "auto"]
    if config != "ds_fp32":
        args[args.index("--deepspeed_config") + 1] = zero_on_cpu(tmp_path, 2, bf16=True)
    job, log = submit_training(c, tmp_path, launcher, args)
    try:
        wait_for_log(c, job, log, r"step 6/")  # the first checkpoint is saved
        c.kill_node(victim, cut_link=True)
        info, text = finished(c, job, log, timeout=600)
        assert info["JobState"] in ("NODE_FAIL", "FAILED", "CANCELLED"), f"{info}\n{text[-3000:]}"
        assert f"bert-squad: TERM received; node(s) of this job not responding: {victim}" in text, text[-3000:]

        checkpoint = complete_tags(checkpoint_root(out))[-1]
        steps = int(checkpoint[4:]) + 10
        args[args.index("--max-steps") + 1] = steps
        again, log = submit_training(c, tmp_path, launcher, args, nodes=1)
        info, text = finished(c, again, log, timeout=600)
    finally:
        c.run("scancel", job)
        c.kill_node(victim)
        c.start_node(victim)
        c.wait_all_idle(timeout=180)
    assert_ok(info, text)
    assert info["NodeList"] == c.nodes[0].name, info
    how = "optimizer state whole (ZeRO stage 0)" if config == "ds_fp32" else "universal checkpoint (converted in"
    assert f"at step {int(checkpoint[4:])}, written by 4 ranks, on 2 ranks: {how}" in text, text[-3000:]
    metrics = json.loads((out / "train_metrics.json").read_text())
    assert (metrics["world_size"], metrics["train_batch_size"], metrics["steps"]) == (2, 64, steps)
