#!/usr/bin/python3
"""Draws the benchmarks' CSV figures as PNG charts (docs/BENCHMARKS.md).
Needs python3-matplotlib (tools/setup installs it).

  tools/bench/plot.py OUT_DIR CSV_OR_DIR [...]

Each CSV is recognised by its header (the columns a benchmark writes; see
FIGURES below), never by its name: a file whose header matches no figure is
an error, so a benchmark whose CSV changes fails here (and in the ctest
`bench_plot_smoke`) until this script follows. A directory stands for every
*.csv in it. Writes, under OUT_DIR, and prints one path per line:

  codec_bench --csv X.csv            X.png: ratio, encode and decode GB/s per kind x transform
  statestore_bench --csv-dir D       lookup-latency.png: p50/p99 lookup latency against entries
  ipc_bench --csv-dir D              ipc-fetch.png (fetch GB/s against memcpy), ipc-lookup.png
  primecache-model-bench --csv-dir D model-ttft-CONFIG.png (TTFT full vs restored by prefix),
                                     model-restore-CONFIG.png (restore GB/s against pinned H2D)
  primecache-engine-bench --csv-dir D engine-restore-BACKEND.png (as model-restore); with --kv-kinds
                                     kv-kinds-BACKEND.png (bytes per token, restore GB/s per KV kind)
  primecache-eviction-bench --csv X  eviction-TRACE.png per trace, rows of every such file merged
  primecache-cluster-bench --csv X   X.png: put and fetch GB/s and their ratios to redis-benchmark
                                     (one key, keyspace, new keys) per chunk size
  primecache-serving-bench --csv X   X.png: hit rate (and the replay's), TTFT p50/p95 and stored bytes
                                     per trace x boundary setting
  primecache-fanin-bench --csv-dir D fanin-CONFIG-BACKEND.png (with --tp: fanin-tp-...): aggregate restore rate against the copy
                                     and the slowest engine against its fair share, per engines at once
"""
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 110


def save(fig, path, bottom=0.0):
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def grouped_bars(ax, groups, series, values, fmt=None):
    """Bars of values[(group, series)] for every group (x) and series (colour)."""
    width = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ys = [values.get((grp, s), float("nan")) for grp in groups]
        bars = ax.bar(xs, ys, width, label=s)
        if fmt:
            ax.bar_label(bars, labels=[fmt(y) if y == y else "" for y in ys], fontsize=7, padding=1)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)


def legend_below(fig, ax, columns=3):
    """The axes' legend under the chart, clear of the bars; the share of the
    figure's height it takes."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=7, frameon=False)
    return 0.04 + 0.035 * ((len(labels) + columns - 1) // columns)


# ---- codec_bench ---------------------------------------------------------------


def plot_codec(rows, out):
    layer = [r for r in rows if r["what"] == "layer"]
    kinds = list(dict.fromkeys(r["kind"] for r in layer))
    transforms = list(dict.fromkeys(r["transform"] for r in layer))
    tokens = rows[0]["tokens"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, key, title in ((axes[0], "ratio", "ratio raw / encoded"),
                           (axes[1], "encode_gbps", "encode GB/s (one thread)"),
                           (axes[2], "decode_gbps", "decode GB/s (one thread)")):
        vals = {(r["kind"], r["transform"]): float(r[key]) for r in layer}
        grouped_bars(ax, kinds, transforms, vals, fmt=lambda y: f"{y:.2f}")
        ax.set_title(f"{title}, {tokens} tokens")
    memcpy = {k: median([float(r["memcpy_gbps"]) for r in layer if r["kind"] == k]) for k in kinds}
    for ax in axes[1:]:
        for g, k in enumerate(kinds):
            ax.hlines(memcpy[k], g - 0.45, g + 0.45, colors="black", linestyles="--",
                      label="memcpy of the same bytes" if g == 0 else None)
    axes[0].margins(y=0.12)
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    return [save(fig, out + ".png", bottom=0.07)]


# ---- statestore_bench ------------------------------------------------------------


def plot_lookup(rows, out):
    xs = [int(r["entries"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key, label, style in (("hit_p50_us", "hit p50", "-o"), ("hit_p99_us", "hit p99", "--o"),
                              ("miss_p50_us", "miss p50", "-s"), ("miss_p99_us", "miss p99", "--s")):
        ax.plot(xs, [float(r[key]) for r in rows], style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:,}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel("entries in the store")
    ax.set_ylabel("lookup latency, µs (log)")
    ax.set_title(f"store lookup, {rows[0]['query_tokens']}-token queries, in process")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return [save(fig, out + ".png")]


# ---- ipc_bench ---------------------------------------------------------------------


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def plot_ipc_fetch(rows, out):
    by = defaultdict(list)
    for r in rows:
        by[r["path"]].append(float(r["gbps"]))
    paths = list(by)
    meds = [median(by[p]) for p in paths]
    lo = [m - min(by[p]) for p, m in zip(paths, meds)]
    hi = [max(by[p]) - m for p, m in zip(paths, meds)]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    bars = ax.bar(paths, meds, yerr=[lo, hi], capsize=4, color=["grey"] + ["C0"] * (len(paths) - 1))
    base = median(by["memcpy"]) if "memcpy" in by else None
    labels = [f"{m:.2f}" + (f"\n{m / base:.2f}x memcpy" if base and p != "memcpy" else "")
              for p, m in zip(paths, meds)]
    ax.bar_label(bars, labels=labels, fontsize=8, padding=2)
    ax.set_ylabel("GB/s (median; bars: min to max)")
    ax.set_title(f"fetch of a {int(rows[0]['bytes']) / 2**20:.0f} MiB entry from primecached")
    ax.grid(True, axis="y", alpha=0.3)
    return [save(fig, out + ".png")]


def plot_ipc_lookup(rows, out):
    vals = {}
    for r in rows:
        vals[(r["query"], "p50")] = float(r["p50_us"])
        vals[(r["query"], "p99")] = float(r["p99_us"])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    grouped_bars(ax, [r["query"] for r in rows], ["p50", "p99"], vals, fmt=lambda y: f"{y:.0f}")
    ax.set_ylabel("round trip, µs")
    ax.set_title("lookup through primecached's socket")
    ax.legend(fontsize=8)
    return [save(fig, out + ".png")]


# ---- model_bench / engine_capture_bench --------------------------------------------


def plot_ttft(rows, out):
    prefixes = [str(p) for p in sorted({int(r["prefix_tokens"]) for r in rows})]
    paths = list(dict.fromkeys(r["path"] for r in rows))
    vals = {(r["prefix_tokens"], r["path"]): float(r["ttft_ms"]) for r in rows}
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(prefixes) + 2), 4.4))
    grouped_bars(ax, prefixes, paths, vals, fmt=lambda y: f"{y:.3g}")
    ax.set_yscale("log")
    ax.set_xlabel(f"prefix tokens (+ {rows[0]['suffix_tokens']} suffix tokens)")
    ax.set_ylabel("time to first token, ms (log)")
    ax.set_title(f"TTFT, full prefill against a restored prefix: {rows[0]['config']} on {rows[0]['device']}",
                 fontsize=9)
    return [save(fig, out + ".png", bottom=legend_below(fig, ax))]


def plot_restore(rows, out):
    prefixes = [str(p) for p in sorted({int(r["prefix_tokens"]) for r in rows})]
    paths = list(dict.fromkeys(r["path"] for r in rows))
    vals = {(r["prefix_tokens"], r["path"]): float(r["restore_gbps"]) for r in rows}
    pinned = {r["prefix_tokens"]: float(r["pinned_h2d_gbps"]) for r in rows}
    fig, ax = plt.subplots(figsize=(max(6.5, 2.2 * len(prefixes) + 2), 4.4))
    grouped_bars(ax, prefixes, paths, vals, fmt=lambda y: f"{y:.3g}")
    for g, p in enumerate(prefixes):
        ax.hlines(pinned[p], g - 0.45, g + 0.45, colors="black", linestyles="--",
                  label="pinned host-to-device copy" if g == 0 else None)
        ax.hlines(0.8 * pinned[p], g - 0.45, g + 0.45, colors="red", linestyles=":",
                  label="target: 0.8 x pinned copy" if g == 0 else None)
    ax.set_xlabel("prefix tokens")
    ax.set_ylabel("restore GB/s")
    ax.set_title(f"restore rate against the pinned copy: {rows[0]['config']} on {rows[0]['device']}", fontsize=9)
    return [save(fig, out + ".png", bottom=legend_below(fig, ax))]


def plot_kv_kinds(rows, out):
    kinds = [r["kind"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    vals = {}
    for r in rows:
        for key, label in (("booked_bytes_per_token", "booked"), ("snapshot_bytes_per_token", "captured"),
                           ("stored_bytes_per_token", "stored (shuffle-zstd L1)")):
            vals[(r["kind"], label)] = float(r[key])
    grouped_bars(axes[0], kinds, ["booked", "captured", "stored (shuffle-zstd L1)"], vals,
                 fmt=lambda y: f"{y:.0f}")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("bytes per token (log)")
    axes[0].legend(fontsize=7)
    bars = axes[1].bar(range(len(kinds)), [float(r["restore_gbps"]) for r in rows], color="C2")
    axes[1].bar_label(bars, labels=[f"{float(r['restore_gbps']):.3g}" for r in rows], fontsize=7)
    axes[1].set_xticks(range(len(kinds)))
    axes[1].set_ylabel("restore from pinned memory, GB/s")
    axes[1].grid(True, axis="y", alpha=0.3)
    for ax in axes:
        ax.set_xticklabels(kinds, fontsize=7, rotation=20, ha="right")
    fig.suptitle(f"KV storage kinds at {rows[0]['tokens']} tokens on {rows[0]['device']}", fontsize=10)
    return [save(fig, out + ".png")]


# ---- eviction_bench ---------------------------------------------------------------------


def plot_eviction_trace(trace, rows, out_dir):
    lines = defaultdict(list)
    unlimited = None
    for r in rows:
        share = float(r["budget_share"])
        if share == 0:
            unlimited = r
            continue
        lines[r["policy"]].append((share, float(r["hit_rate"]), float(r["flops_saved_share"])))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    ticks = sorted({100 * float(r["budget_share"]) for r in rows if float(r["budget_share"]) > 0})
    for policy in sorted(lines):
        pts = sorted(lines[policy])
        xs = [100 * p[0] for p in pts]
        axes[0].plot(xs, [p[1] for p in pts], marker="o", label=policy)
        axes[1].plot(xs, [p[2] for p in pts], marker="o", label=policy)
    for ax, key, title in ((axes[0], "hit_rate", "token hit rate"),
                           (axes[1], "flops_saved_share", "prefill FLOPs saved")):
        if unlimited is not None:
            ax.axhline(float(unlimited[key]), color="grey", linestyle="--", label="unlimited")
        ax.set_xscale("log")
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}%" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("byte budget (% of the trace's whole state)")
        ax.set_ylabel(title)
        ax.set_ylim(0, 1)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{trace}: {title}")
    axes[1].legend(fontsize=8, loc="lower right")
    return save(fig, os.path.join(out_dir, f"eviction-{trace}.png"))


def plot_eviction(rows, out_dir):
    """Every eviction file's in-process rows together, one chart per trace."""
    by_trace = defaultdict(list)
    for r in rows:
        if r["where"] == "process":
            by_trace[r["trace"]].append(r)
    return [plot_eviction_trace(t, rs, out_dir) for t, rs in sorted(by_trace.items())]


def plot_serving(rows, out):
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    at = {(r["trace"], r["setting"]): r for r in rows}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2))
    hit = {k: float(r["hit_rate"]) for k, r in at.items()}
    grouped_bars(axes[0], traces, settings, hit, fmt=lambda y: f"{y:.2f}")
    width = 0.8 / max(len(settings), 1)
    for i, s in enumerate(settings):
        xs = [g + (i - (len(settings) - 1) / 2) * width for g in range(len(traces))]
        ys = [float(at[(t, s)]["replay_hit_rate"]) if (t, s) in at else float("nan") for t in traces]
        axes[0].scatter(xs, ys, marker="_", s=300, color="black", zorder=3,
                        label="replay's estimate" if i == 0 else None)
    axes[0].set_ylim(0, 1.1)
    axes[0].set_ylabel("token hit rate")
    axes[0].set_title("hit rate (bars: real path; dash: replay)")
    p50 = {k: float(r["ttft_p50_ms"]) for k, r in at.items()}
    grouped_bars(axes[1], traces, settings, p50, fmt=lambda y: f"{y:.0f}")
    for i, s in enumerate(settings):
        xs = [g + (i - (len(settings) - 1) / 2) * width for g in range(len(traces))]
        ys = [float(at[(t, s)]["ttft_p95_ms"]) if (t, s) in at else float("nan") for t in traces]
        axes[1].scatter(xs, ys, marker="v", color="black", s=14, zorder=3, label="p95" if i == 0 else None)
    axes[1].set_ylabel("ms")
    axes[1].set_title("TTFT p50 (bars) and p95")
    end = {t: float(at[(t, settings[0])]["stored_bytes"]) for t in traces if (t, settings[0]) in at}
    stored = {k: float(r["stored_bytes"]) / end[k[0]] for k, r in at.items() if end.get(k[0])}
    grouped_bars(axes[2], traces, settings, stored, fmt=lambda y: f"{y:.2f}x")
    axes[2].set_ylabel(f"stored bytes / {settings[0]}'s")
    axes[2].set_title("bytes stored")
    for ax, where in zip(axes, ("lower left", "upper right", "upper left")):
        ax.legend(fontsize=7, loc=where)
    return [save(fig, out + ".png")]


# ---- fanin_bench ------------------------------------------------------------------------------


def plot_fanin(rows, out):
    # fanin-tp-*: the rank processes of one TP entry (primecache-fanin-bench --tp).
    tp = os.path.basename(out).startswith("fanin-tp-")
    who = "TP ranks (one process each) restoring their parts of one entry" if tp else "engine processes restoring"
    rows = sorted(rows, key=lambda r: int(r["engines"]))
    engines = [r["engines"] for r in rows]
    xs = range(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    vs = [float(r["vs_copy"]) for r in rows]
    bars = axes[0].bar(xs, vs, color="C0")
    axes[0].bar_label(bars, labels=[f"{v:.2f}x\n{float(r['aggregate_gbps']):.3g} GB/s" for v, r in zip(vs, rows)],
                      fontsize=7, padding=1)
    axes[0].axhline(1.0, color="black", linestyle="--",
                    label=f"the copy ({median([float(r['copy_gbps']) for r in rows]):.3g} GB/s)")
    axes[0].axhline(0.8, color="red", linestyle=":", label="target: 0.8 x the copy")
    axes[0].set_ylabel("aggregate restore rate / copy rate")
    axes[0].set_title("every engine's bytes over the span, against the copy", fontsize=9)
    worst = [float(r["max_fair_share"]) for r in rows]
    bars = axes[1].bar(xs, worst, color="C1")
    axes[1].bar_label(bars, labels=[f"{w:.2f}x" for w in worst], fontsize=7, padding=1)
    axes[1].axhline(1.0, color="black", linestyle="--", label="fair share")
    axes[1].axhline(1.5, color="red", linestyle=":", label="target: within 1.5 x")
    axes[1].set_ylabel("slowest engine's restore / its fair share")
    axes[1].set_title("the slowest engine against its fair share", fontsize=9)
    for ax in axes:
        ax.set_xticks(list(xs))
        ax.set_xticklabels(engines)
        ax.set_xlabel(who + " at once")
        ax.set_ylim(0, max(1.6, *(ax.get_ylim()[1:])) * 1.08)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    what = "TP ranks restoring at once" if tp else "many restores at once"
    fig.suptitle(f"{what}: {rows[0]['config']}, {int(rows[0]['prefix_tokens'])} tokens each, "
                 f"on {rows[0]['device']}", fontsize=10)
    return [save(fig, out + ".png")]


# ---- cluster_bench --------------------------------------------------------------------------


def plot_cluster(rows, out):
    chunks = [f"{float(r['chunk_mib']):g} MiB" for r in rows]
    fig, (rates, ratios) = plt.subplots(1, 2, figsize=(11, 4.4))
    rate_cols = [("put_gbps", "tier put"), ("set_keyspace_gbps", "SET keyspace"), ("set_1key_gbps", "SET 1 key"),
                 ("fetch_gbps", "tier fetch"), ("fetch_no_pool_gbps", "tier fetch, no pool"),
                 ("get_keyspace_gbps", "GET keyspace"), ("get_1key_gbps", "GET 1 key")]
    vals = {(c, label): float(r[col]) for c, r in zip(chunks, rows) for col, label in rate_cols}
    grouped_bars(rates, chunks, [label for _, label in rate_cols], vals, fmt=lambda y: f"{y:.1f}")
    rates.set_ylabel("GB/s (median of the repetitions)")
    rates.set_title("remote tier and redis-benchmark, same cluster and run")
    rates.set_ylim(0, max(float(r[c]) for r in rows for c, _ in rate_cols) * 1.35)
    rates.legend(fontsize=7, ncol=3, loc="upper left")
    ratio_cols = [("fetch_over_get_keyspace", "fetch / GET keyspace"), ("fetch_over_get_1key", "fetch / GET 1 key"),
                  ("put_over_set_keyspace", "put / SET keyspace"), ("put_over_set_1key", "put / SET 1 key"),
                  ("put_over_set_new_keys", "put / SET new keys")]
    vals = {(c, label): float(r[col]) for c, r in zip(chunks, rows) for col, label in ratio_cols}
    grouped_bars(ratios, chunks, [label for _, label in ratio_cols], vals, fmt=lambda y: f"{y:.2f}")
    ratios.axhline(0.8, color="C0", ls="--", lw=1, label="fetch target 0.8x")
    ratios.axhline(0.7, color="C2", ls=":", lw=1, label="put target 0.7x")
    ratios.set_ylabel("tier / redis-benchmark (median of per-repetition ratios)")
    ratios.set_title("ratios (fetch judged on GET keyspace, put on SET new keys)", fontsize=10)
    ratios.set_ylim(0, max(float(r[c]) for r in rows for c, _ in ratio_cols) * 1.45)
    ratios.legend(fontsize=7, ncol=2, loc="upper left")
    return [save(fig, out + ".png")]


# ---- dispatch -------------------------------------------------------------------------------

RESTORE = ("config,device,prefix_tokens,path,restored_bytes,restore_ms,restore_gbps,pinned_h2d_gbps")
# The exact header each benchmark writes -> how to draw it. `merge`: every
# file of that kind drawn together (and named by the figure, not the file).
FIGURES = {
    "kind,what,transform,tokens,raw_bytes,encoded_bytes,ratio,encode_gbps,decode_gbps,memcpy_gbps": (plot_codec, False),
    "entries,query_tokens,hit_tokens,hit_p50_us,hit_p99_us,miss_p50_us,miss_p99_us": (plot_lookup, False),
    "path,rep,bytes,gbps": (plot_ipc_fetch, False),
    "query,round_trips,p50_us,p99_us": (plot_ipc_lookup, False),
    "config,device,prefix_tokens,suffix_tokens,path,ttft_ms": (plot_ttft, False),
    RESTORE: (plot_restore, False),
    "device,tokens,kind,booked_bytes_per_token,snapshot_bytes_per_token,stored_bytes_per_token,capture_ms,"
    "restore_gbps": (plot_kv_kinds, False),
    "budget_bytes,budget_share,bytes_written,evictions,failed,flops_saved,flops_saved_share,hit_rate,hit_tokens,"
    "over_budget,peak_stored_bytes,policy,prefill_flops,prompt_tokens,publishes,refused,requests,requests_hit,"
    "seconds,trace,ttft_mean_ms,ttft_nocache_mean_ms,ttft_p95_ms,where": (plot_eviction, True),
    "chunk_mib,put_gbps,set_1key_gbps,set_keyspace_gbps,set_new_keys_gbps,fetch_gbps,fetch_no_pool_gbps,"
    "get_1key_gbps,get_keyspace_gbps,put_over_set_1key,put_over_set_keyspace,put_over_set_new_keys,"
    "fetch_over_get_1key,fetch_over_get_keyspace,lookup_p50_ms,lookup_p99_ms": (plot_cluster, False),
    "trace,setting,requests,prompt_tokens,hit_rate,replay_hit_rate,published,stored_bytes,ttft_p50_ms,"
    "ttft_p95_ms": (plot_serving, False),
    "config,device,prefix_tokens,engines,restored_bytes,span_ms,aggregate_gbps,copy_gbps,vs_copy,restore_ms_min,"
    "restore_ms_max,max_fair_share,device_chunks": (plot_fanin, False),
}


def csv_files(args):
    for a in args:
        if os.path.isdir(a):
            yield from sorted(os.path.join(a, f) for f in os.listdir(a) if f.endswith(".csv"))
        else:
            yield a


def read(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return ",".join(reader.fieldnames or []), rows


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = argv[1]
    os.makedirs(out_dir, exist_ok=True)
    merged = defaultdict(list)
    for path in csv_files(argv[2:]):
        header, rows = read(path)
        if header not in FIGURES:
            print(f"plot.py: {path}: no figure has the header\n  {header}\nknown headers:\n  " +
                  "\n  ".join(FIGURES), file=sys.stderr)
            return 1
        if not rows:
            print(f"plot.py: {path}: no rows", file=sys.stderr)
            return 1
        draw, merge = FIGURES[header]
        if merge:
            merged[draw].extend(rows)
            continue
        stem = os.path.splitext(os.path.basename(path))[0]
        for png in draw(rows, os.path.join(out_dir, stem)):
            print(png)
    for draw, rows in merged.items():
        for png in draw(rows, out_dir):
            print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
