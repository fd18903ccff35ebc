#!/usr/bin/env python
"""On paper, past the machines we have: predicted training samples/s of BERT-base and BERT-large (SQuAD,
sequence 384) on 1 to 64 nodes of Daint (CSCS Alps, GH200) and LUMI-G, from a simple step-time model.

    python bench/scaling.py [--json]

Step time of one optimizer step on every rank =
  compute: k micro batches x micro x FLOPs per sample / (MFU x peak), FLOPs per sample = 6 x dense
           parameters x tokens + 12 x layers x seq^2 x hidden (attention scores and their use, fwd + bwd);
  gradient all-reduce: ring, 2 (n-1)/n x gradient bytes / bandwidth + 2 (n-1) x latency, once per step
           (inside a node over NVLink or Infinity Fabric, then between nodes over the node's NICs);
  overlapped: only the backward pass (2/3 of compute) hides communication; plain: it adds up.
ZeRO-2 moves the same volume (reduce-scatter + all-gather) but frees (n-1)/n of the gradients and
optimizer states, so a bigger micro batch fits (activations per sample from Korthikanti et al. 2022);
its all-gather, after the optimizer step, is not hidden. Accumulation k runs k micro batches per
all-reduce. Weak scaling keeps the batch per GPU (the global batch grows with the nodes); the last
column keeps the global batch, so each GPU's share shrinks. Every figure is an assumption to argue with.
"""

import argparse
import json
from dataclasses import dataclass

NODES = (1, 2, 4, 8, 16, 32, 64)
SEQ = 384
GRAD_BYTES = 2  # fp16/bf16 gradients are all-reduced: 2 x parameter bytes
STATE_BYTES = 16  # per parameter: fp16 weights and gradients (2 + 2) + fp32 master weights, Adam m, v (12)
KNEE_EFFICIENCY = 0.8  # the knee: the last node count at which samples/s per GPU is >= 80% of one GPU's
PER_GPU = 16  # samples per GPU an optimizer step: the shipped DeepSpeed configs' micro batch
GLOBAL_BATCH = 1024  # the fixed global batch of the strong-scaling column (SQuAD v1.1: ~88k features an epoch)
STRONG = f"global {GLOBAL_BATCH}"


@dataclass(frozen=True)
class Model:
    name: str
    params: float  # all of them: the gradient that is all-reduced
    layers: int
    hidden: int
    heads: int

    @property
    def dense_params(self):  # what the matmuls touch per token (embedding look-ups are no FLOPs)
        return 12 * self.layers * self.hidden**2

    def flops_per_sample(self):
        return 6 * self.dense_params * SEQ + 12 * self.layers * SEQ**2 * self.hidden

    def activation_bytes_per_sample(self):
        """Korthikanti et al. 2022 (arXiv:2205.05198), eq. 2: s h (34 + 5 a s / h) bytes a layer, 16-bit."""
        return self.layers * SEQ * self.hidden * (34 + 5 * self.heads * SEQ / self.hidden)


@dataclass(frozen=True)
class System:
    name: str
    gpus_per_node: int
    peak_tflops: float  # 16-bit, per GPU (a LUMI GCD counts as one)
    mfu: float  # assumed fraction of peak reached
    memory_gib: float  # per GPU
    node_gb_s: float  # injection bandwidth per node, one direction
    latency_us: float  # per message between nodes
    intra_gb_s: float = 0.0  # ring bandwidth between the GPUs of a node (0: one GPU a node)


MODELS = (Model("BERT-base", 110e6, 12, 768, 12), Model("BERT-large", 340e6, 24, 1024, 16))
SYSTEMS = (
    # Alps GH200 nodes (cscs-docs alps/hardware.md and its images/alps/gh200-schematic.svg): 4 GH200 a node,
    # each GPU ~94 GB HBM3 and joined to each of the other 3 by 6 NVLinks, 150 GB/s a direction; 4 Slingshot-11
    # NICs x 200 Gb/s (25 GB/s) = 100 GB/s a node. 989 TFLOP/s bf16 dense is NVIDIA's H100 figure (bert_squad/perf.py);
    # CSCS caps a module at 660 W (clusters/daint.md), so the MFU assumed is LUMI's (25%), not a measurement.
    System("Daint", 4, 989.0, 0.25, 94, 100.0, 2.5, intra_gb_s=150.0),
    # 4 MI250X = 8 GCDs a node, 191.5 TFLOP/s bf16 matrix each; 4 Slingshot-11 NICs x 200 Gb/s = 100 GB/s
    # a node; GCDs joined by Infinity Fabric links of 50 GB/s.
    System("LUMI-G", 8, 191.5, 0.25, 64, 100.0, 2.5, intra_gb_s=50.0),
)


def fits(model, system, ranks, zero2):
    """The largest micro batch one GPU holds, 10% of its memory left to the framework."""
    shards = ranks if zero2 else 1
    states = model.params * (2 + (STATE_BYTES - 2) / shards)  # ZeRO-2 keeps only the 16-bit weights whole
    return max(1, int((0.9 * system.memory_gib * 2**30 - states) // model.activation_bytes_per_sample()))


def allreduce_s(model, system, nodes):
    """Ring all-reduce of the gradient: inside the node (LUMI's 8 GCDs), then between the nodes."""
    grad, t = GRAD_BYTES * model.params, 0.0
    if system.gpus_per_node > 1:
        g = system.gpus_per_node
        t += 2 * (g - 1) / g * grad / (system.intra_gb_s * 1e9)
    if nodes > 1:
        t += 2 * (nodes - 1) / nodes * grad / (system.node_gb_s * 1e9) + 2 * (nodes - 1) * system.latency_us * 1e-6
    return t


def samples_per_s(model, system, nodes, per_gpu, overlap=True, zero2=False):
    """Training samples/s of `nodes` nodes when each GPU takes `per_gpu` samples an optimizer step, in
    as few micro batches as fit (the rest is gradient accumulation)."""
    ranks = nodes * system.gpus_per_node
    accumulation = -(-per_gpu // fits(model, system, ranks, zero2))
    per_sample = model.flops_per_sample() / (system.mfu * system.peak_tflops * 1e12)
    compute = per_gpu * per_sample
    comm = allreduce_s(model, system, nodes)
    # Communication starts with the last micro batch's backward pass (2/3 of its compute); ZeRO-2's
    # all-gather of the updated weights (half the volume) comes after the optimizer step, exposed.
    exposed = comm / 2 if zero2 else 0.0
    hideable = comm - exposed
    backward = 2 / 3 * compute / accumulation if overlap else 0.0
    step = compute + exposed + max(0.0, hideable - backward)
    return per_gpu * ranks / step


def efficiency(model, system, nodes, per_gpu, **variant):
    """samples/s against `nodes` x GPUs x one GPU's with no communication at all."""
    one = system.__class__(**{**system.__dict__, "gpus_per_node": 1})
    alone = samples_per_s(model, one, 1, per_gpu, **variant)
    return samples_per_s(model, system, nodes, per_gpu, **variant) / (alone * nodes * system.gpus_per_node)


# Weak scaling, the shipped configs' way: every GPU takes the same batch, the global batch grows with the nodes.
WEAK = {  # column -> (samples per GPU a step, keyword arguments of samples_per_s)
    "no overlap": (PER_GPU, {"overlap": False}),
    "no overlap, acc 4": (4 * PER_GPU, {"overlap": False}),
    "overlap": (PER_GPU, {}),
    "ZeRO-2": (PER_GPU, {"zero2": True}),
}


def rows():
    """One row per system, model and node count: weak-scaling columns, then the fixed global batch."""
    out = []
    for system in SYSTEMS:
        for model in MODELS:
            for nodes in NODES:
                row = {"system": system.name, "model": model.name, "nodes": nodes}
                for name, (per_gpu, kw) in WEAK.items():
                    row[name] = samples_per_s(model, system, nodes, per_gpu, **kw)
                    row[f"{name} efficiency"] = efficiency(model, system, nodes, per_gpu, **kw)
                per_gpu = GLOBAL_BATCH // (nodes * system.gpus_per_node)  # 0: fewer samples than GPUs
                row[STRONG] = samples_per_s(model, system, nodes, per_gpu) if per_gpu else None
                row[f"{STRONG} efficiency"] = efficiency(model, system, nodes, per_gpu) if per_gpu else None
                out.append(row)
    return out


def knee(table, system, model, column):
    """The last node count still at KNEE_EFFICIENCY or better (None: not even on one node)."""
    ok = [
        r["nodes"]
        for r in table
        if (r["system"], r["model"]) == (system, model)
        and r[f"{column} efficiency"] is not None
        and r[f"{column} efficiency"] >= KNEE_EFFICIENCY
    ]
    return max(ok, default=None)


def print_table(table):
    columns = [*WEAK, STRONG]
    for system in SYSTEMS:
        for model in MODELS:
            print(
                f"\n{system.name}, {model.name}, seq {SEQ}: samples/s (efficiency); micro batch that fits a GPU: "
                f"{fits(model, system, 1, False)}, with ZeRO-2 over 64 nodes "
                f"{fits(model, system, 64 * system.gpus_per_node, True)}"
            )
            print(f"{'nodes':>5} " + " ".join(f"{c:>18}" for c in columns))
            for r in table:
                if (r["system"], r["model"]) == (system.name, model.name):
                    cells = ["-" if r[c] is None else f"{r[c]:.0f} ({r[c + ' efficiency']:.0%})" for c in columns]
                    print(f"{r['nodes']:>5} " + " ".join(f"{c:>18}" for c in cells))
            knees = ", ".join(f"{c} {knee(table, system.name, model.name, c) or '<1'}" for c in columns)
            print(f"knee (last node count at >= {KNEE_EFFICIENCY:.0%}): {knees}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="the rows as JSON lines instead of the table")
    args = p.parse_args()
    table = rows()
    if args.json:
        for row in table:
            print(json.dumps(row))
    else:
        print_table(table)


if __name__ == "__main__":
    main()
