#!/usr/bin/env python3
"""The daemon's Prometheus endpoint, end to end (docs/metrics.md).

Starts a real primecached with --metrics-listen 127.0.0.1:0 on a temporary
directory, reads the port it bound from its log, drives a known workload
through it (tests/ipc/metrics_workload.cc), scrapes /metrics with urllib and
parses the text with prometheus_client's parser; the numbers must be the
workload's. Also: other paths are 404, the endpoint is off unless asked for,
and an address beyond loopback is refused unless explicitly allowed.

  metrics_test.py --daemon PATH/primecached --workload PATH/metrics_workload
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

ARGS = None
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Daemon:
    """A primecached on a directory of its own, its log kept in a file."""

    def __init__(self, *extra):
        self.dir = tempfile.mkdtemp(prefix="pcmetrics-")
        self.log_path = os.path.join(self.dir, "log")
        self.ready = os.path.join(self.dir, "ready")
        self.socket = os.path.join(self.dir, "d.sock")
        args = [ARGS.daemon, "--socket", self.socket, "--admin-socket", os.path.join(self.dir, "a.sock"),
                "--data-dir", os.path.join(self.dir, "data"), "--ready-file", self.ready,
                "--read-threads", "2", "--workers", "2", "--fetch-workers", "2", *extra]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, limit=30):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if os.path.exists(self.ready):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"primecached exited {self.proc.returncode}: {self.text()}")
            time.sleep(0.02)
        raise AssertionError(f"primecached not ready in {limit} s: {self.text()}")

    def wait_exit(self, limit=30):
        return self.proc.wait(limit)

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def metrics_url(self):
        m = re.search(r"metrics on (http://\S+/metrics)", self.text())
        if not m:
            raise AssertionError("no metrics address in the log: " + self.text())
        return m.group(1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def listening_tcp_ports(pid):
    """The TCP ports a process listens on (its socket inodes in /proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"socket:\[(\d+)\]", target)
        if m:
            inodes.add(m.group(1))
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def samples(text):
    """{(sample name, frozenset(labels)): value} and {family name: type}."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return values, types


def value(values, name, **labels):
    key = (name, frozenset(labels.items()))
    if key not in values:
        raise AssertionError(f"no sample {name}{labels}")
    return values[key]


class MetricsEndpointTest(unittest.TestCase):
    def daemon(self, *extra):
        d = Daemon(*extra)
        self.addCleanup(d.stop)
        return d

    def run_workload(self, d, *extra):
        out = subprocess.run([ARGS.workload, "--socket", d.socket, *extra], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        return json.loads(out.stdout)

    def check_histogram(self, values, name, count):
        self.assertEqual(value(values, name + "_count"), count)
        self.assertEqual(value(values, name + "_bucket", le="+Inf"), count)
        buckets = sorted((float(dict(k[1])["le"]), v) for k, v in values.items() if k[0] == name + "_bucket")
        self.assertGreater(len(buckets), 10)
        counts = [v for _, v in buckets]
        self.assertEqual(counts, sorted(counts), "buckets must be cumulative")
        self.assertGreater(value(values, name + "_sum"), 0)

    def test_counts_what_the_workload_did(self):
        d = self.daemon("--metrics-listen", "127.0.0.1:0")
        d.wait_ready()
        url = d.metrics_url()
        self.assertRegex(url, r"^http://127\.0\.0\.1:\d+/metrics$")
        self.assertNotRegex(url, r":0/")
        did = self.run_workload(d, "--shm", "--publishes", "3", "--misses", "2")
        status, ctype, text = scrape(url)
        self.assertEqual(status, 200)
        self.assertEqual(ctype, CONTENT_TYPE)
        values, types = samples(text)
        print(text, file=sys.stderr)  # the example scrape in the test log

        self.assertEqual(value(values, "primecache_lookups_total", result="hit"), did["hits"])
        self.assertEqual(value(values, "primecache_lookups_total", result="miss"), did["misses"])
        self.assertEqual(value(values, "primecache_lookups_total", result="error"), did["errors"])
        self.assertEqual(value(values, "primecache_lookup_hit_tokens_total"), did["hit_tokens"])
        self.assertEqual(value(values, "primecache_publish_bytes_total"), did["publish_bytes"])
        self.assertEqual(value(values, "primecache_fetch_bytes_total"), did["fetch_bytes"])
        self.assertEqual(value(values, "primecache_publish_errors_total"), 0)
        self.assertEqual(value(values, "primecache_fetch_errors_total"), did["fetch_errors"])
        # Every chunk came through the shared window, adjacent ones in one message.
        chunks = value(values, "primecache_fetch_window_chunks_total", window="shared")
        messages = value(values, "primecache_fetch_window_messages_total", window="shared")
        self.assertEqual(chunks, did["fetch_chunks"])
        self.assertGreaterEqual(messages, did["fetches"])
        self.assertLessEqual(messages, chunks)
        self.assertEqual(value(values, "primecache_fetch_window_chunks_total", window="device"), 0)
        self.assertEqual(value(values, "primecache_fetch_window_messages_total", window="device"), 0)
        # The fetches ran in the fetch pool (its counts: tests/ipc/fanin_test.cc).
        self.assertGreaterEqual(value(values, "primecache_fetch_pool_threads"), 1)
        self.assertEqual(value(values, "primecache_fetch_pool_queued"), 0)
        self.assertEqual(value(values, "primecache_fetch_parks_refused_total"), 0)
        self.assertEqual(types["primecache_fetch_pool_parked"], "gauge")
        self.check_histogram(values, "primecache_publish_duration_seconds", did["publishes"])
        self.check_histogram(values, "primecache_fetch_duration_seconds", did["fetches"])
        self.assertEqual(types["primecache_publish_duration_seconds"], "histogram")
        self.assertEqual(types["primecache_lookups"], "counter")  # the parser drops _total from the family

        self.assertEqual(value(values, "primecache_entries"), did["publishes"])
        self.assertGreater(value(values, "primecache_stored_bytes"), did["publish_bytes"] / 2)
        self.assertGreaterEqual(value(values, "primecache_logical_bytes"), value(values, "primecache_stored_bytes")
                                - value(values, "primecache_dedup_saved_bytes") - 1)
        self.assertGreater(value(values, "primecache_raw_bytes"), 0)
        self.assertGreater(value(values, "primecache_disk_bytes"), 0)
        # Memory (docs/operations.md "Memory"): no --capacity, so the default
        # 256 MiB cache, with a quarter of it for the memtables charged to it.
        self.assertEqual(value(values, "primecache_block_cache_capacity_bytes"), 256 << 20)
        self.assertGreater(value(values, "primecache_memtable_bytes"), 0)
        self.assertGreaterEqual(value(values, "primecache_block_cache_used_bytes"),
                                value(values, "primecache_memtable_bytes") / 2)
        self.assertLessEqual(value(values, "primecache_block_cache_used_bytes"), 256 << 20)
        self.assertGreater(value(values, "primecache_heap_in_use_bytes"), 0)
        self.assertGreater(value(values, "primecache_resident_bytes"), value(values, "primecache_heap_in_use_bytes") / 2)
        for zero in ("primecache_evictions_total", "primecache_admission_refusals_total",
                     "primecache_quarantined_entries", "primecache_active_leases", "primecache_publishes_in_flight",
                     "primecache_publish_uncommitted_bytes", "primecache_store_writes_refused",
                     "primecache_capacity_bytes", "primecache_group_publishes_open",
                     "primecache_group_publishes_aborted_total"):
            self.assertEqual(value(values, zero), 0, zero)
        # The workload's connection and its shared region are gone.
        self.assertEqual(value(values, "primecache_shm_regions"), 0)
        self.assertEqual(value(values, "primecache_shm_capacity_bytes"), 0)
        self.assertEqual(value(values, "primecache_shm_in_use_bytes"), 0)
        self.assertFalse(any(k[0].startswith("primecache_remote_") for k in values), "no remote tier here")
        for name, t in types.items():
            self.assertTrue(name.startswith("primecache_"), name)
            self.assertIn(t, ("counter", "gauge", "histogram"), name)

        # A second run adds to the counters; the store's entries stay (same prefixes).
        did2 = self.run_workload(d, "--publishes", "3", "--misses", "1")
        values, _ = samples(scrape(url)[2])
        self.assertEqual(value(values, "primecache_lookups_total", result="hit"), did["hits"] + did2["hits"])
        self.assertEqual(value(values, "primecache_lookups_total", result="miss"), did["misses"] + did2["misses"])
        self.assertEqual(value(values, "primecache_fetch_duration_seconds_count"), did["fetches"] + did2["fetches"])
        self.assertEqual(value(values, "primecache_entries"), did["publishes"])

    def test_shared_memory_in_use(self):
        d = self.daemon("--metrics-listen", "127.0.0.1:0")
        d.wait_ready()
        url = d.metrics_url()
        w = subprocess.Popen([ARGS.workload, "--socket", d.socket, "--hold"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (w.kill(), w.wait(), w.stdin.close(), w.stdout.close()))
        held = json.loads(w.stdout.readline())["held_shm_bytes"]
        self.assertGreater(held, 0)
        # The fetch waits for room in its full window: what the client holds
        # there is in use; the region is the client's 128 KiB.
        values, _ = samples(scrape(url)[2])
        self.assertEqual(value(values, "primecache_connections"), 1)
        self.assertEqual(value(values, "primecache_shm_regions"), 1)
        self.assertEqual(value(values, "primecache_shm_capacity_bytes"), 128 << 10)
        self.assertEqual(value(values, "primecache_shm_in_use_bytes"), held)
        self.assertEqual(value(values, "primecache_active_leases"), 1)  # the fetch holds its entry
        w.stdin.write("release\n")
        w.stdin.flush()
        self.assertGreater(json.loads(w.stdout.readline())["fetched_chunks"], 0)
        self.assertEqual(w.wait(30), 0)
        # The daemon sees the client's connection close on its own thread:
        # wait (10 s at most) until it has, then read what it gave back.
        deadline = time.monotonic() + 10
        while True:
            values, _ = samples(scrape(url)[2])
            if value(values, "primecache_connections") == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(value(values, "primecache_connections"), 0)
        self.assertEqual(value(values, "primecache_shm_in_use_bytes"), 0)
        self.assertEqual(value(values, "primecache_shm_regions"), 0)
        self.assertEqual(value(values, "primecache_fetch_duration_seconds_count"), 1)
        self.assertEqual(value(values, "primecache_active_leases"), 0)

    def test_admission_refusals_are_not_errors(self):
        d = self.daemon("--metrics-listen", "127.0.0.1:0", "--admission", "seen-twice")
        d.wait_ready()
        did = self.run_workload(d, "--refused", "2")
        values, _ = samples(scrape(d.metrics_url())[2])
        self.assertEqual(value(values, "primecache_admission_refusals_total"), did["refused"])
        self.assertEqual(value(values, "primecache_publish_errors_total"), 0)
        self.assertEqual(value(values, "primecache_publish_duration_seconds_count"), 0)
        self.assertEqual(value(values, "primecache_entries"), 0)

    def test_other_paths_and_methods(self):
        d = self.daemon("--metrics-listen", "127.0.0.1:0")
        d.wait_ready()
        base = d.metrics_url()[: -len("/metrics")]
        for path in ("/", "/metric", "/metrics/x", "/favicon.ico"):
            with self.assertRaises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(base + path, timeout=10)
            self.assertEqual(e.exception.code, 404, path)
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(base + "/metrics", data=b"x", method="POST"), timeout=10)
        self.assertEqual(e.exception.code, 405)

    def test_off_by_default(self):
        d = self.daemon()
        d.wait_ready()
        self.assertNotIn("metrics on", d.text())
        self.assertEqual(listening_tcp_ports(d.proc.pid), set())
        # The same check sees the endpoint when there is one.
        on = self.daemon("--metrics-listen", "127.0.0.1:0")
        on.wait_ready()
        port = int(on.metrics_url().rsplit(":", 1)[1].split("/")[0])
        self.assertEqual(listening_tcp_ports(on.proc.pid), {port})

    def test_non_loopback_refused_unless_allowed(self):
        d = self.daemon("--metrics-listen", "0.0.0.0:0")
        self.assertEqual(d.wait_exit(), 1)
        self.assertIn("not a loopback address", d.text())
        self.assertIn("--metrics-allow-non-loopback", d.text())
        self.assertFalse(os.path.exists(d.socket), "a daemon that refused to start left its socket")
        bad = self.daemon("--metrics-listen", "127.0.0.1:http")
        self.assertEqual(bad.wait_exit(), 1)
        self.assertIn("the port must be 0..65535", bad.text())

        allowed = self.daemon("--metrics-listen", "0.0.0.0:0", "--metrics-allow-non-loopback")
        allowed.wait_ready()
        self.assertIn("beyond loopback, without authentication", allowed.text())
        port = allowed.metrics_url().rsplit(":", 1)[1].split("/")[0]
        status, _, text = scrape(f"http://127.0.0.1:{port}/metrics")
        self.assertEqual(status, 200)
        self.assertIn("primecache_entries 0", text)

    def test_remote_tier_counters(self):
        # A cluster that is not up: the daemon starts anyway; every lookup the
        # local store does not cover whole (the workload's hits are of
        # queries longer than their boundary, and its misses) and every
        # write-behind of a committed entry is a failed cluster operation.
        d = self.daemon("--metrics-listen", "127.0.0.1:0", "--remote", "redis://127.0.0.1:1", "--remote-timeout",
                        "0.2", "--remote-miss-ttl", "0")
        d.wait_ready()
        did = self.run_workload(d, "--publishes", "2", "--misses", "2")
        deadline = time.monotonic() + 30
        while True:  # the write-behind queue drains on a thread of its own
            values, types = samples(scrape(d.metrics_url())[2])
            if value(values, "primecache_remote_write_queue_depth") == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(value(values, "primecache_remote_write_queue_depth"), 0)
        self.assertEqual(value(values, "primecache_remote_writes_total", result="queued"), did["publishes"])
        self.assertEqual(value(values, "primecache_remote_writes_total", result="put"), 0)
        self.assertEqual(value(values, "primecache_remote_errors_total"),
                         did["hits"] + did["misses"] + did["publishes"])
        for result in ("hit", "miss", "miss_cached"):
            self.assertEqual(value(values, "primecache_remote_lookups_total", result=result), 0, result)
        self.assertEqual(value(values, "primecache_remote_fetched_bytes_total"), 0)
        self.assertEqual(types["primecache_remote_breaker_open"], "gauge")
        self.assertEqual(types["primecache_remote_redirects"], "counter")

def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--daemon", required=True)
    parser.add_argument("--workload", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
