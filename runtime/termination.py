"""The one-line failure a command leaves for Kubernetes: `Reason[/Detail]: message`.

`pagoda serve` and `pagoda download` exit 2 with one line on stderr when their input is wrong
(bad flags, a refused tuned profile, a model that cannot be downloaded). The same line, prefixed
with a CamelCase reason, is written to the container's termination-message file, which the
kubelet copies into the pod's status (`state.terminated.message`); the operator reads it back
and turns it into a condition on the InferenceService (docs/operator.md, "Conditions").

The format, stated once here (a contract with the operator, which imports `parse`):

    ModelDownloadFailed/Unauthorized: hf://org/name: HTTP 401 ... (set HF_TOKEN in spec.modelSecretRef)
    ^ reason (CamelCase)  ^ detail (optional, CamelCase)  ^ one line of text

* `reason` becomes the condition's reason; `detail`, when present, starts its message;
* one line, at most MAX_BYTES bytes of UTF-8 (the kubelet keeps 4096 bytes a container);
* a reason is CamelCase with a lowercase letter and does not end in ``Error``, ``Exception`` or
  ``Warning``: the pods' `terminationMessagePolicy` is `FallbackToLogsOnError`, so a container
  that dies without writing the file leaves its log's last lines there instead, and a log level
  (``INFO: ...``) or an exception line (``ValueError: ...``) must not read as a reason. `parse`
  takes one line only for the same cause (the log's tail is lines);
* the file is `$PAGODA_TERMINATION_LOG` when set (an empty value turns writing off), else
  `/dev/termination-log` when it exists (the kubelet's default `terminationMessagePath`).

Torch-free and stdlib-only: the operator image imports it.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

TERMINATION_LOG_ENV = "PAGODA_TERMINATION_LOG"
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_BYTES = 4000
# A refused configuration that names no more specific reason (bad flags, profile, model path).
DEFAULT_REASON = "InvalidConfiguration"
_CAMEL = r"[A-Z][A-Za-z0-9]{0,63}"
_LINE = re.compile(rf"^({_CAMEL})(?:/({_CAMEL}))?: (\S.*)$")
_NOT_REASONS = ("Error", "Exception", "Warning")  # the ends of Python's exception names


def is_reason(text: str) -> bool:
    """Whether `text` may be a termination message's reason (module docstring)."""
    return (
        re.fullmatch(_CAMEL, text) is not None
        and text != text.upper()
        and not text.endswith(_NOT_REASONS)
    )


@dataclass(frozen=True)
class Termination:
    """A parsed termination message."""

    reason: str
    detail: str | None
    message: str

    def line(self) -> str:
        head = f"{self.reason}/{self.detail}" if self.detail else self.reason
        return _fit(f"{head}: {self.message}")


class ReasonedError(ValueError):
    """A bad-input error with a CamelCase reason (and an optional detail) for the termination
    message; a ValueError, so every `except ValueError` that exits 2 still catches it."""

    reason: str = DEFAULT_REASON
    detail: str | None = None

    def __init__(self, message: str, *, reason: str | None = None, detail: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        if detail is not None:
            self.detail = detail

    def __reduce__(self) -> tuple:
        """Pickles as itself with its reason and detail, whatever its subclass's constructor
        takes (`DownloadError(detail, message)`): `pagoda serve`'s checks run in the engine
        process and their error crosses to the API process, which exits with its reason."""
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[ReasonedError], args: tuple, state: dict) -> ReasonedError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _fit(text: str) -> str:
    data = one_line(text).encode()
    if len(data) <= MAX_BYTES:
        return data.decode()
    return data[: MAX_BYTES - 3].decode(errors="ignore") + "..."


def termination_of(error: BaseException) -> Termination:
    """The termination message of an error: its `reason`/`detail` if it has them."""
    reason = getattr(error, "reason", None)
    if not isinstance(reason, str) or not is_reason(reason):
        reason = DEFAULT_REASON
    detail = getattr(error, "detail", None)
    if not isinstance(detail, str) or not re.fullmatch(_CAMEL, detail):
        detail = None
    return Termination(reason, detail, one_line(str(error)) or type(error).__name__)


def parse(text: str | None) -> Termination | None:
    """A termination message back: one line in this format, else None (the last lines of the
    container's log, which the kubelet copies where the file was left empty, even where one of
    them looks like a message: `FallbackToLogsOnError`)."""
    lines = (text or "").strip().splitlines()
    m = _LINE.match(lines[0].strip()) if len(lines) == 1 else None
    if m is None or not is_reason(m.group(1)):
        return None
    return Termination(m.group(1), m.group(2), m.group(3))


def termination_log_path() -> str | None:
    """Where to write the message: the env override, else the kubelet's file if it exists."""
    path = os.environ.get(TERMINATION_LOG_ENV)
    if path is not None:
        return path or None
    return DEFAULT_TERMINATION_LOG if os.path.exists(DEFAULT_TERMINATION_LOG) else None


def write_termination_log(termination: Termination) -> bool:
    """Write the message (best effort: a failure to write never hides the error itself)."""
    path = termination_log_path()
    if path is None:
        return False
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(termination.line() + "\n")
    except OSError:
        return False
    return True


def exit_error(prog: str, error: BaseException) -> int:
    """Report a bad-input error the one way: one line on stderr, the termination message; 2."""
    termination = termination_of(error)
    print(f"{prog}: error: {_fit(termination.message)}", file=sys.stderr)
    write_termination_log(termination)
    return 2
