"""Hub names: `hf:OWNER/REPO` (a model folder) or `hf:OWNER/REPO/FILE.gguf` (one GGUF file), downloaded once.

Accepted forms (REVISION, a branch, tag or commit, defaults to `main`):

    hf:OWNER/REPO                     config.json, tokenizer.json, tokenizer_config.json?, generation_config.json?,
    hf:OWNER/REPO@REVISION            model.safetensors or model.safetensors.index.json and its shards
    hf:OWNER/REPO/PATH/FILE.gguf      one GGUF file (PATH may be empty)
    hf:OWNER/REPO@REVISION/FILE.gguf

A file lives at `{endpoint}/{owner}/{repo}/resolve/{revision}/{path}`, the Hugging Face hub's layout; the
endpoint is $RUVLLM_HF_ENDPOINT, else https://huggingface.co. Downloads go to the cache folder
($RUVLLM_MODELS_DIR, else $XDG_CACHE_HOME/ruvllm/hub, else ~/.cache/ruvllm/hub) as
`<cache>/<owner>/<repo>/<revision>/<path>`.

A file is written under a temporary name in its own folder and renamed once it has arrived whole (the size
the server announced, and for a GGUF its magic), so a file at its final path is complete and is never
fetched again. A model folder is complete once its `.complete` record (the files and their sizes) exists.
Only the standard library is used: urllib, no token (public repositories only).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DownloadError, InvalidArgumentError

PREFIX = "hf:"
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
FORMS = "hf:OWNER/REPO (a model folder) or hf:OWNER/REPO/FILE.gguf (one GGUF file), with @REVISION after REPO optional"
GGUF_MAGIC = b"GGUF"
COMPLETE = ".complete"  # a model folder's record of its files: written last, so it means "all arrived"
REQUIRED_FILES = ("config.json", "tokenizer.json")
OPTIONAL_FILES = ("tokenizer_config.json", "generation_config.json")
WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
CHUNK = 1 << 20
TIMEOUT_S = 60

# Owner, repo and revision: letters, digits, '.', '_', '-' (the hub's own rule, less its length limits).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

Progress = Callable[[Path, int, int | None], None]


@dataclass(frozen=True)
class HubModel:
    """A parsed hub name. `file` is the GGUF's path inside the repo, or None for a model folder."""

    owner: str
    repo: str
    revision: str = DEFAULT_REVISION
    file: str | None = None

    @property
    def kind(self) -> str:
        return "folder" if self.file is None else "gguf"

    @property
    def name(self) -> str:
        """The canonical `hf:` form (the revision shown only when it is not `main`)."""
        revision = "" if self.revision == DEFAULT_REVISION else f"@{self.revision}"
        file = "" if self.file is None else f"/{self.file}"
        return f"{PREFIX}{self.owner}/{self.repo}{revision}{file}"

    def url(self, path: str, endpoint: str | None = None) -> str:
        """The URL of `path` inside this repo at this revision."""
        base = (endpoint if endpoint is not None else hub_endpoint()).rstrip("/")
        parts = (self.owner, self.repo, "resolve", self.revision, *path.split("/"))
        return base + "/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)

    def folder(self, cache_dir: Path) -> Path:
        """Where this repo's files at this revision are kept in the cache."""
        return cache_dir / self.owner / self.repo / self.revision


@dataclass(frozen=True)
class CachedModel:
    name: str  # the hf: name that downloads it
    path: Path
    size: int  # bytes on disk
    kind: str  # "gguf" or "folder"


def is_hub_name(name: str) -> bool:
    """True for names that `parse` takes (or refuses with a message): everything starting with `hf:`."""
    return isinstance(name, str) and name.startswith(PREFIX)


def parse(name: str) -> HubModel:
    """`hf:OWNER/REPO[@REVISION][/PATH/FILE.gguf]` -> HubModel; InvalidArgumentError naming the forms otherwise."""

    def bad(why: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{name!r} is not a hub name: {why}; use {FORMS}")

    if not isinstance(name, str) or not name.startswith(PREFIX):
        raise bad(f"it does not start with {PREFIX!r}")
    owner, _, rest = name[len(PREFIX) :].partition("/")
    repo, _, file = rest.partition("/")
    repo, at, revision = repo.partition("@")
    if not _is_name(owner):
        raise bad(f"owner {owner!r} must be letters, digits, '.', '_' or '-'")
    if not _is_name(repo):
        raise bad(f"repo {repo!r} must be letters, digits, '.', '_' or '-'")
    if at and not _is_name(revision):
        raise bad(f"revision {revision!r} must be letters, digits, '.', '_' or '-'")
    if rest.partition("/")[1] and not file:
        raise bad("it ends with '/'")
    if file:
        if not all(_is_path_segment(s) for s in file.split("/")):
            raise bad(f"file path {file!r} has an empty, '.' or '..' segment")
        if not file.lower().endswith(".gguf"):
            raise bad(f"file {file!r} is not a .gguf file")
    return HubModel(owner, repo, revision if at else DEFAULT_REVISION, file or None)


def _is_name(text: str) -> bool:
    return _NAME.fullmatch(text) is not None and ".." not in text


def _is_path_segment(text: str) -> bool:
    return text not in ("", ".", "..") and "\\" not in text and "\0" not in text


def hub_endpoint() -> str:
    """$RUVLLM_HF_ENDPOINT, else https://huggingface.co (no trailing slash)."""
    return (os.environ.get("RUVLLM_HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def cache_folder() -> Path:
    """$RUVLLM_MODELS_DIR, else $XDG_CACHE_HOME/ruvllm/hub (only an absolute one counts), else ~/.cache/ruvllm/hub."""
    if os.environ.get("RUVLLM_MODELS_DIR"):
        return Path(os.environ["RUVLLM_MODELS_DIR"]).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "ruvllm" / "hub"


def download(name: str, cache_dir: str | os.PathLike | None = None, progress: Progress | None = None) -> Path:
    """Fetch hub name `name` into the cache unless it is there: the GGUF file's path, or the model folder.

    progress(path, done_bytes, total_bytes or None) is called as each file arrives (first with 0 done).
    Raises DownloadError (what could not be fetched and why) and InvalidArgumentError (a malformed name).
    """
    model = parse(name)
    folder = model.folder(Path(cache_dir) if cache_dir is not None else cache_folder())
    if model.file is not None:
        return _fetch_file(model, model.file, folder, progress)
    if not _folder_complete(folder):
        _fetch_folder(model, folder, progress)
    return folder


def ensure_local(name: str, progress: Progress | None = None) -> str:
    """The local path of hub name `name` (a .gguf file or a model folder), downloaded into the cache if missing."""
    return str(download(name, progress=progress))


def _fetch_folder(model: HubModel, folder: Path, progress: Progress | None) -> None:
    config = _fetch_file(model, "config.json", folder, progress, optional=True)
    if config is None:
        raise DownloadError(
            f"{model.name}: no config.json at {model.url('config.json')} (HTTP 404): the repo does not exist on the "
            f"hub, or it is not a model folder (for one GGUF file of a repo, name it: {model.name}/FILE.gguf)"
        )
    files = [config, _fetch_file(model, "tokenizer.json", folder, progress)]
    files += [f for f in (_fetch_file(model, n, folder, progress, optional=True) for n in OPTIONAL_FILES) if f]
    index = _fetch_file(model, WEIGHTS_INDEX, folder, progress, optional=True)
    if index is None:
        files.append(_fetch_file(model, WEIGHTS, folder, progress))
    else:
        files.append(index)
        files += [_fetch_file(model, shard, folder, progress) for shard in _shards(model, index)]
    record = {"name": model.name, "files": {f.name: f.stat().st_size for f in files}}
    _write_atomically(folder / COMPLETE, json.dumps(record, indent=1).encode())


def _shards(model: HubModel, index: Path) -> list[str]:
    """The weight files a safetensors index names (its weight_map's values), each checked to be a plain file name."""
    where = model.url(WEIGHTS_INDEX)
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        index.unlink()  # not a usable index: fetched again next time
        raise DownloadError(f"{where}: not a safetensors index with a weight_map ({type(e).__name__}: {e})") from None
    for shard in shards:
        if not isinstance(shard, str) or "/" in shard or not _is_path_segment(shard):
            index.unlink()
            raise DownloadError(f"{where}: weight_map names {shard!r}, not a file name in the model folder")
    return shards


def _folder_complete(folder: Path) -> bool:
    """True when the folder's `.complete` record exists and every file it lists has its recorded size."""
    try:
        files = json.loads((folder / COMPLETE).read_text(encoding="utf-8"))["files"]
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _fetch_file(
    model: HubModel, path: str, folder: Path, progress: Progress | None, optional: bool = False
) -> Path | None:
    """The local copy of `path` of the repo, downloaded if missing; None if `optional` and the hub has none."""
    target = folder / path
    if target.is_file():
        return target  # only complete files are ever renamed to their final path
    url = model.url(path)
    response = _open(url, model, optional)
    if response is None:
        return None
    with response:
        total = _content_length(response)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", suffix=".part", delete=False)
        try:
            with tmp:
                done = _copy(response, tmp, url, target, total, progress)
            if total is not None and done != total:
                raise DownloadError(f"{url}: arrived incomplete, {done} of {total} bytes")
            if target.suffix.lower() == ".gguf":
                _check_gguf(Path(tmp.name), url)
            os.replace(tmp.name, target)
        except BaseException:  # failed, interrupted or refused: no partial file stays behind
            os.unlink(tmp.name)
            raise
    return target


def _open(url: str, model: HubModel, optional: bool) -> http.client.HTTPResponse | None:
    """The response for `url` (redirects followed), None for a 404 of an optional file, DownloadError otherwise."""
    request = urllib.request.Request(url, headers={"User-Agent": "ruvllm"})
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 404 and optional:
            return None
        if e.code == 404:
            raise DownloadError(
                f"{url}: not found (HTTP 404): the file or repo of {model.name} does not exist on the hub"
            ) from None
        if e.code in (401, 403):
            # The hub answers 401 for repos that do not exist as well as for private or gated ones.
            raise DownloadError(
                f"{url}: HTTP {e.code} {e.reason}: {model.owner}/{model.repo} does not exist on the hub, or is "
                "private or gated (ruvllm downloads public repos only, without a token)"
            ) from None
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise DownloadError(f"{url}: cannot connect: {e.reason}") from None
    except (OSError, http.client.HTTPException) as e:
        raise DownloadError(f"{url}: cannot fetch: {type(e).__name__}: {e}") from None


def _content_length(response: http.client.HTTPResponse) -> int | None:
    value = response.headers.get("Content-Length")
    return int(value) if value is not None and value.strip().isdigit() else None


def _copy(response, out, url: str, target: Path, total: int | None, progress: Progress | None) -> int:
    """Copy the body to `out` in chunks, reporting progress; the number of bytes copied."""
    done = 0
    if progress is not None:
        progress(target, 0, total)
    while True:
        try:
            chunk = response.read(CHUNK)
        except http.client.IncompleteRead as e:
            raise DownloadError(f"{url}: arrived incomplete, the connection closed after {done} bytes") from e
        except (OSError, http.client.HTTPException) as e:
            raise DownloadError(f"{url}: download failed after {done} bytes: {type(e).__name__}: {e}") from None
        if not chunk:
            return done
        out.write(chunk)
        done += len(chunk)
        if progress is not None:
            progress(target, done, total)


def _check_gguf(path: Path, url: str) -> None:
    with open(path, "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        raise DownloadError(f"{url}: not a GGUF file (it starts with {head!r}, a GGUF file with {GGUF_MAGIC!r})")


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".part", delete=False)
    try:
        with tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    except BaseException:
        os.unlink(tmp.name)
        raise


def list_cached(cache_dir: str | os.PathLike | None = None) -> list[CachedModel]:
    """The models in the cache: complete model folders and GGUF files, sorted by name."""
    root = Path(cache_dir) if cache_dir is not None else cache_folder()
    found = []
    for folder in sorted(root.glob("*/*/*")):  # <owner>/<repo>/<revision>
        if not folder.is_dir():
            continue
        owner, repo, revision = folder.relative_to(root).parts
        if not (_is_name(owner) and _is_name(repo) and _is_name(revision)):
            continue  # not ours
        model = HubModel(owner, repo, revision)
        if _folder_complete(folder):
            files = json.loads((folder / COMPLETE).read_text(encoding="utf-8"))["files"]
            found.append(CachedModel(model.name, folder, sum(files.values()), "folder"))
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            hidden = any(p.startswith(".") for p in relative.parts)  # temporary files are hidden
            if path.is_file() and not hidden and path.suffix.lower() == ".gguf":
                name = HubModel(owner, repo, revision, relative.as_posix()).name
                found.append(CachedModel(name, path, path.stat().st_size, "gguf"))
    return sorted(found, key=lambda m: m.name)
