"""llama.cpp's own `llama-server`, built on demand from the sources vendored in the
llama-cpp-python sdist and cached outside the repository (~/.cache/pagoda/llama-server).

The first build takes ~9 min on 2 quiet cores (cmake, Release, native CPU flags); it runs at
`nice 19` and only once (a file lock serialises concurrent callers). Start it ahead of time:

    .venv/bin/python -P benchmarks/llama_server.py          # builds if needed, prints the path
"""

from __future__ import annotations

import fcntl
import glob
import os
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE = Path(os.environ.get("PAGODA_CACHE", Path.home() / ".cache" / "pagoda")) / "llama-server"
BINARY = CACHE / "build" / "bin" / "llama-server"


def _run(cmd: list[str], log) -> None:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)


def _sources(log) -> Path:
    """The vendored llama.cpp tree, from the llama-cpp-python sdist (downloaded by pip)."""
    found = sorted(glob.glob(str(CACHE / "src" / "*" / "vendor" / "llama.cpp")))
    if found:
        return Path(found[-1])
    sdist_dir = CACHE / "sdist"
    sdists = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        _run([*pip, "llama-cpp-python", "-d", str(sdist_dir)], log)
        sdists = sorted(sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdists[-1]) as tar:
        tar.extractall(CACHE / "src", filter="data")
    return Path(sorted(glob.glob(str(CACHE / "src" / "*" / "vendor" / "llama.cpp")))[-1])


def _cpu_flags() -> list[str]:
    """Native CPU flags, except on AMX machines: llama.cpp's AMX kernels die with SIGILL
    (`tilezero`) inside these VMs, so there AVX-512 is enabled explicitly and AMX left out."""
    try:
        with open("/proc/cpuinfo") as f:
            amx = "amx_tile" in f.read()
    except OSError:
        amx = False
    if not amx:
        return ["-DGGML_NATIVE=ON"]
    on = ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AVX_VNNI", "AVX2", "FMA", "F16C",
          "BMI2")  # fmt: skip
    off = ("AMX_TILE", "AMX_INT8", "AMX_BF16")
    return ["-DGGML_NATIVE=OFF", *(f"-DGGML_{f}=ON" for f in on), *(f"-DGGML_{f}=OFF" for f in off)]


def build_llama_server(jobs: int | None = None) -> Path:
    """Path of the llama-server binary, building it first if the cache has none."""
    if BINARY.exists():
        return BINARY
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent caller waits for the first build
        if BINARY.exists():
            return BINARY
        with open(CACHE / "build.log", "a") as log:
            src = _sources(log)
            nice = ["nice", "-n", "19"]
            flags = ["-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", *_cpu_flags()]
            _run([*nice, "cmake", "-S", str(src), "-B", str(CACHE / "build"), *flags], log)
            j = str(jobs or os.cpu_count() or 1)
            build = ["cmake", "--build", str(CACHE / "build"), "--target", "llama-server"]
            _run([*nice, *build, "-j", j], log)
    if not BINARY.exists():
        raise RuntimeError(f"llama-server build produced no binary; see {CACHE / 'build.log'}")
    return BINARY


if __name__ == "__main__":
    print(build_llama_server())
