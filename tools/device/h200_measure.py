#!/usr/bin/env python3
"""What parasim's compute model needs from a Hopper GPU, measured in one short run.

Run on one NVIDIA H200 (the H100 SXM5's GH100 chip, 700 W) through the device tool:

    python3 tools/device/h200_measure.py        # writes $OUT (or ./h200-out)

Sections (each guarded: a failure is logged and the rest still runs; every result is
appended to results.jsonl as it is measured, so a run cut short keeps what it had):

1. environment: GPU, driver, clocks and power limit, host CPU, torch/CUDA/cuBLAS/cuDNN;
2. sustained matrix rate: an 8192^3 product back to back, bf16 and fp8 (torch._scaled_mm,
   e4m3 x e4m3 -> bf16, per-tensor scales), timed the way the A100's public sustained figure
   was (torch.utils.benchmark blocked_autorange, min_run_time = 3 s), plus a 6 s loop in
   0.5 s windows (CUDA events) with nvidia-smi sampling SM clock and power every 200 ms;
3. matrix products of training shapes (GPT-2, Llama 2 7B, GPT-3 175B with tensor 8), bf16
   and fp8, median of triton.testing.do_bench (L2 flushed between calls);
4. attention: F.scaled_dot_product_attention (flash), bf16, causal, head dim 128, 16,384
   tokens per call, sequence 512..32,768, forward and forward+backward;
5. memory-bound kernels: copy, add, LayerNorm, softmax, GELU on 256 MiB-1 GiB tensors;
6. host dispatch: NVIDIA dgxc-benchmarking's cpu_overhead method (10,000 back-to-back
   torch.matmul of fp32 square matrices 4..512, wall time / calls), an element-wise op's
   eager issue cost, and the same ops replayed from a CUDA graph;
7. training steps: GPT-2 (nanoGPT's layout: math or flash attention, torch loss, bf16
   autocast over fp32 parameters, TF32 on, fused AdamW, loss.item() every step as nanoGPT's
   bench.py), eager and with the whole step captured in one CUDA graph, with peak memory;
   PyTorch-profiler (Kineto) traces of two of them for `parasim calibrate`.

Further sections, run by name (`SECTIONS=a,b,c`; all of them when unset): `traces` (the two
traced steps again), `llama_steps` (Llama 2 7B's shapes with 8 and 16 layers, one traced),
`sustained_long` (20 s of bf16 products in 1 s windows), `host_traces` (GPT-2 124M at batch 1,
eager and graphed, traced), `kernel_costs` (the GPU's fixed cost of a tiny kernel from a stream
and from a graph; the host's cost per kernel in a training loop of tiny layers),
`host_decomposition` (the host's time per launch of eager training steps of small generic layer
mixes, forward, backward and optimizer step apart, kernels and ATen calls counted),
`attention_grid` (SDPA flash attention over head sizes, causal or not, forward and backward
apart, the backward's kernels), `eager_small_steps` (GPT-2 124M's eager batch-1 steps). The runs
kept in data/measurements/h200-2026-12-04 name the sections each ran (its README).
"""

import functools
import gc
import gzip
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback

OUT = os.environ.get("OUT") or os.path.abspath("h200-out")
os.makedirs(OUT, exist_ok=True)
RESULTS = open(os.path.join(OUT, "results.jsonl"), "a", buffering=1)
T0 = time.time()
BUDGET_S = float(os.environ.get("BUDGET_S", "330"))


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


def record(section, **kv):
    kv = {"section": section, **kv}
    RESULTS.write(json.dumps(kv) + "\n")
    log(section, json.dumps(kv)[:300])


def over_budget():
    return time.time() - T0 > BUDGET_S


def guarded(fn):
    @functools.wraps(fn)
    def run():
        if over_budget():
            record(fn.__name__, skipped="time budget spent")
            return
        t = time.time()
        try:
            fn()
        except Exception as e:  # keep going: the other sections still measure
            record(fn.__name__, error=repr(e), trace=traceback.format_exc()[-2000:])
        log(f"section {fn.__name__} took {time.time() - t:.1f} s")

    return run


import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEV = "cuda"


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30).stdout
    except Exception as e:
        return repr(e)


def start_smi(name):
    """nvidia-smi sampling SM clock, power and clock-event reasons every 200 ms into OUT/name."""
    return subprocess.Popen(
        "nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,"
        "clocks_event_reasons.active --format=csv -lms 200",
        shell=True,
        stdout=open(os.path.join(OUT, name), "w"),
        stderr=subprocess.STDOUT,
    )


def cuda_time(fn, iters):
    """Mean ms per call over iters back-to-back calls, CUDA events around the whole loop."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def bench(fn):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


@guarded
def environment():
    p = torch.cuda.get_device_properties(0)
    record(
        "environment",
        gpu=p.name,
        sm_count=p.multi_processor_count,
        memory_bytes=p.total_memory,
        l2_bytes=getattr(p, "L2_cache_size", None),
        capability=f"{p.major}.{p.minor}",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=torch.backends.cudnn.version(),
        python=platform.python_version(),
        cpu=sh("lscpu | grep -E 'Model name|^CPU\\(s\\)|Thread|MHz'").strip(),
        smi=sh(
            "nvidia-smi --query-gpu=name,driver_version,power.limit,enforced.power.limit,"
            "power.max_limit,clocks.max.sm,clocks.max.mem,clocks.sm,temperature.gpu "
            "--format=csv"
        ).strip(),
        smi_q=sh("nvidia-smi -q -d CLOCK,POWER,PERFORMANCE | head -120"),
    )


def fp8_operands(m, n, k):
    a = (torch.randn(m, k, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    one = torch.ones((), device=DEV, dtype=torch.float32)
    b = w.t()  # column-major (k, n), what _scaled_mm wants for its second operand

    def mm():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return mm


def bf16_operands(m, n, k):
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=DEV, dtype=torch.bfloat16)

    def mm():
        return a @ w.t()

    return mm


@guarded
def fp8_check():
    # fp8 product against the bf16 one on the same (fp8-representable) values
    m = n = k = 512
    a = (torch.randn(m, k, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device=DEV) * 0.5).to(torch.float8_e4m3fn)
    one = torch.ones((), device=DEV, dtype=torch.float32)
    got = torch._scaled_mm(a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16).double()
    ref = a.double() @ w.double().t()
    rel = ((got - ref).norm() / ref.norm()).item()
    record("fp8_check", relative_error=rel, ok=bool(rel < 1e-2))


@guarded
def sustained():
    import torch.utils.benchmark as tb

    smi = start_smi("smi.csv")
    try:
        n = 8192
        flop = 2 * n**3
        for dtype, make in (("bf16", bf16_operands), ("fp8", fp8_operands)):
            mm = make(n, n, n)
            for _ in range(20):
                mm()
            torch.cuda.synchronize()
            # the public A100 figure's method: blocked_autorange over at least 3 s
            t = tb.Timer(stmt="mm()", globals={"mm": mm}).blocked_autorange(min_run_time=3)
            record(
                "sustained_blocked_autorange",
                dtype=dtype,
                n=n,
                median_s=t.median,
                mean_s=t.mean,
                runs=len(t.times),
                number_per_run=t.number_per_run,
                tflops_median=flop / t.median / 1e12,
                wall=time.time() - T0,
            )
            # a 6 s loop in 0.5 s windows: the rate as the clock settles under load
            per_call_ms = cuda_time(mm, 10)
            calls = max(1, int(500 / per_call_ms))
            windows = []
            for _ in range(12):
                ms = cuda_time(mm, calls)
                windows.append(round(flop / (ms / 1e3) / 1e12, 1))
            record("sustained_windows", dtype=dtype, n=n, calls_per_window=calls, tflops=windows)
            del mm
            torch.cuda.empty_cache()
            time.sleep(2)  # let the clock recover between dtypes
        # first burst, cold: 100 products after 2 s idle (Bekman's MAMF-style figure)
        for dtype, make in (("bf16", bf16_operands), ("fp8", fp8_operands)):
            mm = make(n, n, n)
            mm()
            torch.cuda.synchronize()
            time.sleep(2)
            ms = cuda_time(mm, 100)
            record("burst_100", dtype=dtype, n=n, tflops=flop / (ms / 1e3) / 1e12)
            del mm
    finally:
        smi.terminate()


SHAPES = [
    # (label, M, N, K): M = tokens
    ("square-4096", 4096, 4096, 4096),
    ("square-8192", 8192, 8192, 8192),
    ("square-16384", 16384, 16384, 16384),
    ("gpt2-124m-qkv-b8", 8192, 2304, 768),
    ("gpt2-124m-proj-b8", 8192, 768, 768),
    ("gpt2-124m-fc-b8", 8192, 3072, 768),
    ("gpt2-124m-fc2-b8", 8192, 768, 3072),
    ("gpt2-124m-lmhead-b8", 8192, 50257, 768),
    ("gpt2-124m-fc-b1", 1024, 3072, 768),
    ("llama2-7b-qkv-t8k", 8192, 12288, 4096),
    ("llama2-7b-o-t8k", 8192, 4096, 4096),
    ("llama2-7b-gateup-t8k", 8192, 22016, 4096),
    ("llama2-7b-down-t8k", 8192, 4096, 11008),
    ("gpt3-175b-tp8-qkv-t2k", 2048, 4608, 12288),
    ("gpt3-175b-tp8-proj-t2k", 2048, 12288, 1536),
    ("gpt3-175b-tp8-fc1-t2k", 2048, 6144, 12288),
    ("gpt3-175b-tp8-fc2-t2k", 2048, 12288, 6144),
    ("gpt3-175b-tp8-fc1-t8k", 8192, 6144, 12288),
    ("mamf-bf16-best-2048x13312x2048", 2048, 13312, 2048),
    ("mamf-fp8-best-1024x14336x9216", 1024, 14336, 9216),
]


@guarded
def gemm_shapes():
    for label, m, n, k in SHAPES:
        if over_budget():
            break
        for dtype, make in (("bf16", bf16_operands), ("fp8", fp8_operands)):
            if dtype == "fp8" and (n % 16 or k % 16):
                continue  # _scaled_mm needs multiples of 16
            mm = make(m, n, k)
            ms = bench(mm)
            record(
                "gemm",
                label=label,
                dtype=dtype,
                m=m,
                n=n,
                k=k,
                median_ms=ms,
                tflops=2 * m * n * k / (ms / 1e3) / 1e12,
            )
            del mm
    torch.cuda.empty_cache()


@guarded
def attention():
    heads, d = 16, 128
    tokens = 16384
    for seq in (512, 1024, 2048, 4096, 8192, 16384, 32768):
        b = max(1, tokens // seq)
        q, k, v = (
            torch.randn(b, heads, seq, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        # causal: half of the score matrix; 2 products forward, 5 in the backward (2.5x)
        fwd_flop = 4 * b * heads * seq * seq * d / 2
        fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        g = torch.randn_like(out)

        def fb():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(g)

        both = bench(fb)
        record(
            "attention_sdpa",
            seq=seq,
            batch=b,
            heads=heads,
            head_dim=d,
            causal=True,
            fwd_ms=fwd,
            fwd_bwd_ms=both,
            fwd_tflops=fwd_flop / (fwd / 1e3) / 1e12,
            bwd_tflops=2.5 * fwd_flop / ((both - fwd) / 1e3) / 1e12,
        )
        del q, k, v, out, g
    torch.cuda.empty_cache()


@guarded
def memory_bound():
    n = 256 * 1024 * 1024  # elements
    x = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    z = torch.randn_like(x)
    cases = [
        ("copy-bf16", lambda: y.copy_(x), 4 * n),
        ("add-bf16", lambda: torch.add(x, z, out=y), 6 * n),
        ("gelu-tanh-bf16", lambda: F.gelu(x, approximate="tanh"), 4 * n),
    ]
    rows = x.view(-1, 4096)
    ln = nn.LayerNorm(4096, device=DEV, dtype=torch.bfloat16)
    cases.append(("layernorm-bf16-h4096", lambda: ln(rows), 4 * n))
    cases.append(("softmax-bf16-4096", lambda: F.softmax(rows, dim=-1), 4 * n))
    xf = torch.randn(n // 2, device=DEV, dtype=torch.float32)
    cases.append(("copy-fp32", lambda: xf.clone(), 8 * (n // 2)))
    for label, fn, nbytes in cases:
        ms = bench(fn)
        record("memory", label=label, bytes=nbytes, median_ms=ms, gbps=nbytes / (ms / 1e3) / 1e9)
    # small element-wise kernels: where the per-kernel cost dominates
    for elems in (1024, 65536, 1 << 20, 1 << 22):
        a = torch.randn(elems, device=DEV, dtype=torch.bfloat16)
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(100):
                a.mul_(1.0001)
        g.replay()
        torch.cuda.synchronize()
        ms = cuda_time(g.replay, 20) / 100
        record("small_kernel_graphed", elements=elems, us_per_kernel=ms * 1e3, bytes=4 * elems)
    del x, y, z, xf
    torch.cuda.empty_cache()


@guarded
def dispatch():
    # NVIDIA/dgxc-benchmarking microbenchmarks/cpu_overhead: 10,000 back-to-back torch.matmul
    # of fp32 square matrices, wall time (time.time) / calls
    for size in (4, 8, 16, 32, 64, 128, 256, 512):
        a = torch.randn(size, size, device=DEV)
        b = torch.randn(size, size, device=DEV)
        for _ in range(100):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        t = time.time()
        for _ in range(10000):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        us = (time.time() - t) / 10000 * 1e6
        record("dispatch_matmul_fp32", size=size, us_per_call=us)
    # an element-wise op's eager issue cost, in-place and allocating
    a = torch.randn(1024, device=DEV)
    for label, fn in (("add_-inplace", lambda: a.add_(1.0)), ("add-alloc", lambda: a + 1.0)):
        for _ in range(1000):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20000):
            fn()
        torch.cuda.synchronize()
        record("dispatch_eager", op=label, us_per_call=(time.perf_counter() - t) / 20000 * 1e6)
    # the same 1000 in-place adds replayed from a CUDA graph: the GPU's per-kernel cost
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(1000):
            a.add_(1.0)
    g.replay()
    torch.cuda.synchronize()
    ms = cuda_time(g.replay, 20)
    record("dispatch_graph", op="add_-inplace", us_per_kernel=ms * 1e3 / 1000)
    # matmul 512 in a graph
    x = torch.randn(512, 512, device=DEV)
    g2 = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g2):
        for _ in range(200):
            torch.matmul(x, x)
    g2.replay()
    torch.cuda.synchronize()
    ms = cuda_time(g2.replay, 20)
    record("dispatch_graph", op="matmul-fp32-512", us_per_kernel=ms * 1e3 / 200)


# ---- GPT-2 training steps -------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, h, nh, attn, seq):
        super().__init__()
        self.nh, self.attn = nh, attn
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc = nn.Linear(h, 4 * h)
        self.fc2 = nn.Linear(4 * h, h)
        if attn == "math":
            self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        if self.attn == "flash":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, h, nh, seq, vocab, attn):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, nh, attn, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        self.register_buffer("pos", torch.arange(seq))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(self.pos[: idx.size(1)])
        for b in self.blocks:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class LlamaBlock(nn.Module):
    """Llama 2's block as plain PyTorch: RMSNorm, fused q/k/v, rotary, flash attention,
    fused gate/up, SwiGLU, no biases."""

    def __init__(self, h, nh, ffn, seq):
        super().__init__()
        self.nh = nh
        self.n1 = nn.RMSNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.n2 = nn.RMSNorm(h, eps=1e-5)
        self.gate_up = nn.Linear(h, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)
        d = h // nh
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
        f = torch.outer(torch.arange(seq).float(), inv)
        # in the activations' dtype, as Llama implementations cast them
        self.register_buffer("cos", torch.cat((f, f), -1).cos().to(torch.bfloat16))
        self.register_buffer("sin", torch.cat((f, f), -1).sin().to(torch.bfloat16))

    def rope(self, x):
        half = x.size(-1) // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), -1)
        return x * self.cos + rot * self.sin

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.n1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        gate, up = self.gate_up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, layers, h, nh, ffn, seq, vocab):
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(LlamaBlock(h, nh, ffn, seq) for _ in range(layers))
        self.norm = nn.RMSNorm(h, eps=1e-5)
        self.out = nn.Linear(h, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


LLAMAS = {
    # name: layers, hidden, heads, ffn, sequence, vocabulary (Llama 2 7B's shapes)
    "llama2-7b-8l": (8, 4096, 32, 11008, 4096, 32000),
    "llama2-7b-16l": (16, 4096, 32, 11008, 4096, 32000),
}

MODELS = {
    # name: layers, hidden, heads, vocabulary (GPT-2 sizes, sequence 1024)
    "gpt2-124m": (12, 768, 12, 50257),
    "gpt2-350m": (24, 1024, 16, 50257),
    "gpt2-774m": (36, 1280, 20, 50257),
    "gpt2-1558m": (48, 1600, 25, 50257),
}


def gpt_step(name, attn, batch, graphed=False, steps=10, trace=None):
    gc.collect()
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    if name in LLAMAS:
        layers, h, nh, ffn, seq, vocab = LLAMAS[name]
        model = Llama(layers, h, nh, ffn, seq, vocab).to(DEV)
    else:
        layers, h, nh, vocab = MODELS[name]
        seq = 1024
        model = GPT(layers, h, nh, seq, vocab, attn).to(DEV)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True, capturable=graphed)
    idx = torch.randint(0, vocab, (batch, seq), device=DEV)
    tgt = torch.randint(0, vocab, (batch, seq), device=DEV)
    ac = dict(device_type="cuda", dtype=torch.bfloat16)

    def fwd_bwd_opt():
        with torch.autocast(**ac, cache_enabled=not graphed):
            loss = model(idx, tgt)
        loss.backward()
        opt.step()
        return loss

    torch.cuda.reset_peak_memory_stats()
    if graphed:
        # PyTorch's whole-network capture (docs: CUDA Graphs, "Whole-network capture"):
        # warm up on a side stream, then capture forward, backward and the optimizer step
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                fwd_bwd_opt()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = fwd_bwd_opt()

        def run():
            g.replay()
            return static_loss

    else:

        def run():
            opt.zero_grad(set_to_none=True)
            return fwd_bwd_opt()

        for _ in range(3):
            run().item()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        run().item()  # nanoGPT's bench.py reads the loss every step
        times.append(time.perf_counter() - t)
    times.sort()
    rec = dict(
        model=name,
        attention=attn,
        batch=batch,
        sequence=seq,
        graphed=graphed,
        parameters=params,
        steps=steps,
        median_s=times[len(times) // 2],
        min_s=times[0],
        max_s=times[-1],
        max_memory_allocated=torch.cuda.max_memory_allocated(),
        max_memory_reserved=torch.cuda.max_memory_reserved(),
    )
    if trace:
        from torch.profiler import ProfilerActivity, profile

        path = os.path.join("/tmp", trace)
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True
        ) as prof:
            for _ in range(2):
                run().item()
        prof.export_chrome_trace(path)
        with open(path, "rb") as f, gzip.open(os.path.join(OUT, trace + ".gz"), "wb") as z:
            shutil.copyfileobj(f, z)
        rec["trace"] = trace + ".gz"
    record("gpt_step", **rec)
    del model, opt, idx, tgt
    torch.cuda.empty_cache()


def run_plan(plan):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    for name, attn, batch, graphed, trace in plan:
        if over_budget():
            record("gpt_step", model=name, batch=batch, skipped="time budget spent")
            continue
        try:
            gpt_step(name, attn, batch, graphed=graphed, trace=trace)
        except Exception as e:
            record(
                "gpt_step",
                model=name,
                attention=attn,
                batch=batch,
                graphed=graphed,
                error=repr(e),
                trace=traceback.format_exc()[-1500:],
            )
            torch.cuda.empty_cache()


@guarded
def traces():
    run_plan(
        [
            ("gpt2-124m", "math", 8, False, "trace-gpt2-124m-math-b8.json"),
            ("gpt2-1558m", "flash", 8, False, "trace-gpt2-1558m-flash-b8.json"),
        ]
    )


@guarded
def llama_steps():
    run_plan(
        [
            ("llama2-7b-8l", "flash", 1, False, "trace-llama2-7b-8l-b1.json"),
            ("llama2-7b-8l", "flash", 2, False, None),
            ("llama2-7b-16l", "flash", 1, False, None),
            ("llama2-7b-16l", "flash", 2, False, None),
        ]
    )


@guarded
def host_traces():
    """Traces of host-bound steps (run 3): GPT-2 124M at batch 1, eager with math and flash
    attention, and the flash step replayed from its CUDA graph (the GPU's own time)."""
    run_plan(
        [
            ("gpt2-124m", "flash", 1, False, "trace-gpt2-124m-flash-b1.json"),
            ("gpt2-124m", "math", 1, False, "trace-gpt2-124m-math-b1.json"),
            ("gpt2-124m", "flash", 1, True, "trace-gpt2-124m-flash-b1-graph.json"),
        ]
    )


@guarded
def kernel_costs():
    """Run 4: the GPU's fixed cost per tiny kernel issued from a stream while the host is ahead
    (a long product first holds the GPU while the host queues them), beside the same kernels
    replayed from a CUDA graph; and the host's cost per kernel in a training loop of tiny
    layers (nn.Linear + LayerNorm + GELU under autocast, batch 1), its kernels counted by the
    profiler, beside the bare-op benchmark on the same machine."""
    a = torch.randn(1024, device=DEV, dtype=torch.bfloat16)
    big = bf16_operands(8192, 8192, 8192)
    for n in (200, 1000):
        for _ in range(3):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(12):
                big()  # about 20 ms of GPU work: the host queues the tiny kernels meanwhile
            start.record()
            for _ in range(n):
                a.mul_(1.0001)
            end.record()
            end.synchronize()
        record("kernel_stream", kernels=n, elements=1024, us_per_kernel=start.elapsed_time(end) * 1e3 / n)
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(1000):
            a.mul_(1.0001)
    g.replay()
    torch.cuda.synchronize()
    record("kernel_graph", kernels=1000, elements=1024, us_per_kernel=cuda_time(g.replay, 20))

    # a training loop of tiny layers: host-bound by construction
    layers = 24
    model = nn.Sequential(
        *[nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64), nn.GELU()) for _ in range(layers)]
    ).to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randn(1, 64, device=DEV)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(5):
        step().item()
    times = []
    for _ in range(50):
        t = time.perf_counter()
        step().item()
        times.append(time.perf_counter() - t)
    times.sort()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step().item()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 2
    median = times[len(times) // 2]
    record(
        "tiny_training_loop",
        layers=layers,
        kernels_per_step=kernels,
        median_step_s=median,
        us_per_kernel=median / max(kernels, 1) * 1e6,
    )


def _phase_kernels(fn):
    """Kernels (and memsets/copies apart) the GPU ran, and ATen calls the host made, in one
    call of fn, counted by the PyTorch profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = other = aten = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            if "memset" in e.name.lower() or "memcpy" in e.name.lower():
                other += 1
            else:
                kernels += 1
        elif e.name.startswith("aten::"):
            aten += 1
    return kernels, other, aten


@guarded
def host_decomposition():
    """Run 5: the host's cost per kernel of an eager autograd training step, split into
    forward, backward and optimizer step, for small generic layer mixes (none of them a
    validation case's model), in fp32 and under bf16 autocast, with the kernels and ATen calls
    of each phase counted; beside the bare-op benchmark (section `dispatch`) on the same
    machine. Every layer is tiny, so the GPU waits for the host throughout."""
    torch.backends.cuda.matmul.allow_tf32 = True

    def mlp(width, norm, act, layers=24):
        mods = []
        for _ in range(layers):
            if norm:
                mods.append(nn.LayerNorm(width))
            mods.append(nn.Linear(width, width))
            if act:
                mods.append(nn.GELU())
        return nn.Sequential(*mods), (1, width)

    def blocks(width, heads, tokens, layers=12):
        return nn.Sequential(*[Block(width, heads, "flash", tokens) for _ in range(layers)]), (
            1,
            tokens,
            width,
        )

    variants = [
        ("linear-24", lambda: mlp(64, False, False)),
        ("linear-gelu-24", lambda: mlp(64, False, True)),
        ("ln-linear-gelu-24", lambda: mlp(64, True, True)),
        ("ln-linear-gelu-24-w256", lambda: mlp(256, True, True)),
        ("gpt-block-12-d64-t16", lambda: blocks(64, 4, 16)),
    ]
    for label, make in variants:
        for amp in (False, True):
            if over_budget():
                record("host_decomposition", variant=label, skipped="time budget spent")
                return
            torch.manual_seed(0)
            model, shape = make()
            model = model.to(DEV)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
            x = torch.randn(*shape, device=DEV)
            ctx = (
                (lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16))
                if amp
                else (lambda: torch.autocast(device_type="cuda", enabled=False))
            )
            holder = {}

            def fwd():
                with ctx():
                    holder["loss"] = model(x).float().pow(2).mean()

            def bwd():
                holder["loss"].backward()

            def stp():
                opt.step()

            def zero():
                opt.zero_grad(set_to_none=True)

            def fwd_nograd():
                with torch.no_grad(), ctx():
                    model(x).float().pow(2).mean()

            for _ in range(5):
                zero(), fwd(), bwd(), stp()
                holder["loss"].item()
            torch.cuda.synchronize()
            t_f, t_b, t_o, t_n = [], [], [], []
            for _ in range(40):
                zero()
                t0 = time.perf_counter()
                fwd()
                t1 = time.perf_counter()
                bwd()
                t2 = time.perf_counter()
                stp()
                t3 = time.perf_counter()
                holder["loss"].item()
                t_f.append(t1 - t0), t_b.append(t2 - t1), t_o.append(t3 - t2)
                t4 = time.perf_counter()
                fwd_nograd()
                t_n.append(time.perf_counter() - t4)
                torch.cuda.synchronize()
            med = lambda v: sorted(v)[len(v) // 2] * 1e6
            zero()
            kf = _phase_kernels(fwd)
            kb = _phase_kernels(bwd)
            ko = _phase_kernels(stp)
            kn = _phase_kernels(fwd_nograd)
            phases = {
                "forward": (med(t_f), kf),
                "backward": (med(t_b), kb),
                "optimizer": (med(t_o), ko),
                "forward_no_grad": (med(t_n), kn),
            }
            rec = dict(variant=label, autocast=amp)
            for name, (us, (k, other, aten)) in phases.items():
                rec[name] = dict(
                    host_us=us,
                    kernels=k,
                    memsets_copies=other,
                    aten_calls=aten,
                    us_per_kernel=us / max(k + other, 1),
                )
            launches = sum(v[1][0] + v[1][1] for n, v in phases.items() if n != "forward_no_grad")
            host = sum(v[0] for n, v in phases.items() if n != "forward_no_grad")
            rec["step_us_per_launch"] = host / max(launches, 1)
            record("host_decomposition", **rec)
            del model, opt, x, holder
    torch.cuda.empty_cache()


@guarded
def attention_grid():
    """Run 5: SDPA flash attention (cuDNN on sm90), bf16, over head size 64 and 128, causal
    and not, sequences 512-8192 at 16,384 tokens a call: forward and backward apart (the
    backward is timed alone, from a saved forward), and the backward's kernels with their
    GPU times for two shapes (every shape with PROFILE_ALL=1, run 7), for a shape model of the
    backward."""
    from torch.profiler import ProfilerActivity, profile

    tokens = 16384
    for d, heads in ((128, 16), (64, 32), (128, 32)):
        for causal in (True, False):
            for seq in (512, 1024, 2048, 4096, 8192):
                if over_budget():
                    record("attention_grid", skipped="time budget spent")
                    return
                b = max(1, tokens // seq)
                q, k, v = (
                    torch.randn(b, heads, seq, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3)
                )
                fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                g = torch.randn_like(out)
                bwd = bench(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True))
                flop = 4 * b * heads * seq * seq * d * (0.5 if causal else 1.0)
                rec = dict(
                    seq=seq,
                    batch=b,
                    heads=heads,
                    head_dim=d,
                    causal=causal,
                    fwd_ms=fwd,
                    bwd_ms=bwd,
                    fwd_tflops=flop / (fwd / 1e3) / 1e12,
                    bwd_tflops=2.5 * flop / (bwd / 1e3) / 1e12,
                )
                if os.environ.get("PROFILE_ALL") or (d == 128 and heads == 16 and causal and seq in (512, 4096)):
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(3):
                            torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
                        torch.cuda.synchronize()
                    ks = {}
                    for e in prof.events():
                        if e.device_type == torch.autograd.DeviceType.CUDA:
                            ks.setdefault(e.name[:120], []).append(e.time_range.elapsed_us())
                    rec["bwd_kernels_us"] = {n: sum(t) / 3 for n, t in ks.items()}
                record("attention_grid", **rec)
                del q, k, v, out, g
    torch.cuda.empty_cache()


@guarded
def eager_small_steps():
    """Run 5: GPT-2 124M at batch 1, eager, math and flash attention, on this machine
    (the host-bound steps of the h200-device family, measured on one more machine)."""
    run_plan(
        [
            ("gpt2-124m", "flash", 1, False, None),
            ("gpt2-124m", "math", 1, False, None),
        ]
    )


@guarded
def sustained_long():
    """20 s of 8192^3 bf16 products in 1 s windows: does the rate keep falling as the
    card warms past the 6 s of `sustained`?"""
    n = 8192
    flop = 2 * n**3
    mm = bf16_operands(n, n, n)
    per_call_ms = cuda_time(mm, 10)
    calls = max(1, int(1000 / per_call_ms))
    windows = [round(flop / (cuda_time(mm, calls) / 1e3) / 1e12, 1) for _ in range(20)]
    record("sustained_long", dtype="bf16", n=n, calls_per_window=calls, tflops=windows)


@guarded
def gpt_steps():
    plan = [
        ("gpt2-124m", "math", 8, False, "trace-gpt2-124m-math-b8.json"),
        ("gpt2-124m", "math", 1, False, None),
        ("gpt2-124m", "math", 4, False, None),
        ("gpt2-124m", "math", 16, False, None),
        ("gpt2-124m", "flash", 8, False, None),
        ("gpt2-124m", "flash", 1, False, None),
        ("gpt2-124m", "flash", 1, True, None),
        ("gpt2-124m", "flash", 8, True, None),
        ("gpt2-124m", "math", 1, True, None),
        ("gpt2-350m", "flash", 8, False, None),
        ("gpt2-774m", "flash", 8, False, None),
        ("gpt2-1558m", "flash", 8, False, "trace-gpt2-1558m-flash-b8.json"),
        ("gpt2-1558m", "flash", 16, False, None),
    ]
    run_plan(plan)


def main():
    torch.cuda.init()
    sections = {
        f.__name__: f
        for f in (
            environment,
            fp8_check,
            sustained,
            gpt_steps,
            gemm_shapes,
            attention,
            dispatch,
            memory_bound,
            traces,
            llama_steps,
            sustained_long,
            host_traces,
            kernel_costs,
            host_decomposition,
            attention_grid,
            eager_small_steps,
        )
    }
    # SECTIONS=a,b,c runs those only (run 2 of 2026-12-04: the traces run 1 lost, Llama)
    chosen = os.environ.get("SECTIONS", "").split(",") if os.environ.get("SECTIONS") else None
    record("start", argv=sys.argv, budget_s=BUDGET_S, sections=chosen)
    smi = start_smi("smi-all.csv")
    try:
        for name, section in sections.items():
            if chosen is None or name in chosen:
                record("section", name=name, wall=time.time() - T0)
                section()
    finally:
        smi.terminate()
    record("end", wall_s=time.time() - T0)


if __name__ == "__main__":
    main()
