"""What the Python benchmarks (torch_restore_bench.py, hf_ttft_bench.py)
share: a fresh primecached of their own for the run (PRIMECACHED names the
binary), and the report of (metric, value) rows on stdout and as CSV."""

import contextlib
import csv
import os
import pathlib
import signal
import subprocess
import tempfile
import time


@contextlib.contextmanager
def fresh_daemon():
    """Starts primecached on a temporary data dir; yields its socket path;
    stops it with SIGTERM."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        ready = root / "ready"
        proc = subprocess.Popen([os.environ["PRIMECACHED"], "--data-dir", str(root / "data"), "--socket",
                                 str(root / "d.sock"), "--admin-socket", str(root / "a.sock"), "--ready-file",
                                 str(ready), "--log-level", "warn"])
        try:
            deadline = time.monotonic() + 30
            while not ready.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("primecached did not start")
                time.sleep(0.02)
            yield str(root / "d.sock")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def report(title, rows, csv_path=None):
    """Prints the rows under `title`, and writes them to csv_path if given."""
    print(title)
    for name, value in rows:
        print(f"  {name:22s} {value:.6g}")
    if csv_path:
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        with open(csv_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["metric", "value"])
            w.writerows(rows)
