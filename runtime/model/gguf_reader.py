"""A GGUF file's metadata, parsed fast and once per file: a `gguf.GGUFReader` that reads metadata
arrays whole, shared between the reads one process makes of one file.

Parsing (`parse`): the stock reader builds each array element as its own field part, two
ndarray slices per string (SmolLM2: 49k tokens, 49k merges, 49k token types: ~10^6 slices, each
running ``memmap.__array_finalize__`` on the memmap itself); that was ~2 s of a ~3.5 s load, and
still 0.5 s with plain slices. Here the reader slices a plain ndarray view of its memory map, an
array of numbers is one ndarray and an array of strings one list of `str` walked with `struct`
(`ArrayField`: same `contents()`, same `types`); scalars, strings, nested arrays and tensors are
parsed by the stock code (same values; the view keeps the map alive). ~30 ms for SmolLM2.

Sharing (`open_reader`, `take_reader`): `pagoda serve`'s API process reads its GGUF three times
at start-up: its config (`loader.read_model_config`), its tensor table (`server/weights.py`, for
the fit and memory checks) and its tokenizer (`loader.read_tokenizer`); on a thread, the
engine's load is the third. `open_reader` parses a file once and shares the reader by path; `take_reader` hands it
to the process's last read (the tokenizer, or `gguf_loader.load_gguf`'s weights) and shares it no
longer, so the file's memory map then lives as long as what that read keeps, as a reader of its
own would. A reader nobody takes is let go `SHARE_S` after its last use. So no process keeps the
file mapped once its start-up is done: pages read through a map count to the process's memory,
and a mapped file deleted or replaced on disk keeps its blocks allocated.

A file is the same while its device, inode, size and modification time are (a rewrite in place
to the same size within one tick of the file system's clock would go unseen): a changed or
replaced file is parsed anew (a reader handed out before goes on mapping what it mapped, as a
reader of its own would: a replaced file's old inode, or the new bytes of a file rewritten in
place). At most `MAX_SHARED` files are shared at once. The engine process is spawned with
nothing shared: it parses the file once, for its load (`take_reader`), and keeps no reader.
"""

from __future__ import annotations

import functools
import itertools
import os
import struct
import sys
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

MAX_SHARED = 2  # files whose readers are shared at once (the least recently used goes first)
SHARE_S = 30.0  # a shared reader nobody took is let go this long after its last use


def parse(path: str | Path) -> Any:
    """A reader of its own for the GGUF at `path` (`gguf.GGUFReader`'s errors for a file it
    cannot parse, ValueError for one that ends inside a metadata array)."""
    return _reader_class()(str(path))


# -- sharing ---------------------------------------------------------------------------------------


class _Shared(NamedTuple):
    identity: tuple[int, int, int, int]  # device, inode, size, mtime (ns)
    reader: Any
    timer: threading.Timer
    token: int


_shared: OrderedDict[str, _Shared] = OrderedDict()  # absolute path -> its shared reader
_lock = threading.Lock()
_tokens = itertools.count()


def open_reader(path: str | Path) -> Any:
    """The reader of the GGUF at `path`, parsed once and shared (module docstring)."""
    return _lookup(str(path), share=True)


def take_reader(path: str | Path) -> Any:
    """The shared reader of `path` (parsed now if none is shared), shared no longer: for the
    process's last read of the file."""
    return _lookup(str(path), share=False)


def field(reader, key: str, default=None):
    """Metadata `key`'s value (`contents()`: one value, or a list), `default` where the file
    has none."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def tensor_shape(t) -> tuple[int, ...]:
    """A tensor's shape as torch's, slowest dimension first (GGUF lists them fastest-first)."""
    return tuple(int(d) for d in reversed(t.shape))


def _lookup(path: str, share: bool) -> Any:
    try:
        st = os.stat(path)
    except OSError:  # the parser's own error, as without sharing
        return parse(path)
    key, identity = os.path.abspath(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        held = _shared.pop(key, None)
        if held is not None:
            held.timer.cancel()
        reader = held.reader if held is not None and held.identity == identity else parse(path)
        if share:
            token = next(_tokens)
            timer = threading.Timer(SHARE_S, _expire, (key, token))
            timer.daemon = True
            _shared[key] = _Shared(identity, reader, timer, token)
            timer.start()
            while len(_shared) > MAX_SHARED:
                _shared.popitem(last=False)[1].timer.cancel()
    return reader


def _expire(key: str, token: int) -> None:
    with _lock:
        held = _shared.get(key)
        if held is not None and held.token == token:
            del _shared[key]


def forget_all() -> None:
    """Share nothing from now on until the next `open_reader` (tests, a process done reading)."""
    with _lock:
        while _shared:
            _shared.popitem()[1].timer.cancel()


# -- parsing ---------------------------------------------------------------------------------------


@functools.cache
def _reader_class() -> type:
    """`_FastFields` over `gguf.GGUFReader`, made on first use (`gguf` is imported only where a
    GGUF is read)."""
    import gguf

    return type("Reader", (_FastFields, gguf.GGUFReader), {"__module__": __name__})


class _FastFields:
    """`gguf.GGUFReader`'s field parsing, faster (module docstring); mixed in before it."""

    def _get(self, offset, dtype, count=1, override_order=None):
        """The stock `_get` on a plain ndarray view of the map (a memmap slice costs ~1 µs)."""
        plain = getattr(self, "_plain", None)
        if plain is None:  # `data` is set first thing in __init__, before any _get
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        end = offset + int(np.dtype(dtype).itemsize) * count
        arr = plain[offset:end].view(dtype=dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr.view(arr.dtype.newbyteorder(order))

    def _build_fields(self, offs, count):
        for _ in range(count):
            size, field = self._build_field(offs)
            self._push_field(field, skip_sum=True)
            offs += size
        return offs

    def _build_field(self, start):
        """(bytes, field) of the key/value pair at `start`: a flat array whole, anything else
        as the stock reader parses it."""
        import gguf

        klen, kdata = self._get_str(start)
        offs = start + int(klen.nbytes + kdata.nbytes)
        raw_type = self._get(offs, np.uint32)
        offs += int(raw_type.nbytes)
        parts = [klen, kdata, raw_type]
        name = str(bytes(kdata), encoding="utf-8")
        whole = self._whole_array(offs) if raw_type[0] == gguf.GGUFValueType.ARRAY else None
        if whole is not None:
            size, arr = whole
            field = _array_field_class()(start, name, parts + arr.parts, [5], arr.types)
        else:
            size, more, idxs, types = self._get_field_parts(offs, raw_type[0])
            field = gguf.ReaderField(start, name, parts + more, [i + len(parts) for i in idxs],
                                     types)  # fmt: skip
        return offs - start + size, field

    def _whole_array(self, offs):
        """(bytes, field) of a flat array of numbers or strings at `offs`; None for nested
        arrays (left to the stock code)."""
        import gguf

        raw_itype = self._get(offs, np.uint32)
        alen = self._get(offs + 4, np.uint64)
        itype, n, start = gguf.GGUFValueType(raw_itype[0]), int(alen[0]), offs + 12
        if itype == gguf.GGUFValueType.STRING:
            values, end = _strings(self._plain, start, n, self._endian_char())
        elif itype in self.gguf_scalar_to_np:
            values = self._get(start, self.gguf_scalar_to_np[itype], n)
            end = start + int(values.nbytes)
        else:
            return None
        array = gguf.GGUFValueType.ARRAY
        field = gguf.ReaderField(offs, "", [raw_itype, alen, values], [2], [array, itype])
        return end - offs, field

    def _endian_char(self):
        little = (sys.byteorder == "little") == (self.byte_order == "I")
        return "<" if little else ">"


@functools.cache
def _array_field_class() -> type:
    import gguf

    class ArrayField(gguf.ReaderField):
        """A metadata array held whole as its last part (an ndarray of numbers, or a list of
        str); `contents()` as the stock field's (one value for an int, a list otherwise).
        `data` indexes that one part, not one part per element: read values through
        `contents()` (as `field` does), not `parts[data[i]]`."""

        __slots__ = ()

        def contents(self, index_or_slice=slice(None)):
            values = self.parts[-1]
            picked = values[index_or_slice]
            if isinstance(values, np.ndarray):
                return picked.tolist()
            return list(picked) if isinstance(index_or_slice, slice) else picked

    return ArrayField


def _strings(buf: np.ndarray, offs: int, n: int, endian: str) -> tuple[list[str], int]:
    """`n` GGUF strings (a uint64 length, then UTF-8 bytes) from `offs` in `buf`; the list and
    the offset after the last."""
    view, length = memoryview(buf), struct.Struct(endian + "Q").unpack_from
    out: list[str] = []
    append, last = out.append, len(view) - 8
    for _ in range(n):
        if offs > last:
            break
        (size,) = length(view, offs)
        offs += 8
        if offs + size > len(view):
            break
        append(str(view[offs : offs + size], "utf-8"))
        offs += size
    if len(out) < n:
        raise ValueError(f"the file ends inside a metadata array ({len(out)} of {n} strings)")
    return out, offs
