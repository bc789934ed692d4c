"""`hf://ORG/NAME[@REVISION]` with huggingface_hub: what the engine reads, into the download dir.

`HF_ENDPOINT` (a mirror, or a local server in tests) and `HF_TOKEN` are huggingface_hub's own
settings. The revision is resolved to a commit first, then only the files the engine reads are
listed (ALLOW_PATTERNS, top level of the repo; of the weights, only those the loader reads:
`select_weights`, safetensors where the repo has them, else transformers' `pytorch_model*.bin`),
their sizes checked against the free space, and `snapshot_download` fetches them into huggingface_hub's cache layout under the download dir (after `resume` has completed
the file a killed download was on). The revision asked for is
recorded under `refs/` as huggingface_hub does, so its own offline mode finds the copy too.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagoda.runtime.model.sources import errors, resume
from pagoda.runtime.model.sources.cache import ADAPTER_CONFIG, check_space
from pagoda.runtime.model.sources.errors import DownloadError, from_os_error
from pagoda.runtime.model.sources.progress import Progress
from pagoda.runtime.model.sources.uri import HfURI

if TYPE_CHECKING:
    from huggingface_hub.hf_api import RepoFile

# What runtime/model/hf_loader.py reads from a checkpoint directory (and the lora package from an
# adapter's).
ALLOW_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tiktoken.model",  # Kimi K2's, Moonlight's vocabulary (model/tiktoken_files.py)
    "tokenization_kimi.py",  # read as text, never run: its split regex is checked
    "tokenization_moonshot.py",
    "vocab.json",  # GPT-2's two tokenizer files (OPT's: model/bpe_files.py), fetched only
    "merges.txt",  # where the repo has no tokenizer.json (`select_weights`)
    "tokenizer.model",  # a SentencePiece model, read where there is no tokenizer.json (spm_files)
    "added_tokens.json",  # its older layout's added tokens
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "processor_config.json",  # a multimodal checkpoint's chat template may be there
    ADAPTER_CONFIG,
    "*.safetensors",
    "*.safetensors.index.json",
    # transformers' PyTorch pickles (model/pickle_weights.py), fetched only without safetensors
    "pytorch_model.bin",
    "pytorch_model-*.bin",
    "pytorch_model.bin.index.json",
)
BPE_FILES = ("vocab.json", "merges.txt")
PICKLES = (".bin", ".pt", ".pth", ".ckpt")  # pickles the engine does not read (but transformers')
INDEX = "model.safetensors.index.json"  # what the loader reads (model/safetensors_weights.py)
BIN_INDEX, BIN_SINGLE = "pytorch_model.bin.index.json", "pytorch_model.bin"
MAX_WORKERS = 4
log = logging.getLogger("pagoda.runtime.model.sources")


def quiet_http_logs() -> None:
    """One INFO line per HTTP request (httpx, botocore) would drown the progress lines."""
    for name in ("httpx", "httpx2", "botocore", "boto3", "s3transfer"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)


def wanted(path: str) -> bool:
    """A top-level file the engine reads (subfolders such as original/ are left out)."""
    return "/" not in path and any(fnmatch.fnmatchcase(path, p) for p in ALLOW_PATTERNS)


def select_weights(
    uri: str, names: dict[str, int], read_index: Callable[[str], bytes]
) -> dict[str, int]:
    """Of the wanted files, the weights the loader reads (a repo holding both a sharded and a
    consolidated copy, as Mistral's do, is downloaded once): with model.safetensors.index.json,
    only the shards its weight_map names (NotFound if one is missing) and no other index; else
    every *.safetensors; without safetensors, transformers' pickles as it picks them:
    pytorch_model.bin, else the shards pytorch_model.bin.index.json names (never both formats).
    `read_index(name)`: the index file's bytes. vocab.json and merges.txt, tokenizer.model and
    added_tokens.json only without a tokenizer.json (which the loader reads first: Qwen's repos
    hold vocab.json and merges.txt too)."""
    if "tokenizer.json" in names:
        spm = ("tokenizer.model", "added_tokens.json")
        names = {n: size for n, size in names.items() if n not in BPE_FILES + spm}
    pickled = {n for n in names if n.startswith("pytorch_model")}
    if any(n.endswith(".safetensors") for n in names) or BIN_SINGLE in names:
        keep = BIN_SINGLE if not any(n.endswith(".safetensors") for n in names) else None
        names = {n: size for n, size in names.items() if n not in pickled or n == keep}
    elif BIN_INDEX in names:
        return _indexed(uri, names, BIN_INDEX, read_index, pickled)
    if INDEX not in names:
        return dict(names)
    safetensors = {n for n in names if n.endswith((".safetensors", ".index.json"))}
    return _indexed(uri, names, INDEX, read_index, safetensors)


def _indexed(
    uri: str, names: dict[str, int], index: str, read_index: Callable[[str], bytes],
    weights: set[str],
) -> dict[str, int]:  # fmt: skip
    """`names` less the `weights` files `index`'s weight_map does not name (the index kept);
    NotFound if it names one that is not there."""
    try:
        shards = set(json.loads(read_index(index))["weight_map"].values())
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DownloadError(
            errors.FAILED, f"{uri}: {index} is unreadable or has no weight_map ({e})"
        ) from None
    missing = sorted(str(s) for s in shards if s not in names)
    if missing:
        raise DownloadError(
            errors.NOT_FOUND, f"{uri}: {index} names shards that are not there: "
            + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        )  # fmt: skip
    return {n: size for n, size in names.items() if n not in weights or n in shards or n == index}


def loadable(names: Sequence[str]) -> bool:
    """Whether the listing holds weights the loader reads: safetensors, or transformers'
    pickles (pytorch_model.bin, or an index with its shards)."""
    return any(n.endswith(".safetensors") or n in (BIN_SINGLE, BIN_INDEX) for n in names)


def check_layout(uri: str, names: list[str], where: str, others: Sequence[str] = ()) -> None:
    """NotFound unless the listing holds a loadable checkpoint (config + safetensors or
    transformers' pickles), or a PEFT LoRA adapter (adapter_config.json + its safetensors);
    `others`: the listing's other top-level files, to say what is there instead."""
    ggufs = [n for n in others if n.endswith(".gguf")]
    if ggufs and not loadable(names):
        raise DownloadError(
            errors.NOT_FOUND,
            f"{uri}: {where} holds GGUF files ({', '.join(sorted(ggufs)[:3])}"
            f"{', ...' if len(ggufs) > 3 else ''}), not a safetensors checkpoint: download the "
            "GGUF file you want and pass its path (or its s3:// URI)",
        )
    if "config.json" not in names and ADAPTER_CONFIG not in names:
        raise DownloadError(
            errors.NOT_FOUND,
            f"{uri}: no config.json in {where} (nor a LoRA adapter's {ADAPTER_CONFIG})",
        )
    if "config.json" not in names and not any(n.endswith(".safetensors") for n in names):
        raise DownloadError(  # an adapter: pagoda.runtime.lora reads adapter_model.safetensors
            errors.NOT_FOUND,
            f"{uri}: {where} holds a LoRA adapter's {ADAPTER_CONFIG} but no "
            f"adapter_model.safetensors (adapters are read from safetensors only; found: "
            f"{', '.join(sorted(others)[:5]) or 'nothing else'})",
        )
    if not loadable(names):
        pickles = sorted(n for n in others if n.endswith(PICKLES))
        if pickles:
            raise DownloadError(
                errors.NOT_FOUND,
                f"{uri}: {where} holds PyTorch pickle weights ({', '.join(pickles[:3])}"
                f"{', ...' if len(pickles) > 3 else ''}) but not as transformers saves them: "
                f"the engine reads *.safetensors, or {BIN_SINGLE} (or the shards "
                f"{BIN_INDEX} names)",
            )
        raise DownloadError(
            errors.NOT_FOUND,
            f"{uri}: no *.safetensors weights in {where} (nor {BIN_SINGLE}; for a GGUF file "
            "download it and pass its path)",
        )


def _silent_tqdm() -> type:
    from tqdm.auto import tqdm

    class Silent(tqdm):  # huggingface_hub's bars draw with '\r'; Progress logs lines instead
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return Silent


def _blob_bytes(blobs: Path) -> int:
    total = 0
    if blobs.is_dir():
        for entry in os.scandir(blobs):
            with contextlib.suppress(OSError):
                total += entry.stat(follow_symlinks=False).st_size
    return total


def fetch(
    ref: HfURI, root: Path, *, size_limit: int | None = None, exclusive: bool = True
) -> tuple[Path, dict[str, int], str]:
    """Download (or find in the cache) → (snapshot directory, {file: size}, commit).
    `exclusive`: the caller holds the repo's download lock, so the `*.incomplete` files there
    were left by a download cut short (completed or removed); else they are left alone."""
    quiet_http_logs()
    try:
        try:
            return _fetch(ref, root, size_limit, exclusive)
        except DownloadError:
            raise
        except Exception as e:
            raise classify(ref, e) from e
    except DownloadError as e:
        if e.detail == errors.OUT_OF_SPACE and exclusive:  # do not leave the disk full
            _remove_partial_blobs(root, ref)
        raise


def _remove_partial_blobs(root: Path, ref: HfURI) -> None:
    from huggingface_hub.file_download import repo_folder_name

    resume.remove(
        resume.leftovers(root / repo_folder_name(repo_id=ref.repo, repo_type="model") / "blobs")
    )


def _fetch(
    ref: HfURI, root: Path, size_limit: int | None, exclusive: bool
) -> tuple[Path, dict[str, int], str]:
    from huggingface_hub import HfApi, get_token, hf_hub_url, snapshot_download
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.hf_api import RepoFile

    # Read at call time (huggingface_hub reads HF_ENDPOINT once, when first imported).
    endpoint = os.environ.get("HF_ENDPOINT") or None
    # HF_TOKEN (HUGGING_FACE_HUB_TOKEN) without the newline a Secret made from a file often
    # has, else huggingface_hub's token file; None: no token
    token = get_token()
    api = HfApi(endpoint=endpoint, token=token)
    commit = api.model_info(ref.repo, revision=ref.revision).sha
    if not commit:
        raise DownloadError(errors.FAILED, f"{ref.uri}: the Hub answered without a commit")
    tree = [f for f in api.list_repo_tree(ref.repo, revision=commit) if isinstance(f, RepoFile)]
    listed = {f.path: int(f.size or 0) for f in tree if wanted(f.path)}
    others = [f.path for f in tree if f.path not in listed]
    check_layout(ref.uri, sorted(listed), f"repo {ref.repo} at {commit[:12]}", others)
    storage = root / repo_folder_name(repo_id=ref.repo, repo_type="model")
    snapshot = storage / "snapshots" / commit

    def read_index(name: str) -> bytes:
        from huggingface_hub import hf_hub_download

        return Path(
            hf_hub_download(ref.repo, name, revision=commit, cache_dir=root,
                            endpoint=endpoint, token=token)
        ).read_bytes()  # fmt: skip

    files = select_weights(ref.uri, listed, read_index)
    blobs = storage / "blobs"
    todo = _missing(files, tree, snapshot, blobs)
    needed = sum(files[n] for n in todo)
    if needed == 0 and all((snapshot / name).exists() for name in files):
        log.info("%s: all %d files at %s are in %s", ref.uri, len(files), commit[:12], root)
        _write_ref(storage, ref.revision, commit)
        return snapshot, files, commit
    url_of = lambda name: hf_hub_url(ref.repo, name, revision=commit, endpoint=endpoint)  # noqa: E731
    partials = resume.adopt(blobs, todo, url_of, token) if exclusive else []  # a killed one's
    have = sum(p.have for p in partials)
    check_space(ref.uri, root, needed - have, size_limit)
    before = _blob_bytes(blobs) - have
    measure = lambda: _blob_bytes(blobs) - before  # noqa: E731
    with Progress(ref.uri, needed, len(todo), measure=measure):
        for partial in partials:
            resume.complete(partial, tqdm_class=_silent_tqdm())
        path = snapshot_download(
            ref.repo,
            revision=commit,
            cache_dir=root,
            endpoint=endpoint,
            token=token,
            allow_patterns=sorted(files),
            max_workers=MAX_WORKERS,
            tqdm_class=_silent_tqdm(),
        )
    _write_ref(storage, ref.revision, commit)
    return Path(path), files, commit


def _missing(files: dict[str, int], tree: list[RepoFile], snapshot: Path, blobs: Path) -> list[str]:
    """The `files` to download, largest first: those neither in the commit's snapshot nor a
    blob another commit has too (that one is linked, not downloaded again)."""
    blob = {f.path: f.lfs.sha256 if f.lfs else f.blob_id for f in tree}
    return sorted(
        (n for n in files if not (snapshot / n).exists() and not (blobs / blob[n]).is_file()),
        key=lambda n: -files[n],
    )


def _write_ref(storage: Path, revision: str | None, commit: str) -> None:
    """refs/REVISION → commit, as huggingface_hub records a branch or tag it resolved (it does
    not when asked for the commit itself, as `_fetch` asks)."""
    revision = revision or "main"
    if revision == commit:
        return
    target = storage / "refs" / revision
    try:
        if target.is_file() and target.read_text() == commit:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, target)
    except OSError as e:
        log.warning("could not record %s → %s in %s: %s", revision, commit[:12], storage, e)


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def is_network_error(error: BaseException) -> bool:
    """A connection, DNS or timeout failure anywhere in the exception's chain."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionError | TimeoutError):
            return True
        name = type(e).__name__
        module = type(e).__module__.split(".")[0]
        if (
            module in ("httpx", "httpx2", "httpcore", "requests", "urllib3")
            and not name.startswith("Local")  # a request this side could not send (a header)
            and any(w in name for w in ("Connect", "Timeout", "Network", "Proxy", "Protocol"))
        ):
            return True
        e = e.__cause__ or e.__context__
    return False


def classify(ref: HfURI, error: Exception) -> DownloadError:
    """A huggingface_hub (or I/O) failure → DownloadError with its class; never with the token
    in it (an error may quote a header: the message goes to the pod's log and its status)."""
    found = _classify(ref, error)
    secrets = {os.environ.get(k, "") for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    secrets |= {" ".join(t.split()) for t in secrets} | {t.strip() for t in secrets}
    message = str(found)
    for secret in sorted((t for t in secrets if len(t) >= 4), key=len, reverse=True):
        message = message.replace(secret, "<HF_TOKEN>").replace(repr(secret)[1:-1], "<HF_TOKEN>")
    return found if message == str(found) else DownloadError(found.detail, message)


def _classify(ref: HfURI, error: Exception) -> DownloadError:
    from huggingface_hub import errors as hf_errors

    uri = ref.uri
    said = str(error)
    if (type(error).__name__ == "LocalProtocolError" and "Bearer" in said) or (
        isinstance(error, UnicodeEncodeError) and "authorization" in said.lower()
    ):
        return DownloadError(
            errors.UNAUTHORIZED,
            f"{uri}: HF_TOKEN cannot be sent: it holds a character an HTTP header cannot carry "
            "(a quote, a non-ASCII or control character copied with it?)",
        )
    status = _status(error)
    if isinstance(error, hf_errors.RevisionNotFoundError):
        return DownloadError(
            errors.NOT_FOUND, f"{uri}: revision {ref.revision or 'main'!r} not found in {ref.repo}"
        )
    if isinstance(error, hf_errors.GatedRepoError):
        if status == 401:
            why = "HF_TOKEN is not set or not valid: set it to a token of an account"
        else:
            why = "HF_TOKEN's account has not been granted access: with an account"
        return DownloadError(
            errors.UNAUTHORIZED,
            f"{uri}: gated repo (HTTP {status}): {why} that accepted the repo's terms on the Hub",
        )
    if isinstance(error, hf_errors.RepositoryNotFoundError):
        if status == 404:  # the Hub says 404 to a token whose account cannot see a private repo
            from huggingface_hub import get_token

            hint = " (or it is private and HF_TOKEN's account has no access)" if get_token() else ""
            return DownloadError(errors.NOT_FOUND, f"{uri}: repository {ref.repo} not found{hint}")
        return DownloadError(
            errors.UNAUTHORIZED,
            f"{uri}: repository {ref.repo} not found or not accessible (HTTP {status}): it "
            "does not exist, or it is private and HF_TOKEN is missing or has no access",
        )
    if isinstance(error, hf_errors.HfHubHTTPError) and status is not None:
        said = getattr(error, "server_message", None) or str(error).split("\n")[0]
        what = " ".join(str(said).split())[:300]
        if status == 401:
            what = f"HF_TOKEN is missing, invalid or expired ({what})"
        return errors.for_status(uri, status, what)
    if is_network_error(error) or isinstance(error, hf_errors.LocalEntryNotFoundError):
        endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
        return DownloadError(
            errors.UNREACHABLE, f"{uri}: cannot reach {endpoint}: {type(error).__name__}: {error}"
        )
    cause: BaseException | None = error
    while cause is not None:  # ENOSPC, maybe wrapped by a worker thread
        if isinstance(cause, OSError) and cause.errno is not None:
            return from_os_error(uri, cause)
        cause = cause.__cause__ or cause.__context__
    return DownloadError(errors.FAILED, f"{uri}: {type(error).__name__}: {error}")
