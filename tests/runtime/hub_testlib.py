"""A local stand-in for the Hugging Face Hub (HF_ENDPOINT) and tiny checkpoints to serve from it.

It answers the endpoints huggingface_hub's `model_info`, `list_repo_tree` and `snapshot_download`
use, with the headers `hf_raise_for_status` and `get_hf_file_metadata` read:

* GET  /api/models/ORG/NAME[/revision/REV]          → {"id", "sha", "siblings", "private"}
* GET  /api/models/ORG/NAME/tree/REV[/PATH]         → [{"type": "file", "path", "size", "oid"
                                                        (+ "lfs": {"oid": SHA-256, ...})}]
* HEAD/GET /ORG/NAME/resolve/REV/PATH               → X-Repo-Commit, ETag, Content-Length (+ Range)

An ETag, the name of the file's blob in huggingface_hub's cache, is the file's "oid" as the tree
lists it: the SHA-256 of an LFS file (*.safetensors, ...), else its git object id.

Errors as the Hub sends them: 404 with `X-Error-Code: RepoNotFound | RevisionNotFound |
EntryNotFound`; a private repo without a token is 401 RepoNotFound (the Hub hides whether it
exists), and 404 RepoNotFound with a valid token of an account that cannot see it
(`other_tokens`); a wrong token is 401 "Invalid credentials in Authorization header". A gated repo's
metadata and listing are public, its files 401 GatedRepo without a token and 403 GatedRepo with
one whose account was not granted access (`granted`).
`understate_sizes` makes the listings claim 1-byte files (a listing that lies: the download must
still fail cleanly when the disk fills). `cut_after[PATH] = N`: the next download of PATH from its
first byte sends N bytes of the body and then drops the connection (once); `stall_after[PATH] = N`:
each download of PATH sends up to byte N and then waits until `release` is set (a process to kill
mid-file). `ranges` records the Range header of every file download (None without one);
`refuse_ranges` answers a Range request 416.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

LFS = (".safetensors", ".bin", ".gguf", ".pt")  # files the repos keep in Git LFS


def _tree_entry(name: str, data: bytes, understate: bool) -> dict[str, Any]:
    size = 1 if understate else len(data)
    entry = {"type": "file", "path": name, "size": size, "oid": hashlib.sha1(data).hexdigest()}
    if name.endswith(LFS):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
    return entry


def etag(name: str, data: bytes) -> str:
    """As the Hub's: an LFS file's SHA-256, another file's git object id (here its SHA-1)."""
    return (hashlib.sha256 if name.endswith(LFS) else hashlib.sha1)(data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    private: bool = False
    gated: bool = False  # metadata public; files only with a token the hub granted access
    branches: dict[str, str] = field(default_factory=dict)  # name → commit

    def __post_init__(self) -> None:
        digest = hashlib.sha1(b"".join(k.encode() + v for k, v in sorted(self.files.items())))
        self.commit = digest.hexdigest()
        self.branches.setdefault("main", self.commit)

    def commit_of(self, rev: str) -> str | None:
        if rev == self.commit:
            return rev
        return self.branches.get(rev)


class FakeHub:
    """The Hub on 127.0.0.1:PORT in a thread; `with FakeHub() as hub: hub.endpoint`."""

    def __init__(self, token: str | None = None) -> None:
        self.repos: dict[str, Repo] = {}
        self.token = token
        self.granted: set[str] = set()  # gated repos whose terms the token's account accepted
        self.other_tokens: set[str] = set()  # valid, of an account that sees no private repo
        self.understate_sizes = False
        self.refuse_ranges = False  # a Range request is answered 416
        self.cut_after: dict[str, int] = {}
        self.stall_after: dict[str, int] = {}
        self.release = threading.Event()
        self.ranges: list[tuple[str, str | None]] = []
        self.requests: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(
        self, repo_id: str, files: dict[str, bytes], *, private: bool = False, gated: bool = False
    ) -> Repo:
        self.repos[repo_id] = Repo(dict(files), private=private, gated=gated)
        return self.repos[repo_id]

    def add_dir(
        self, repo_id: str, folder: pathlib.Path, *, private: bool = False, gated: bool = False
    ) -> Repo:
        files = {
            p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        return self.add(repo_id, files, private=private, gated=gated)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None):
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, code: str | None, message: str) -> None:
            headers = {"Content-Type": "application/json", "X-Error-Message": message}
            if code:
                headers["X-Error-Code"] = code
            self._send(status, json.dumps({"error": message}).encode(), headers)

        def _json(self, data: Any) -> None:
            self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

        def _authed(self) -> bool:
            return self.headers.get("Authorization") == f"Bearer {hub.token}"

        def _repo(self, repo_id: str) -> Repo | None:
            """The repo if this request may see it; otherwise the error is sent (None)."""
            auth = self.headers.get("Authorization")
            other = auth in {f"Bearer {t}" for t in hub.other_tokens}
            if auth and hub.token is not None and auth != f"Bearer {hub.token}" and not other:
                self._error(401, None, "Invalid credentials in Authorization header")
                return None
            repo = hub.repos.get(repo_id)
            if repo is None or (repo.private and (not auth or other)):
                status = 401 if not auth else 404
                self._error(status, "RepoNotFound", "Repository not found")
                return None
            return repo

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(f"{self.command} {path}")
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                self._api(parts[2] + "/" + parts[3], parts[4:])
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]))
            else:
                self._error(404, None, f"no route for {path}")

        def _api(self, repo_id: str, rest: list[str]) -> None:
            repo = self._repo(repo_id)
            if repo is None:
                return
            rev = rest[1] if len(rest) >= 2 and rest[0] in ("revision", "tree") else "main"
            commit = repo.commit_of(rev)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return
            if rest[:1] == ["tree"]:
                sub = "/".join(rest[2:])
                recursive = "recursive=true" in (urlsplit(self.path).query or "").lower()
                self._json(
                    [
                        _tree_entry(name, data, hub.understate_sizes)
                        for name, data in sorted(repo.files.items())
                        if name.startswith(sub)
                        and (recursive or "/" not in name[len(sub) :].strip("/"))
                    ]
                )
                return
            siblings = [{"rfilename": name} for name in sorted(repo.files)]
            self._json(
                {"id": repo_id, "sha": commit, "siblings": siblings, "private": repo.private}
            )

        def _resolve(self, repo_id: str, rev: str, name: str) -> None:
            repo = self._repo(repo_id)
            if repo is None:
                return
            commit = repo.commit_of(rev)
            if commit is None:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return
            if repo.gated and not self._authed():
                message = (f"Access to model {repo_id} is restricted. You must have access to "
                           "it and be authenticated to access it. Please log in.")  # fmt: skip
                self._error(401, "GatedRepo", message)
                return
            if repo.gated and repo_id not in hub.granted:
                message = (f"Access to model {repo_id} is restricted and you are not in the "
                           "authorized list. Visit https://huggingface.co/{repo_id} to ask for "
                           "access.")  # fmt: skip
                self._error(403, "GatedRepo", message)
                return
            data = repo.files.get(name)
            if data is None:
                self._error(404, "EntryNotFound", f"{name} does not exist at {rev}")
                return
            start = 0
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes=") and rng[6:].split("-")[0].isdigit():
                start = int(rng[6:].split("-")[0])
                if hub.refuse_ranges and self.command == "GET":
                    hub.ranges.append((name, rng))
                    self._error(416, None, "Range Not Satisfiable")
                    return
            headers = {
                "X-Repo-Commit": commit,
                "ETag": f'"{etag(name, data)}"',
                "Content-Type": "application/octet-stream",
                "Content-Length": str(len(data) - start),
                "Accept-Ranges": "bytes",
            }
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            if self.command == "GET":
                hub.ranges.append((name, self.headers.get("Range")))
            cut = hub.cut_after.pop(name, None) if self.command == "GET" and not start else None
            stall = hub.stall_after.get(name) if self.command == "GET" else None
            if cut is None and stall is None:
                self._send(206 if start else 200, data[start:], headers)
                return
            self.send_response(206 if start else 200)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            end = max(cut if cut is not None else stall, start)
            self.wfile.write(data[start:end])
            self.wfile.flush()
            if cut is None:
                hub.release.wait(60)
                self.wfile.write(data[end:])
                return
            self.close_connection = True  # the rest never comes: the client sees a cut body
            self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


def tiny_checkpoint(folder: pathlib.Path, *, pad_bytes: int = 0) -> pathlib.Path:
    """A complete random-weight Llama checkpoint of a few tens of KB, written by transformers,
    plus files the engine does not read (left out by the download); `pad_bytes` adds a second
    weights file of that size (for disks too small to hold it)."""
    from hf_oracle import make_tiny_llama

    make_tiny_llama(
        folder,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    (folder / "README.md").write_text("# tiny\n")
    (folder / "original").mkdir()
    (folder / "original" / "consolidated.safetensors").write_bytes(b"\0" * 4096)
    if pad_bytes:
        import numpy as np
        from safetensors.numpy import save_file

        save_file({"pad": np.zeros(pad_bytes // 4, np.float32)}, str(folder / "extra.safetensors"))
    return folder
