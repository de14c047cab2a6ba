#!/usr/bin/python3
"""Plots primecache-eviction-bench's CSV: per trace, token hit rate and the
share of prefill FLOPs saved against the byte budget, one line per policy
(the unlimited store as a dashed line). Needs python3-matplotlib
(tools/setup installs it).

  tools/bench/plot_eviction.py OUT_DIR results.csv [more.csv ...]

writes OUT_DIR/eviction-TRACE.png for every trace in the files.
"""
import csv
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths):
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            rows.extend(r for r in csv.DictReader(f) if r["where"] == "process")
    return rows


def plot_trace(trace, rows, out_dir):
    lines = defaultdict(list)
    unlimited = None
    for r in rows:
        share = float(r["budget_share"])
        if share == 0:
            unlimited = r
            continue
        lines[r["policy"]].append((share, float(r["hit_rate"]), float(r["flops_saved_share"])))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy in sorted(lines):
        pts = sorted(lines[policy])
        xs = [100 * p[0] for p in pts]
        axes[0].plot(xs, [p[1] for p in pts], marker="o", label=policy)
        axes[1].plot(xs, [p[2] for p in pts], marker="o", label=policy)
    for ax, key, title in ((axes[0], "hit_rate", "token hit rate"), (axes[1], "flops_saved_share", "prefill FLOPs saved")):
        if unlimited is not None:
            ax.axhline(float(unlimited[key]), color="grey", linestyle="--", label="unlimited")
        ax.set_xscale("log")
        ticks = sorted({100 * float(r["budget_share"]) for r in rows if float(r["budget_share"]) > 0})
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}%" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("byte budget (% of the trace's whole state)")
        ax.set_ylabel(title)
        ax.set_ylim(0, 1)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{trace}: {title}")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = os.path.join(out_dir, f"eviction-{trace}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir = argv[1]
    os.makedirs(out_dir, exist_ok=True)
    by_trace = defaultdict(list)
    for r in load(argv[2:]):
        by_trace[r["trace"]].append(r)
    for trace, rows in sorted(by_trace.items()):
        print(plot_trace(trace, rows, out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
