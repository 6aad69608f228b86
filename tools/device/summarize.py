#!/usr/bin/env python3
"""Print the tables of a measurement folder written by tools/device/h200_measure.py.

    python3 tools/device/summarize.py data/measurements/h200-2026-12-04

Reads every run*-results.jsonl (and a plain results.jsonl) there and prints Markdown tables (the folder's README.md shows
this output): sustained products, products of training shapes, attention, memory-bound and small
kernels, host dispatch, training steps.
"""

import glob
import json
import os
import sys


def rows(folder):
    """Every record of the folder's runs: `run*-results.jsonl` (kept runs, renamed) and
    `results.jsonl` (a run's own output, as the script writes it)."""
    paths = sorted(glob.glob(os.path.join(folder, "run*-results.jsonl")))
    paths += [p for p in [os.path.join(folder, "results.jsonl")] if os.path.exists(p)]
    for path in paths:
        run = os.path.basename(path).split("-")[0].removesuffix(".jsonl")
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                record["run"] = run
                yield record


def main(folder):
    records = [r for r in rows(folder) if "error" not in r and "skipped" not in r]
    by = lambda section: [r for r in records if r["section"] == section]  # noqa: E731

    print("| dtype | n | how | TFLOP/s |\n|---|---|---|---|")
    for r in by("sustained_blocked_autorange"):
        print(f"| {r['dtype']} | {r['n']} | blocked_autorange >= 3 s, median of {r['runs']} x {r['number_per_run']} | {r['tflops_median']:.1f} |")
    for r in by("sustained_windows") + by("sustained_long"):
        w = r["tflops"]
        print(f"| {r['dtype']} | {r['n']} | {len(w)} windows of {r['calls_per_window']} products ({r['section']}) | {min(w):.0f}-{max(w):.0f} |")
    for r in by("burst_100"):
        print(f"| {r['dtype']} | {r['n']} | 100 products after 2 s idle | {r['tflops']:.1f} |")

    print("\n| product (M x N x K) | label | bf16 TFLOP/s | fp8 TFLOP/s |\n|---|---|---|---|")
    table = {}
    for r in by("gemm"):
        table.setdefault((r["m"], r["n"], r["k"], r["label"]), {})[r["dtype"]] = r["tflops"]
    for (m, n, k, label), d in table.items():
        fp8 = f"{d['fp8']:.1f}" if "fp8" in d else "-"
        print(f"| {m} x {n} x {k} | {label} | {d.get('bf16', 0):.1f} | {fp8} |")

    print("\n| sequence | batch x 16 heads x 128 | forward ms | forward+backward ms | forward TFLOP/s | backward TFLOP/s |")
    print("|---|---|---|---|---|---|")
    for r in by("attention_sdpa"):
        print(f"| {r['seq']} | {r['batch']} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | {r['fwd_tflops']:.0f} | {r['bwd_tflops']:.0f} |")

    print("\n| kernel | bytes moved | rate |\n|---|---|---|")
    for r in by("memory"):
        print(f"| {r['label']} | {r['bytes'] / 2**30:.2f} GiB | {r['gbps']:.0f} GB/s |")
    for r in by("small_kernel_graphed"):
        print(f"| in-place multiply of {r['elements']} bf16 elements, replayed from a CUDA graph | {r['bytes']} B | {r['us_per_kernel']:.2f} us per kernel |")

    print("\n| host dispatch | us per call |\n|---|---|")
    for r in by("dispatch_matmul_fp32"):
        print(f"| eager torch.matmul, fp32 {r['size']}x{r['size']}, 10,000 back to back ({r['run']}) | {r['us_per_call']:.1f} |")
    for r in by("dispatch_eager"):
        print(f"| eager {r['op']} on 1024 floats, 20,000 back to back | {r['us_per_call']:.1f} |")
    for r in by("dispatch_graph"):
        print(f"| {r['op']} replayed from a CUDA graph, per kernel | {r['us_per_kernel']:.2f} |")

    print("\n| per-kernel cost | us per kernel | run |\n|---|---|---|")
    for r in by("kernel_stream"):
        print(f"| GPU: {r['kernels']} in-place multiplies of {r['elements']} bf16 elements from a stream, the host ahead | {r['us_per_kernel']:.2f} | {r['run']} |")
    for r in by("kernel_graph"):
        print(f"| GPU: the same, {r['kernels']} replayed from a CUDA graph | {r['us_per_kernel']:.2f} | {r['run']} |")
    for r in by("tiny_training_loop"):
        print(
            f"| host: a training loop of {r['layers']} tiny layers (LayerNorm, Linear 64, GELU; autocast, fused AdamW), "
            f"{r['kernels_per_step']:.0f} kernels a step in {r['median_step_s'] * 1e3:.2f} ms | {r['us_per_kernel']:.1f} | {r['run']} |"
        )

    print("\n| sequence | batch x heads x head size | causal | forward ms | backward ms | forward TFLOP/s | backward TFLOP/s | run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in by("attention_grid"):
        print(
            f"| {r['seq']} | {r['batch']} x {r['heads']} x {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['fwd_ms']:.3f} "
            f"| {r['bwd_ms']:.3f} | {r['fwd_tflops']:.0f} | {r['bwd_tflops']:.0f} | {r['run']} |"
        )

    profiled = [r for r in by("attention_grid") if "bwd_kernels_us" in r]
    if profiled:
        print("\n| sequence | batch x heads x head size | causal | backward: main kernel us | `compute_dot_do_o` us | `convert_dq_to_16bits` us | run |")
        print("|---|---|---|---|---|---|---|")
        for r in profiled:
            k = r["bwd_kernels_us"]
            part = lambda key: sum(v for n, v in k.items() if key in n)  # noqa: E731
            print(
                f"| {r['seq']} | {r['batch']} x {r['heads']} x {r['head_dim']} | {'yes' if r['causal'] else 'no'} "
                f"| {part('bprop'):.0f} | {part('dot_do_o'):.0f} | {part('convert_dq'):.0f} | {r['run']} |"
            )

    training_host_factor(records)

    print("\n| model | attention | batch x tokens | CUDA graph | step ms (median of 10) | min-max ms | peak allocated GiB | run |")
    print("|---|---|---|---|---|---|---|---|")
    for r in by("gpt_step"):
        graph = "yes" if r["graphed"] else "no"
        print(
            f"| {r['model']} | {r['attention']} | {r['batch']} x {r['sequence']} | {graph} | {r['median_s'] * 1e3:.2f} "
            f"| {r['min_s'] * 1e3:.2f}-{r['max_s'] * 1e3:.2f} | {r['max_memory_allocated'] / 2**30:.2f} | {r['run']} |"
        )


def training_host_factor(records):
    """The host's time per launch in an eager autograd training step over the bare-op
    benchmark's time per call on the same machine (the median of its 8 sizes): every
    training-loop microbenchmark of every run, and their median (data/hosts.toml's
    `[eager-training] factor`)."""
    bare = {}
    for r in records:
        if r["section"] == "dispatch_matmul_fp32":
            bare.setdefault(r["run"], []).append(r["us_per_call"])
    bare = {run: sorted(v)[len(v) // 2 - 1 : len(v) // 2 + 1] for run, v in bare.items()}
    bare = {run: sum(v) / len(v) for run, v in bare.items()}
    print("\n| training-loop microbenchmark | autocast | host us per launch | bare op us (same run) | ratio | run |")
    print("|---|---|---|---|---|---|")
    ratios = []
    for r in records:
        if r["run"] not in bare:
            continue
        if r["section"] == "tiny_training_loop":
            label, amp, us = f"{r['layers']} x (LayerNorm, Linear 64, GELU), whole step", True, r["us_per_kernel"]
        elif r["section"] == "host_decomposition":
            label, amp, us = r["variant"], r["autocast"], r["step_us_per_launch"]
        else:
            continue
        ratio = us / bare[r["run"]]
        ratios.append(ratio)
        print(f"| {label} | {'yes' if amp else 'no'} | {us:.1f} | {bare[r['run']]:.1f} | {ratio:.2f} | {r['run']} |")
    if ratios:
        ratios.sort()
        n = len(ratios)
        median = ratios[n // 2] if n % 2 else (ratios[n // 2 - 1] + ratios[n // 2]) / 2
        print(f"| median of the {n} | | | | **{median:.2f}** | |")

    print("\n| layer mix (run 5) | autocast | phase | host us | kernels | memsets, copies | ATen calls | us per kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        if r["section"] != "host_decomposition":
            continue
        for phase in ("forward", "forward_no_grad", "backward", "optimizer"):
            p = r[phase]
            print(
                f"| {r['variant']} | {'yes' if r['autocast'] else 'no'} | {phase.replace('_', ' ')} | {p['host_us']:.0f} "
                f"| {p['kernels']} | {p['memsets_copies']} | {p['aten_calls']} | {p['us_per_kernel']:.1f} |"
            )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/measurements/h200-2026-12-04")
