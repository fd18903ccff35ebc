"""Process-group set-up from whatever started the processes: mpirun, PMI, srun, torchrun or nothing.

Everything is normalised to RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT before
DeepSpeed sees it, so DeepSpeed never runs its own MPI discovery (whose `hostname -I` guess picks the
wrong interface on many clusters).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import hostlist
import torch
import torch.distributed as td

from bert_squad import transport
from bert_squad.errors import UserError, first_line

DEFAULT_PORT = 29500
T = TypeVar("T")


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job, detected once and passed down."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # which variables told us: env, mpirun, pmi, srun or single
    run: str  # which run of which job the ranks are (`run_name`), checked where they meet (`rendezvous`)
    retries: tuple[int, ...] = ()  # where the rendezvous tries next, in order, if master_port is taken (`retries`)
    attempt: int = 0  # torchrun's restart count (TORCHELASTIC_RESTART_COUNT): an attempt's rank claims its own

    @property
    def ports(self) -> tuple[int, ...]:
        """Where the rendezvous tries, in order."""
        return (self.master_port, *self.retries)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# The rendezvous ports: 20000-32095, below Linux's default range of ephemeral ports (32768-60999), where any
# outgoing connection could take a port first, a rank's own connection to the rendezvous included (a TCP
# self-connect, which leaves rank 0 unable to listen and the others waiting on themselves). A Slurm job's batch
# step and srun steps take 20000-27999 (`job_port`), mpiruns 28000-32095 (`mpirun_port`), so the two never meet.
JOB_BASE, JOB_PORTS, JOB_KEYS = 20000, 8000, 8
MPIRUN_BASE, MPIRUN_PORTS = JOB_BASE + JOB_PORTS, 4096


def job_port(job_id: int, step: int | None = None) -> int:
    """The rendezvous port of a run of Slurm job `job_id`: of its batch step (key 0), or of its srun step
    `step` (key 1 + step). The one definition, so that every rank derives the same port (the job script leaves
    MASTER_PORT unset): JOB_BASE + (JOB_KEYS x job + key) mod JOB_PORTS.

    Each job has JOB_KEYS (8) ports of its own from JOB_BASE + 8 x (job mod 1000) on, and its keys go on from
    there into the next jobs' ports. So the runs of one job never share a port, however many run at once: its
    batch step and its steps 0 to 7998 all meet apart. Jobs whose ids differ mod 1000 (jobs that share a node at
    once have ids within 1000 of each other) never share a port while their keys stay below 8 (the batch step
    and steps 0 to 6); a job's step s from 7 on can meet the run of key (s + 1) mod 8 of job id + (s + 1) // 8,
    which its rendezvous then refuses (`rendezvous`). Where a site reserves ports for steps, a step takes one of
    those instead (`step_port`)."""
    key = 0 if step is None else 1 + step
    return JOB_BASE + (JOB_KEYS * job_id + key) % JOB_PORTS


RETRIES = 3  # the ports a run tries after its own, where that is taken


def retries(first: int) -> tuple[int, ...]:
    """The ports a run's rendezvous tries, in order, where its own (`first`, from `job_port`, `mpirun_port` or the
    default) is taken: RETRIES of them, the same on every rank (derived from `first` alone) and spread over the
    rendezvous ports, so that a port another run holds (a job's step 7 or later takes a later job's: `job_port`)
    costs a retry, not the run. At each the run's identity is checked (`rendezvous`)."""
    ports, i = [first], 0
    while len(ports) <= RETRIES:
        i += 1
        port = JOB_BASE + zlib.crc32(f"{first}/{i}".encode()) % (JOB_PORTS + MPIRUN_PORTS)
        if port not in ports:
            ports.append(port)
    return tuple(ports[1:])


def mpirun_port(namespace: str) -> int:
    """The rendezvous port of the ranks of one mpirun, whose PMIx `namespace` every rank shares:
    MPIRUN_BASE + (`_mpirun_number`) mod MPIRUN_PORTS. Not the job's: under Slurm mpirun runs on the job's first
    node, where its master is, and the mpiruns of one host, of one job or of several, differ in their number by
    their PIDs. Two of them share a port only if their PIDs are equal in their low 12 bits (for PIDs below
    65536; Open MPI 4 folds larger ones), so those started within 4096 processes of each other never do."""
    return MPIRUN_BASE + _mpirun_number(namespace) % MPIRUN_PORTS


def _mpirun_number(namespace: str) -> int:
    """What tells the mpiruns of one host apart in their PMIx namespace. Open MPI 4's (ORTE) is mpirun's job id
    in decimal: its upper 16 bits are a hash of mpirun's host name XOR its PID, folded to 16 bits, the lower the
    job's number in mpirun (1): plm_base_jobid.c. Open MPI 5's (PRRTE) is `prterun-<host>-<pid>@<job>`, the PID
    itself. Any other (another launcher's): a checksum of its text."""
    if namespace.isdigit():
        return int(namespace) >> 16
    prrte = re.search(r"-(\d+)@\d+$", namespace)
    return int(prrte.group(1)) if prrte else zlib.crc32(namespace.encode())


def step_port(env: Mapping[str, str], job_id: int, step: int) -> int:
    """The port of srun step `step`: the last of the ports Slurm reserved for it where the site has it reserve
    them (MpiParams=ports=, SLURM_STEP_RESV_PORTS, the same on every node of the step and taken by no other step
    on them while it runs; Cray's PMI takes the first), else `job_port`'s."""
    reserved = env.get("SLURM_STEP_RESV_PORTS")
    if reserved is None:
        return job_port(job_id, step)
    last = int(re.findall(r"\d+", reserved)[-1]) if re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", reserved) else 0
    if not 0 < last < 65536:
        raise UserError(f"SLURM_STEP_RESV_PORTS={reserved}: not Slurm's list of reserved ports (12000-12002)")
    return last


# Where each launcher puts (rank, world size, local rank); the explicit RANK/WORLD_SIZE come first and win.
SOURCES = [
    ("env", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    # srun sets SLURM_STEP_NUM_TASKS; the batch shell has SLURM_NTASKS of the whole job.
    ("srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"),
]


def started_by_launcher(env: Mapping[str, str] | None = None) -> bool:
    """Whether mpirun, PMI or srun started this process, even when RANK is set too (the job template
    sets it): Open MPI gives its ranks a pty that nobody watches."""
    env = os.environ if env is None else env
    return any(rank_var in env and size_var in env for _, rank_var, size_var, _ in SOURCES[1:])


def detect(env: Mapping[str, str] | None = None) -> DistEnv:
    """Rank layout from the launcher's variables; the explicit RANK/WORLD_SIZE set wins. Every variable is
    checked where it is read: a value that is no number, or a layout that cannot be, is one line naming it."""
    env = os.environ if env is None else env
    if ("RANK" in env) != ("WORLD_SIZE" in env):  # only a person sets one of them: each launcher sets both
        given, missing = ("RANK", "WORLD_SIZE") if "RANK" in env else ("WORLD_SIZE", "RANK")
        raise UserError(f"{given}={env[given]} is set without {missing}: set both, or neither")
    for launcher, rank_var, size_var, local_var in SOURCES:  # noqa: B007 (the one it breaks at is read after it)
        if rank_var in env and size_var in env:
            size = env_number(env, size_var, low=1)
            rank = env_number(env, rank_var, high=size - 1, of=f" (with {size_var}={env[size_var]})")
            local_var = local_var if local_var in env else "PALS_LOCAL_RANKID"
            local = env_number(env, local_var) if local_var in env else rank
            break
    else:
        launcher, rank, size, local = "single", 0, 1, 0
    addr, port, derived = _master(env, size)
    attempt = env_number(env, "TORCHELASTIC_RESTART_COUNT") if "TORCHELASTIC_RESTART_COUNT" in env else 0
    again = retries(port) if derived else ()
    return DistEnv(rank, size, local, addr, port, launcher, run_name(env, size), again, attempt)


def env_number(env: Mapping[str, str], name: str, low: int = 0, high: int | None = None, of: str = "") -> int:
    """The whole number in env[name], or a UserError naming the variable, its value and the range (`of`: why)."""
    value = env[name]
    try:
        number = int(value)
    except ValueError:
        raise UserError(f"{name}={value}: not a whole number") from None
    if number < low or (high is not None and number > high):
        bound = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise UserError(f"{name}={value}: must be {bound}{of}")
    return number


def _srun_step(env: Mapping[str, str], size: int) -> bool:
    """Whether srun started every rank as a task of one step: not mpirun, and the step has `size` tasks."""
    return "OMPI_COMM_WORLD_SIZE" not in env and env.get("SLURM_STEP_NUM_TASKS") == str(size) and "SLURM_STEP_ID" in env


def slurm_rendezvous(env: Mapping[str, str], size: int) -> tuple[str, int] | None:
    """Where the `size` ranks of a Slurm job meet: (the variable whose first node is the master, the port);
    None outside a Slurm job.

    When srun started every rank as a task of one step, they meet on the step's first node, which need not
    be the job's (`srun -N1` on the second node of two), at the step's port (`step_port`), so the steps of
    one job meet apart. mpirun's ranks share no step (those on other nodes than mpirun's own are in its
    daemons' step, the others in none): rank 0 runs on the job's first node, and mpirun's PMIx namespace,
    the same on every rank, picks the port (`mpirun_port`)."""
    if "SLURM_JOB_ID" not in env:
        return None
    job = env_number(env, "SLURM_JOB_ID")
    if _srun_step(env, size):
        nodes = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in env else "SLURM_JOB_NODELIST"
        return nodes, step_port(env, job, env_number(env, "SLURM_STEP_ID"))
    namespace = env.get("PMIX_NAMESPACE")
    return "SLURM_JOB_NODELIST", mpirun_port(namespace) if namespace else job_port(job)


def run_name(env: Mapping[str, str], size: int) -> str:
    """The run the `size` ranks are, as each of them names it alike from its launcher's variables, for the
    rendezvous to tell its own ranks from a stranger's: "job 4242 step 3 (2 ranks)", "job 4242 mpirun
    1333723137 (2 ranks)", "mpirun 1333723137 (2 ranks)" outside Slurm, "torchrun <its run id> (2 ranks)" (the
    rendezvous id, a fresh one for each --standalone run), "a run (2 ranks)" where nothing names it."""
    names = [f"job {env['SLURM_JOB_ID']}"] if "SLURM_JOB_ID" in env else []
    if names and _srun_step(env, size):
        names.append(f"step {env['SLURM_STEP_ID']}")
    elif "PMIX_NAMESPACE" in env:
        names.append(f"mpirun {env['PMIX_NAMESPACE']}")
    if "TORCHELASTIC_RUN_ID" in env:
        names.append(f"torchrun {env['TORCHELASTIC_RUN_ID']}")
    return f"{' '.join(names) or 'a run'} ({size} ranks)"


def _master(env: Mapping[str, str], size: int) -> tuple[str, int, bool]:
    """MASTER_ADDR and MASTER_PORT: as exported, else from Slurm's step or job, else this machine; and whether
    the port is derived by a rule that others may meet (`retries`), not given (exported, reserved by Slurm)."""
    slurm = None if "MASTER_ADDR" in env and "MASTER_PORT" in env else slurm_rendezvous(env, size)
    if "MASTER_ADDR" in env:
        addr = env["MASTER_ADDR"]
        if not addr.strip():
            raise UserError("MASTER_ADDR is set but empty: unset it or give the first node's address")
    elif slurm and slurm[0] in env and size > 1:
        addr = _first_host(env, slurm[0])
    elif size == 1 or _single_node(env, size):
        addr = "127.0.0.1"
    else:
        raise UserError(
            "cannot tell the master address of a multi-node run: set MASTER_ADDR "
            "(under Slurm each rank takes the first node of its step, or of its job under mpirun)"
        )
    if "MASTER_PORT" in env:
        return addr, env_number(env, "MASTER_PORT", low=1, high=65535), False
    if slurm:
        return addr, slurm[1], "SLURM_STEP_RESV_PORTS" not in env or not _srun_step(env, size)
    if "PMIX_NAMESPACE" in env and size > 1:  # mpirun outside Slurm: two of them on one machine must not meet
        return addr, mpirun_port(env["PMIX_NAMESPACE"]), True
    return (addr, DEFAULT_PORT, True) if size > 1 else (addr, _free_port(), False)


def _first_host(env: Mapping[str, str], name: str) -> str:
    """The first node of the Slurm node list in env[name] (python-hostlist reads Slurm's notation)."""
    nodelist = env[name]
    try:
        return hostlist.expand_hostlist(nodelist)[0]
    except (hostlist.BadHostlist, IndexError) as err:
        raise UserError(f"{name}={nodelist}: not a Slurm node list ({err or 'empty'})") from None


def _single_node(env: Mapping[str, str], size: int) -> bool:
    for name in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if name in env:
            return env_number(env, name, low=1) == size
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What DeepSpeed and torch.distributed read from the environment, exported while a process group lives.
RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def process_group(dist: DistEnv, timeout_s: float = 600) -> Iterator[torch.device]:
    """The process group for the body of a command, yielding this rank's torch device.

    On the way out every rank waits for the others and the group is destroyed while the interpreter
    is still whole: a gloo rank that simply exits while a peer still works dies in C++
    (`terminate called without an active exception`, exit 134; pytorch/pytorch#190489).
    After an error there is no barrier, so a failing rank cannot hang the job on its way out. DeepSpeed
    destroys it, so that it also forgets the groups it cloned from it: a second command in the same process
    (an API user, the in-process CLI fuzz) failed on the stale clone in deepspeed.initialize. The rank
    variables are the process's only while the group lives."""
    previous = {var: os.environ.get(var) for var in RANK_VARS}
    os.environ.update(
        zip(RANK_VARS, map(str, (dist.rank, dist.world_size, dist.local_rank, dist.master_addr, dist.master_port)))
    )
    ok = False
    try:
        yield _init(dist, timeout_s)
        ok = True
    finally:
        if is_initialized():
            import deepspeed.comm  # loaded: the group was started through it

            if ok:
                td.barrier()
            deepspeed.comm.destroy_process_group()
        for var, value in previous.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def _init(dist: DistEnv, timeout_s: float) -> torch.device:
    """Bind this rank's GPU (if any) and start the process group on the run's own store; returns the torch
    device. DeepSpeed takes the group as it finds it."""
    import deepspeed  # heavy: only commands that start a process group

    # Imported before the group starts, not by the first forward (transformers 4.x imports it there): imported
    # while a group lives, torch._dynamo keeps references to it that outlive destroy_process_group, so gloo's
    # worker threads live on into interpreter shutdown, where one of them aborts the rank (exit 134).
    import torch._dynamo  # noqa: F401 (imported for what importing it does, above)
    from deepspeed.accelerator import get_accelerator

    acc, device = get_accelerator(), rank_device(dist)
    if device.type != "cpu":
        acc.set_device(device.index)
    timeout = timedelta(seconds=timeout_s)
    with transport.debug_file(device.type != "cpu") as log:  # which network the collectives come up on
        store = rendezvous(dist, timeout)
        os.environ["MASTER_PORT"] = str(store.port)  # where it met: the first of its ports, or a later one
        td.init_process_group(
            acc.communication_backend_name(),
            store=store,
            rank=dist.rank,
            world_size=dist.world_size,
            timeout=timeout,
            # As DeepSpeed binds it: NCCL's communicator comes up on this rank's GPU (not a peer's, nor for one rank)
            device_id=device if device.type == "cuda" and dist.world_size > 1 else None,
        )
        deepspeed.init_distributed(
            dist_backend=acc.communication_backend_name(), auto_mpi_discovery=False, timeout=timeout
        )
        if log:
            barrier()  # NCCL/RCCL create their communicator, and choose its network, at the first collective
            transport.report(dist.rank, log)
    return device


@contextlib.contextmanager
def alone() -> Iterator[torch.device]:
    """The device of a command's one process, which meets no other and starts no process group: the first GPU
    torch sees (CUDA or ROCm), else the CPU; every collective here is then a rank's own (`is_initialized`)."""
    yield torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def rank_device(dist: DistEnv) -> torch.device:
    """This rank's device: the GPU its local rank picks among those it sees, or the CPU."""
    from deepspeed.accelerator import get_accelerator  # heavy: only commands that start DeepSpeed

    acc = get_accelerator()
    if acc.device_name() == "cpu":
        return torch.device("cpu")
    return torch.device(acc.device_name(dist.local_rank % acc.device_count()))


# Where the run's store holds its name, set by rank 0 and read by the others before they join; how long they
# wait for it: rank 0 sets it as soon as its store listens, before any other rank can reach it. Each rank then
# claims its number there (RUN_KEY/rank/<attempt>/<rank>). How long a rank waits at one of several ports for a
# listener before it looks at the next (and comes back: rank 0 may start later than the others).
RUN_KEY = "bert_squad/run"
RUN_KEY_WAIT = timedelta(seconds=15)
PORT_WAIT = timedelta(seconds=2)
PORTS_DOC = "(docs/clusters.md, 'How the ranks start')"
FIX = "export MASTER_PORT with a free port " + PORTS_DOC


def rendezvous(dist: DistEnv, timeout: timedelta) -> td.TCPStore:
    """The run's torch.distributed store, which rank 0 serves at the first of the run's ports (`DistEnv.ports`)
    it can listen on, once this rank has seen that it is its own run's: rank 0 writes the run's name (`run_name`:
    job, step, mpirun or torchrun, world size) unless the store holds another's, the others read it and go on to
    the next port where it is another run's, and every rank claims its number, which a rank of a second run of
    the same name finds taken. A port another run holds so costs a retry, and two runs on one port that has no
    other (an exported MASTER_PORT twice) fail in one line each within seconds, instead of mixing: the second's
    rank 0 cannot listen, its other ranks find the first's store and name both runs, or their number taken."""
    store = _serve(dist) if dist.rank == 0 else _join(dist, timeout)
    store.set_timeout(timeout)
    token = secrets.token_hex(8)
    if store.compare_set(f"{RUN_KEY}/rank/{dist.attempt}/{dist.rank}", "", token).decode() != token:
        where = f"{dist.master_addr}:{store.port}"
        raise UserError(f"rank {dist.rank} of {dist.run} met another rank {dist.rank} of its name at {where}: {FIX}")
    return store


def _serve(dist: DistEnv) -> td.TCPStore:
    """Rank 0's store, at the first of the run's ports it can listen on, with the run's name in it."""
    for port in dist.ports:
        try:  # (under torchrun's agent store the library joins the agent's store instead: its port is the agent's)
            store = td.TCPStore(dist.master_addr, port, dist.world_size, True, wait_for_workers=False)
            break
        except td.DistNetworkError as err:
            taken = "EADDRINUSE" in str(err)
            if not taken or port == dist.ports[-1]:
                why = f"its port is another run's or program's: {FIX}" if taken else first_line(err)
                raise UserError(f"rank 0 of {dist.run} found no rendezvous at {_tried(dist, port)}: {why}") from None
    where = f"{dist.master_addr}:{port}"
    found = store.compare_set(RUN_KEY, "", dist.run).decode(errors="replace")
    if found != dist.run:  # a store the library shares (torchrun's agent's) that another run named
        raise UserError(f"rank 0 of {dist.run} met {found} at {where}, two runs on one port: {FIX}")
    if port != dist.master_port:
        print(
            f"rank 0 of {dist.run}: {_tried(dist, dist.ports[dist.ports.index(port) - 1])} taken, meeting at {where}",
            flush=True,
        )
    return store


def _join(dist: DistEnv, timeout: timedelta) -> td.TCPStore:
    """The store of this rank's own run: at its one port, waited for until `timeout`; or at the first of its
    ports whose store holds the run's name, each looked at in turn for a short while (rank 0 may start after
    this rank) until `timeout`."""
    deadline, met, one = time.monotonic() + timeout.total_seconds(), "", len(dist.ports) == 1
    while True:
        for port in dist.ports:
            where, left = f"{dist.master_addr}:{port}", deadline - time.monotonic()
            if left <= 0:
                raise UserError(
                    f"rank {dist.rank} of {dist.run} found no rendezvous of its own at "
                    f"{_tried(dist, dist.ports[-1])} in {timeout.total_seconds():g}s{met}"
                )
            wait = timeout if one else min(PORT_WAIT, timedelta(seconds=left))
            try:
                store = td.TCPStore(
                    dist.master_addr, port, dist.world_size, False, timeout=wait, wait_for_workers=False
                )
            except td.DistNetworkError as err:
                if one:
                    raise UserError(
                        f"rank {dist.rank} of {dist.run} found no rendezvous at {where}: {first_line(err)}"
                    ) from None
                continue
            found = _name(store)
            if found == dist.run:
                return store
            if one:
                raise UserError(f"rank {dist.rank} of {dist.run} met {found} at {where}, two runs on one port: {FIX}")
            met = f" (met {found} at {where})"


def _name(store: td.TCPStore) -> str:
    """The run a store's rank 0 named in it, waited for a short while."""
    store.set_timeout(RUN_KEY_WAIT)
    try:
        return store.get(RUN_KEY).decode(errors="replace")
    except td.DistStoreError:
        return "a store that is no bert-squad run's"


def _tried(dist: DistEnv, last: int) -> str:
    """The address and the ports tried up to `last`: "host:20042", or "host:20042, 27311, 22108"."""
    ports = dist.ports[: dist.ports.index(last) + 1] if last in dist.ports else (last,)
    return f"{dist.master_addr}:{', '.join(map(str, ports))}"


def is_initialized() -> bool:
    return td.is_available() and td.is_initialized()


def barrier() -> None:
    if is_initialized():
        td.barrier()


@contextlib.contextmanager
def rank_zero_first(dist: DistEnv | None = None) -> Iterator[None]:
    """Rank 0 does the work (and writes caches) while the others wait, then they reuse its result."""
    rank = dist.rank if dist else 0
    if rank != 0:
        barrier()
    yield
    if rank == 0:
        barrier()


def gather_to_rank0(obj: T, dist: DistEnv) -> list[T] | None:
    """Python objects of every rank, in rank order, on rank 0 (None elsewhere)."""
    if not is_initialized():
        return [obj]
    out: list[Any] | None = [None] * dist.world_size if dist.rank == 0 else None
    td.gather_object(obj, out, dst=0)
    return out


def gather_padded_to_rank0(mine: torch.Tensor, widths: Sequence[int], dist: DistEnv) -> list[torch.Tensor] | None:
    """Every rank's tensor, in rank order, on rank 0 (None elsewhere); rank r's last dimension is `widths[r]`
    long (every rank knows them all), its other dimensions the same on all. Each goes as one fixed-shape
    tensor padded to the widest, not as a pickled object: a rank holds only its own share, and rank 0 the
    gathered ones."""
    if not is_initialized():
        return [mine]
    padded = torch.zeros((*mine.shape[:-1], max(widths)), dtype=mine.dtype, device=_backend_device())
    padded[..., : mine.shape[-1]] = mine
    out = [torch.empty_like(padded) for _ in widths] if dist.rank == 0 else None
    td.gather(padded, out, dst=0)
    return None if out is None else [t[..., :width].cpu() for t, width in zip(out, widths)]


def broadcast_from_rank0(obj: T) -> T:
    """Rank 0's Python object, on every rank."""
    if not is_initialized():
        return obj
    box = [obj]
    td.broadcast_object_list(box, src=0)
    return box[0]


def backend() -> str:
    return td.get_backend() if is_initialized() else "none"


def _backend_device() -> torch.device:
    """Where the process group's collectives take their tensors: NCCL (and RCCL, under the same name) this
    rank's GPU, gloo the host."""
    return torch.device("cuda", torch.cuda.current_device()) if td.get_backend() == "nccl" else torch.device("cpu")


def _reduce(values: Sequence[float], op: Any) -> list[float]:
    """One small all-reduce, read back on the host: a host sync (it waits for the kernels queued before it)."""
    t = torch.tensor(values, dtype=torch.float64, device=_backend_device())
    td.all_reduce(t, op=op)
    return t.tolist()


def all_sum(values: Sequence[float]) -> list[float]:
    """Element-wise sum of a list of numbers over all ranks."""
    if not is_initialized():
        return list(values)
    return _reduce(values, td.ReduceOp.SUM)


def all_max(values: Sequence[float]) -> list[float]:
    """Element-wise maximum of a list of numbers over all ranks."""
    if not is_initialized():
        return list(values)
    return _reduce(values, td.ReduceOp.MAX)


# How far apart in training time the ranks look for a stop request: Slurm's end-of-job warning comes 300 s
# before the limit (--signal=B:USR1@300), and the checkpoint that follows must fit in what is left.
STOP_CHECK_SECONDS = 10.0


class StopCheck:
    """How ranks agree to stop at the same step without a collective after every step.

    Ranks look only at steps every rank knows alike: the ones the caller names (the log steps, where the
    host waits anyway), the first one, and in between the step about STOP_CHECK_SECONDS on at the slowest
    rank's pace since the last look. That pace is part of the look's own all-reduce (a maximum over ranks),
    so every rank schedules the same next step from the same number."""

    def __init__(self, step: int, seconds: float = STOP_CHECK_SECONDS) -> None:
        self.seconds, self.last_step, self.next_step = seconds, step, step + 1
        self.since = time.perf_counter()

    def stopping(self, step: int, requested: bool, look: bool = False) -> bool:
        """True on every rank, at the same step, once any rank's `requested` was seen at a look."""
        if not (look or step >= self.next_step):
            return False
        now = time.perf_counter()
        flag, pace = all_max([1.0 if requested else 0.0, (now - self.since) / max(step - self.last_step, 1)])
        self.since, self.last_step = now, step
        self.next_step = step + max(1, int(self.seconds / max(pace, 1e-6)))
        return flag > 0
