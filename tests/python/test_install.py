"""`cmake --install --component python` puts a package that imports on its
own: the module, __init__.py, the stubs and py.typed, in the directory that
PRIMECACHE_PYTHON_INSTALL_DIR names under the prefix."""

import os
import subprocess
import sys


def test_installed_package_imports(tmp_path):
    build, site_dir = os.environ.get("PRIMECACHE_BUILD_DIR"), os.environ.get("PRIMECACHE_PYTHON_INSTALL_DIR")
    assert build and site_dir, "ctest sets PRIMECACHE_BUILD_DIR and PRIMECACHE_PYTHON_INSTALL_DIR"
    cmake = os.environ.get("CMAKE_COMMAND", "cmake")
    subprocess.run([cmake, "--install", build, "--component", "python", "--prefix", str(tmp_path)],
                   check=True, capture_output=True)
    package = tmp_path / site_dir / "primecache"
    assert {p.name for p in package.iterdir() if not p.name.startswith("_primecache.cpython")} == {
        "__init__.py", "_primecache.pyi", "py.typed", "torch.py", "hf.py"}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / site_dir)
    out = subprocess.run(
        [sys.executable, "-c", "import primecache; print(primecache.__file__, primecache.KvShape(k_width=3).k_width)"],
        env=env, check=True, capture_output=True, text=True)
    assert out.stdout.split() == [str(package / "__init__.py"), "3"]
