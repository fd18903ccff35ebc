"""Which network NCCL's (or RCCL's) collectives came up on, read from the library's own debug output.

On a GPU a rank asks the library, as its process group starts, for its INIT and NET debug lines in a
file of the rank's own (`debug_file`); after the first collective, `report` reads there what came up and puts it
in the rank's log: "Using network <name>" (NCCL's src/init.cc; RCCL's is the same line), and for the
libfabric plugin (aws-ofi-nccl, aws-ofi-rccl) the version and the provider it selected. Where the job
script says the site configures that plugin (BERT_SQUAD_NETWORK=ofi, in slurm/<site>.sbatch), a rank that finds
the collectives on TCP sockets instead says so as a warning: on Slingshot that is more than an order of
magnitude slower (CSCS's 2-node all-reduce of 128 MiB: 122.6 GB/s bus bandwidth through the plugin, 5.4
without the CXI hook; cscs-docs software/communication/nccl.md). A user who sets NCCL_DEBUG keeps the
library's output where it goes, and no report is made.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass

from bert_squad.files import scratch

# The names NCCL gives the networks that reach it through libfabric: the plugin's "Libfabric", "AWS
# Libfabric" (up to 1.11, or NCCL_NET="AWS Libfabric") or "OFI" (NCCL_NET=OFI): aws-ofi-nccl's
# src/nccl_ofi_interface_nvidia.cpp. NCCL's own are "Socket" and "IB".
OFI_NETWORKS = ("Libfabric", "AWS Libfabric", "OFI")
SITE_NETWORK_VAR = "BERT_SQUAD_NETWORK"  # set by the site job script (slurm/<site>.sbatch)

NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
NOT_FOUND = re.compile(r"NCCL WARN Error: network (.+?) not found")
PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is (\w+)"
)  # 1.6: "Provider is cxi (...)"; 1.19: "provider is cxi, ..."
PLUGIN = re.compile(r"NET/OFI (?:Initializing|Using) (aws-ofi-[nr]ccl \S+)")
SOCKETS = re.compile(r"NET/Socket : Using (.+?)\s*$")


@dataclass(frozen=True)
class Transport:
    """What one rank's NCCL/RCCL said about its network; None where it said nothing."""

    network: str | None = None  # NCCL's name: "Libfabric", "AWS Libfabric", "OFI", "Socket", "IB", ...
    provider: str | None = None  # the libfabric provider the plugin selected: cxi, efa, ...
    plugin: str | None = None  # "aws-ofi-nccl 1.19.0"
    interfaces: str | None = None  # the socket transport's: "[0]ens7:10.128.0.31<0>"
    missing: str | None = None  # a network asked for (NCCL_NET) that NCCL could not find

    @property
    def ofi(self) -> bool:
        """Whether the collectives run through the libfabric plugin."""
        return self.network in OFI_NETWORKS or (self.network is None and self.provider is not None)

    def describe(self) -> str:
        if self.missing:
            return f"no network: NCCL did not find network {self.missing!r} (NCCL_NET)"
        if self.network is None and self.provider is None:
            return "an unknown network (no 'Using network' line in NCCL's debug output)"
        if self.ofi:
            details = ", ".join(x for x in (self.plugin, self.provider and f"provider {self.provider}") if x)
            return f"network {self.network or 'OFI'} (the libfabric plugin{': ' + details if details else ''})"
        if self.network == "Socket":
            return f"network Socket (TCP sockets{' on ' + self.interfaces if self.interfaces else ''})"
        return f"network {self.network}"


def parse(lines: Iterable[str]) -> Transport:
    """The Transport that NCCL/RCCL debug lines describe (any prefix: host:pid:tid [dev], timestamps)."""
    found: dict[str, str] = {}
    for line in lines:
        for key, pattern in (
            ("network", NETWORK),
            ("missing", NOT_FOUND),
            ("provider", PROVIDER),
            ("plugin", PLUGIN),
            ("interfaces", SOCKETS),
        ):
            m = pattern.search(line)
            if m and key not in found:
                found[key] = m.group(1)
    return Transport(**found)


DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


@contextlib.contextmanager
def debug_file(on_gpu: bool, environ: MutableMapping[str, str] = os.environ) -> Iterator[str | None]:
    """While a process group starts on a GPU (`on_gpu`), NCCL/RCCL's INIT and NET debug lines asked for in a file
    of this rank's own, whose path is yielded for `report`; None on a CPU, or where the user set NCCL_DEBUG (their
    output goes where they said). The file is `files.scratch`'s in the temporary directory, which the ranks of a
    node share (a PID names no rank's own there: ranks in containers of their own PID namespace share /tmp). It
    is made here, when a group is about to use it, not for commands that start none (`config`, a refusal before
    the group), and on the way out, however the group's start ended, the file is gone and the variables are
    as they were (NCCL reads them once, when its first communicator comes up)."""
    if not on_gpu or environ.get("NCCL_DEBUG"):
        yield None
        return
    before = {var: environ.get(var) for var in DEBUG_VARS}
    path = str(scratch(tempfile.gettempdir(), "bert-squad-nccl"))
    try:
        environ.update(zip(DEBUG_VARS, ("INFO", "INIT,NET", path)))
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        for var, value in before.items():
            if value is None:
                environ.pop(var, None)
            else:
                environ[var] = value


def report(rank: int, path: str, environ: MutableMapping[str, str] = os.environ) -> Transport:
    """After the library's first collective: the rank's log line(s) on its network, from `path`."""
    try:
        with open(path, errors="replace") as f:
            found = parse(f)
    except OSError:
        found = Transport()
    print(f"rank {rank}: collectives over {found.describe()}", flush=True)
    if environ.get(SITE_NETWORK_VAR) == "ofi" and found.network == "Socket":
        print(
            f"rank {rank}: warning: this site's collectives should run over its libfabric plugin "
            f"(Slingshot), not {found.describe()}: expect them many times slower; see the job's container "
            f"settings (docs/clusters.md, 'Which network the collectives use')",
            file=sys.stderr,
            flush=True,
        )
    return found
