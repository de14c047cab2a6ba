"""Time to first token of a transformers model with its prefix restored
through primecache.hf, against a full prefill, measured side by side in one
run.

A randomly initialised Kimi-Linear-shaped model (kimi_linear: KDA linear
attention with an MLA layer every --mla-every layers, bf16) primes a prompt
of --tokens tokens, publishes its DynamicCache to a fresh primecached, and
then, each the median of --reps runs:
  - full: one forward of the whole prompt plus --suffix new tokens (the
    first token's logits without a cache);
  - restored: store.lookup (the fetch into a fresh DynamicCache) and the
    forward of the --suffix tokens after it;
  - kept: the forward of the --suffix tokens from a copy of the cache kept
    in memory (what no persistence at all costs).
It also checks that the restored continuation equals the kept one bit for
bit and prints its distance from the full prefill. CSV with --csv.

  PRIMECACHED=build/default/tools/primecached/primecached \\
  PYTHONPATH=... python3 tools/bench/hf_ttft_bench.py --tokens 8192
(transformers is on the GPU machine only: .gpu-bundle/run-python bench.)
"""

import argparse
import copy
import pathlib
import statistics
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import primecache
import primecache.hf as phf
import primecache.torch as pt
from bench_daemon import fresh_daemon, report


def make_model(args, device):
    layer_types = ["full_attention" if (i + 1) % args.mla_every == 0 else "linear_attention"
                   for i in range(args.layers)]
    heads, head_dim = 16, 128
    config = AutoConfig.for_model(
        "kimi_linear", vocab_size=4096, hidden_size=2048, intermediate_size=4096, num_hidden_layers=args.layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=args.tokens + 64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, moe_intermediate_size=512, num_local_experts=4,
        num_experts=4, num_experts_per_tok=2, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, linear_head_dim=head_dim, linear_num_heads=heads, linear_conv_kernel_dim=4,
        linear_attn_config={"head_dim": head_dim, "num_heads": heads, "short_conv_kernel_size": 4},
        layer_types=layer_types)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(torch.bfloat16).to(device).eval()


def timed(fn, sync):
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192, help="the stored prompt")
    ap.add_argument("--suffix", type=int, default=16, help="new tokens after it")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mla-every", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--csv", type=pathlib.Path)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    model = make_model(args, device)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 4096, (1, args.tokens + args.suffix), generator=gen).to(device)
    prompt, rest = ids[:, :args.tokens], ids[:, args.tokens:]
    with fresh_daemon() as socket, torch.no_grad():
        with primecache.connect(socket, timeout=120.0, shared_memory=True) as client:
            store = phf.CacheStore(client, model)
            kept = model(prompt, use_cache=True).past_key_values
            res = store.publish(prompt, kept, transform="raw/v1")
            stored = client.describe(res.id).info.raw_bytes
            full, restored, lookups, kept_t = [], [], [], []
            for _ in range(args.reps):
                t, out_full = timed(lambda: model(ids, use_cache=True).logits[:, -1], sync)
                full.append(t)

                def restore_and_continue():
                    t0 = time.perf_counter()
                    cache, covered = store.lookup(ids)
                    sync()
                    lookups.append(time.perf_counter() - t0)
                    assert covered == args.tokens, covered
                    return model(rest, past_key_values=cache, use_cache=True).logits[:, -1]

                t, out_restored = timed(restore_and_continue, sync)
                restored.append(t)
                copied = copy.deepcopy(kept)
                t, out_kept = timed(lambda: model(rest, past_key_values=copied, use_cache=True).logits[:, -1],
                                    sync)
                kept_t.append(t)
                if not torch.equal(out_restored, out_kept):
                    raise SystemExit("the restored continuation differs from the kept cache's")
            diff = (out_restored.float() - out_full.float()).abs().max().item()
            nbytes = sum(rows * width * primecache.element_bytes(dtype) for shape in store.shapes(args.tokens)
                         for _, rows, width, dtype in pt.plane_layouts(shape))
    med = statistics.median
    rows = [("tokens", args.tokens), ("suffix", args.suffix), ("layers", args.layers),
            ("cache_bytes", nbytes), ("stored_raw_bytes", stored),
            ("ttft_full_s", med(full)), ("ttft_restored_s", med(restored)), ("lookup_restore_s", med(lookups)),
            ("ttft_kept_s", med(kept_t)), ("full_over_restored", med(full) / med(restored)),
            ("restored_equals_kept", 1), ("max_abs_diff_vs_full", diff)]
    report(f"hf TTFT, kimi_linear-shaped bf16, {args.tokens} + {args.suffix} tokens on {device} "
           f"(median of {args.reps}):", rows, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
