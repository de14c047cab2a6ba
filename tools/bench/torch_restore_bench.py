"""Restore of a Kimi-Linear-shaped bf16 cache through primecache.torch, against
the copies the same bytes need anyway, measured side by side in one run.

Publishes one boundary of `--tokens` tokens of a 27-layer Kimi-Linear-class
layout (every 4th layer MLA: its latent kv_nope [seq, 512] and k_rot
[seq, 64] rows in bf16, as transformers' kimi_linear caches them; the other
layers KDA: a bf16 conv state of 3 x 32 x 128 channels by 4 and an f32
recurrent state 32 x 128 x 128) to a fresh primecached, then times, each the
median of --reps runs:
  - restore_cuda: pt.fetch_into the layers into preallocated CUDA tensors
    (raw chunks through the daemon's device window);
  - h2d_pinned: one pinned host-to-device copy of the same bytes;
  - restore_cpu: pt.fetch_into into preallocated CPU tensors;
  - memcpy: one host copy of the same bytes.
Prints the ratios (copy time / restore time: 1.0 is the copy's speed) and
writes them as CSV with --csv.

  PRIMECACHED=build/default/tools/primecached/primecached \\
  PYTHONPATH=build/default/python python3 tools/bench/torch_restore_bench.py --tokens 32768
"""

import argparse
import pathlib
import statistics
import sys
import time

import torch

import primecache
import primecache.torch as pt
from bench_daemon import fresh_daemon, report

T = primecache.ElementType


def layout(tokens):
    shapes = []
    for i in range(27):
        if i % 4 == 3:
            shapes.append(primecache.KvShape(len=tokens, k_width=512, v_width=64, dtype=T.bf16))
        else:
            # The KDA layer as transformers keeps it: q, k and v conv inputs of
            # 32 heads x 128 by the kernel's 4 columns, and the f32 state.
            shapes.append(primecache.LinearStateShape(conv_channels=3 * 32 * 128, conv_width=4, state_heads=32,
                                                      state_k_dim=128, state_v_dim=128, conv_dtype=T.bf16,
                                                      state_dtype=T.f32))
    return shapes


def median_seconds(fn, reps, sync):
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_exact(layers, dests):
    """Every restored plane is its published bits, or the bench reports nothing."""
    for i, (_, want) in enumerate(layers):
        for name, t in want.items():
            carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
            if not torch.equal(dests[i][1][name].cpu().view(carrier), t.view(carrier)):
                raise SystemExit(f"layer {i} plane {name} was restored wrong")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--csv", type=pathlib.Path)
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    shapes = layout(args.tokens)
    gen = torch.Generator().manual_seed(1)
    layers = []
    for s in shapes:
        planes = {name: torch.randn(rows, width, generator=gen).to(pt.torch_dtype(dtype))
                  for name, rows, width, dtype in pt.plane_layouts(s)}
        layers.append((s, planes))
    nbytes = sum(t.numel() * t.element_size() for _, p in layers for t in p.values())
    fp = primecache.ModelFingerprint(architecture="kimi-linear-class", plan_digest=primecache.plan_digest(shapes),
                                     weights_digest=primecache.Hash128(lo=1, hi=1),
                                     codec_versions=primecache.codec_versions(shapes))
    model = primecache.ModelId.from_fingerprint(fp)
    with fresh_daemon() as socket:
        with primecache.connect(socket, timeout=60.0, shared_memory=True) as client:
            res = pt.publish(client, model, list(range(args.tokens)), layers, transform="raw/v1")
            rows = [("bytes", nbytes)]
            stats = {}

            def restore_into(device):
                dests = {i: (s, {n: torch.empty_like(t, device=device) for n, t in p.items()})
                         for i, (s, p) in enumerate(layers)}
                restore = lambda: pt.fetch_into(client, res.id, dests, stats=stats)  # noqa: E731
                restore()
                check_exact(layers, dests)  # once, outside the timed runs
                return restore

            cpu_sync = lambda: None  # noqa: E731
            restore_cpu = median_seconds(restore_into("cpu"), args.reps, cpu_sync)
            src = torch.empty(nbytes, dtype=torch.uint8).random_()
            dst = torch.empty_like(src)
            memcpy = median_seconds(lambda: dst.copy_(src), args.reps, cpu_sync)
            rows += [("restore_cpu_s", restore_cpu), ("memcpy_s", memcpy),
                     ("cpu_ratio", memcpy / restore_cpu)]
            if cuda:
                sync = torch.cuda.synchronize
                restore_cuda = median_seconds(restore_into("cuda"), args.reps, sync)
                pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).random_()
                dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
                h2d = median_seconds(lambda: dev.copy_(pinned, non_blocking=True), args.reps, sync)
                rows += [("restore_cuda_s", restore_cuda), ("h2d_pinned_s", h2d),
                         ("cuda_ratio", h2d / restore_cuda), ("cuda_device_chunks", stats["device_chunks"]),
                         ("cuda_host_chunks", stats["host_chunks"])]
                print(f"cuda restore path: {stats['path']}")
    report(f"torch restore, {args.tokens} tokens, {nbytes / 1e6:.1f} MB (median of {args.reps}):", rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
