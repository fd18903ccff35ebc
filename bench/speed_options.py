#!/usr/bin/env python
"""Measure the speed options one by one (keep only what is a real gain on this device).

Times forward+backward+AdamW steps of a model on real SQuAD-length batches, for attention
implementations (eager, sdpa) and AdamW variants (for-loop, foreach, fused), and prints steps/s.
    python bench/speed_options.py --model DIR [--seq 192] [--batch 16] [--steps 8]
"""

import argparse
import json
import time

import torch


def bench(model_dir, attn, opt_kind, seq, batch, steps, device):
    from transformers import AutoModelForQuestionAnswering

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir, attn_implementation=attn).to(device)
    kwargs = {"foreach": False} if opt_kind == "loop" else {opt_kind: True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **kwargs)
    ids = torch.randint(1000, 20000, (batch, seq), device=device)
    mask = torch.ones_like(ids)
    mask[:, seq * 3 // 4 :] = 0  # some padding, as in real batches
    pos = torch.randint(1, seq // 2, (batch,), device=device)
    for i in range(steps + 2):  # 2 warm-up steps
        if i == 2:
            t0 = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=mask, start_positions=pos, end_positions=pos).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps / (time.perf_counter() - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--seq", type=int, default=192)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = {}
    for attn, opt in [("eager", "foreach"), ("sdpa", "foreach"), ("sdpa", "loop"), ("sdpa", "fused")]:
        results[f"{attn}+{opt}"] = bench(args.model, attn, opt, args.seq, args.batch, args.steps, device)
        print(f"{attn:6} attention, AdamW {opt:8}: {results[f'{attn}+{opt}']:.3f} steps/s", flush=True)
    print(json.dumps({"device": str(device), "seq": args.seq, "batch": args.batch, "steps_per_second": results}))


if __name__ == "__main__":
    main()
