#!/usr/bin/env bash
# bench_plot_smoke: short runs of the benchmarks that write CSV, then
# tools/bench/plot.py over their CSVs; checks every expected chart is a
# non-empty PNG. plot.py refuses a CSV whose header it does not know.
#   plot_smoke.sh SOURCE_DIR WORK_DIR name=binary...
set -euo pipefail
src=$1
work=$2
shift 2
declare -A bin
for kv in "$@"; do bin[${kv%%=*}]=${kv#*=}; done

rm -rf "$work"
mkdir -p "$work/csv" "$work/png" "$work/scratch"
csv=$work/csv
expect=()

"${bin[codec_bench]}" --tokens 256 --reps 1 --csv "$csv/codec-256.csv" > /dev/null
expect+=(codec-256.png)
"${bin[statestore_bench]}" --dir "$work/scratch" --no-throughput --no-dedup --max-entries 1000 --queries 10 \
  --csv-dir "$csv" > /dev/null 2>&1
expect+=(lookup-latency.png)
"${bin[ipc_bench]}" --daemon "${bin[primecached]}" --mib 4 --reps 2 --lookups 50 --csv-dir "$csv" > /dev/null
expect+=(ipc-fetch.png ipc-lookup.png)
if [ -n "${bin[model_bench]:-}" ]; then
  (cd "$src" && "${bin[model_bench]}" --cpu --config configs/hrm-tiny.json --prefix 48 --prefix 96 --suffix 4 \
    --chunk 64 --daemon "${bin[primecached]}" --csv-dir "$csv" > /dev/null)
  for f in "$csv"/model-ttft-*.csv "$csv"/model-restore-*.csv; do
    [ -e "$f" ] || { echo "plot_smoke: model bench wrote no $f" >&2; exit 1; }
    expect+=("$(basename "${f%.csv}").png")
  done
  # A brief CPU run may miss the bench's speed targets (exit 3); a copy that
  # is not exact (exit 1) or a crash fails the smoke.
  rc=0
  "${bin[engine_bench]}" --cpu --tokens 64 --mla-layers 1 --kda-layers 1 --ring 0 --chunk 32 --eager-reps 1 \
    --full-reps 1 --restore-reps 1 --csv-dir "$csv" > "$work/engine-bench.txt" || rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then
    echo "plot_smoke: engine bench exit $rc" >&2
    cat "$work/engine-bench.txt" >&2
    exit 1
  fi
  [ -e "$csv/engine-restore-cpu.csv" ] || { echo "plot_smoke: engine bench wrote no CSV" >&2; exit 1; }
  expect+=(engine-restore-cpu.png)
  "${bin[engine_bench]}" --cpu --kv-kinds --tokens 64 --restore-reps 1 --csv-dir "$csv" > /dev/null
  expect+=(kv-kinds-cpu.png)
fi
if [ -n "${bin[fanin_bench]:-}" ]; then
  (cd "$src" && "${bin[fanin_bench]}" --cpu --config configs/hrm-tiny.json --prefix 256 --engines 1 2 \
    --daemon "${bin[primecached]}" --csv-dir "$csv" > /dev/null)
  [ -e "$csv/fanin-hrm-tiny-cpu.csv" ] || { echo "plot_smoke: fanin bench wrote no CSV" >&2; exit 1; }
  expect+=(fanin-hrm-tiny-cpu.png)
fi
# The eviction figures' committed CSV (its own smoke run is eviction_bench_smoke).
cp "$src/docs/img/eviction-results.csv" "$csv/"
expect+=(eviction-chat.png eviction-mixed.png)
# The cluster bench's committed CSV (its runs need a loopback Redis Cluster
# and minutes: docs/BENCHMARKS.md, "Remote tier on Redis Cluster").
cp "$src/docs/img/cluster-bench.csv" "$csv/"
expect+=(cluster-bench.png)
# The serving bench's committed CSV (its own smoke runs are serving_bench_smoke*).
cp "$src/docs/img/serving/serving-cpu.csv" "$csv/"
expect+=(serving-cpu.png)

/usr/bin/python3 "$src/tools/bench/plot.py" "$work/png" "$csv" > "$work/plotted.txt"
for png in "${expect[@]}"; do
  f=$work/png/$png
  if [ ! -s "$f" ] || [ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" != "89504e470d0a1a0a" ]; then
    echo "plot_smoke: $png missing, empty or not a PNG" >&2
    exit 1
  fi
done
echo "plot_smoke: ${#expect[@]} charts drawn from $(ls "$csv" | wc -l) CSV files"
