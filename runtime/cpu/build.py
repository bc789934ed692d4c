"""Build a C/C++ source file of a ``csrc/`` folder once per machine and cache the shared library.

The native kernels are a few C functions over raw pointers, loaded with ctypes: compiling one
with the system compiler takes a second, where ``torch.utils.cpp_extension`` would compile
torch's headers (~30 s). Libraries are built with ``-march=native``, so the cache key holds every
source file the library is made of (the file and the headers it includes with ``#include "..."``,
found as the compiler finds them), the flags, the compiler's version and the CPU's model and
feature flags. The headers every library may use (the claim counter, the thread pool) are in
this package's ``csrc/``, always on the include path.
Cache: ``$PAGODA_CACHE_DIR``, else ``$XDG_CACHE_HOME/pagoda`` or ``~/.cache/pagoda``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"  # shared headers: claim.h, pool.h, row_tiles.h
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def cache_dir() -> Path:
    if os.environ.get("PAGODA_CACHE_DIR"):
        return Path(os.environ["PAGODA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagoda"


def cpu_signature() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(keep))


def find_compiler(env: str, names: Sequence[str]) -> str | None:
    """The compiler `$env` names (None if it does not exist: an explicit choice is not second-
    guessed), else the first of `names` on PATH."""
    if os.environ.get(env):
        return shutil.which(os.environ[env])
    return next((shutil.which(n) for n in names if shutil.which(n)), None)


def sources(source: Path) -> list[Path]:
    """`source` and every file it includes with ``#include "..."``, transitively (looked up
    beside the including file, then in `CSRC`, as the compiler does); each once, in order."""
    found: dict[Path, None] = {}
    todo = [source.resolve()]
    while todo:
        path = todo.pop(0)
        if path in found:
            continue
        found[path] = None
        for name in _INCLUDE.findall(path.read_text()):
            for folder in (path.parent, CSRC):
                if (folder / name).is_file():
                    todo.append((folder / name).resolve())
                    break
    return list(found)


def build(
    source: Path,
    *,
    name: str,
    compiler: str,
    flags: Sequence[str],
    directory: Path | None = None,
) -> Path:
    """Compile `source` (a ``.c`` or ``.cpp`` file: the compiler picks the language from the
    suffix) into the cache unless already there; returns the library's path. Raises RuntimeError
    with the compiler's message when the build fails."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for path in sources(source):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for part in (" ".join(flags), compiler, version, cpu_signature()):
        digest.update(part.encode() + b"\0")
    out_dir = directory or cache_dir()
    target = out_dir / f"{name}_{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        so = Path(tmp) / target.name
        cmd = [compiler, *flags, f"-I{CSRC}", str(source), "-o", str(so)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if res.returncode:
            raise RuntimeError(f"compiling {name} failed:\n{res.stderr[-2000:]}")
        os.replace(so, target)  # atomic: concurrent builders agree on the file
    return target
