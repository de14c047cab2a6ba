"""Fixtures of the Python client's tests: a real primecached on a temporary
data dir and socket (PRIMECACHED names the binary; ctest sets it), stopped
with SIGTERM at the end, and a client connected to it."""

import os
import signal
import subprocess
import time

import pytest

import primecache


class Daemon:
    """primecached on `root`: socket root/d.sock, admin socket root/a.sock,
    store root/data; start() returns once it wrote its ready file."""

    def __init__(self, binary, root):
        self.binary = binary
        self.root = root
        self.socket = str(root / "d.sock")
        self.proc = None

    def start(self):
        ready = self.root / "ready"
        args = [self.binary, "--data-dir", str(self.root / "data"), "--socket", self.socket,
                "--admin-socket", str(self.root / "a.sock"), "--ready-file", str(ready), "--log-level", "warn"]
        self.proc = subprocess.Popen(args)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"primecached exited with {self.proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError("primecached not ready within 30 s")
            time.sleep(0.02)

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -1


@pytest.fixture
def daemon(tmp_path):
    binary = os.environ.get("PRIMECACHED")
    if not binary:
        pytest.fail("PRIMECACHED is not set (ctest sets it to the built primecached)")
    d = Daemon(binary, tmp_path)
    d.start()
    yield d
    assert d.stop() == 0, "primecached did not exit cleanly on SIGTERM"


@pytest.fixture
def client(daemon):
    with primecache.connect(daemon.socket, timeout=15.0) as c:
        yield c
