"""`pagoda download` as the operator's init container runs it: a process, its stdout, its exit
code, one stderr line and the termination-message file."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from hub_testlib import FakeHub
from pagoda.runtime.termination import parse

ROOT = pathlib.Path(__file__).resolve().parents[4]


def pagoda(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "pagoda.runtime.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, **env},
    )  # fmt: skip


def test_download_prints_the_path_and_failures_leave_a_termination_message(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    log = tmp_path / "termination-log"
    env = {"PAGODA_TERMINATION_LOG": str(log)}
    dl = str(tmp_path / "models")
    done = pagoda("download", "--model", "hf://org/tiny", "--download-dir", dl, env=env)
    assert done.returncode == 0, done.stderr
    path = pathlib.Path(done.stdout.strip())
    assert (path / "config.json").is_file()
    assert "hf://org/tiny: downloading 5 files" in done.stderr
    assert "HTTP Request" not in done.stderr  # no line per request in the pod log
    assert not log.exists()

    done = pagoda("download", "--model", "hf://org/missing", "--download-dir", dl, env=env)
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1].startswith("pagoda download: error: hf://org/missing")
    )
    msg = parse(log.read_text())
    assert (msg.reason, msg.detail) == ("ModelDownloadFailed", "NotFound"), log.read_text()

    done = pagoda("download", "--model", "s3://ok-bucket/x", "--download-size-limit", "lots",
                  "--download-dir", dl, env=env)  # fmt: skip
    assert done.returncode == 2 and parse(log.read_text()).reason == "InvalidConfiguration"

    done = pagoda("download", "--no-such-flag", env=env)  # argparse's own usage error
    assert done.returncode == 2 and parse(log.read_text()).reason == "InvalidArguments"

    done = pagoda("download", "--model", "hf://org/private", "--download-dir", dl,
                  env={**env, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert done.returncode == 2 and "HF_HUB_OFFLINE=1 is set" in done.stderr, done.stderr
    assert "pagoda download --model" not in done.stderr  # not the advice to run itself
    assert parse(log.read_text()).detail == "NotCached"


def test_a_terminal_gets_a_progress_bar_and_a_log_gets_lines(
    hub: FakeHub, tmp_path: pathlib.Path
) -> None:
    """By hand (stderr a terminal): a bar redrawn in place while the bytes come; in a pod's log
    (stderr a pipe): no carriage returns, only the lines."""
    import fcntl
    import pty
    import re
    import struct
    import termios

    hub.stall_after["extra.safetensors"] = 4096  # until the bar has been drawn
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns
    cmd = [sys.executable, "-P", "-m", "pagoda.runtime.cli", "download", "--model", "hf://org/big",
           "--download-dir", str(tmp_path / "tty")]  # fmt: skip
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sub, cwd=ROOT) as proc:
        os.close(sub)
        seen = b""
        while True:
            try:
                got = os.read(main, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not got:
                break
            seen += got
            if b"B/s" in seen:
                hub.release.set()
        assert proc.wait(timeout=120) == 0, seen
    os.close(main)
    text = seen.decode(errors="replace")
    assert re.search(r"\rhf://org/big: .*B/s", text), text  # redrawn in place (not \r\n)
    assert "downloaded 311.9 KiB in" in text, text

    done = pagoda("download", "--model", "hf://org/big", "--download-dir", str(tmp_path / "log"),
                  env={})  # fmt: skip
    assert done.returncode == 0 and "\r" not in done.stderr, done.stderr
