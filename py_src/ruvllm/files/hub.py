"""Hub names: `hf:OWNER/REPO` (a model folder) or `hf:OWNER/REPO/FILE.gguf` (one GGUF file), downloaded once.

Accepted forms (REVISION, a branch, tag or commit, defaults to `main`):

    hf:OWNER/REPO                     config.json, tokenizer.json, tokenizer_config.json?, generation_config.json?,
    hf:OWNER/REPO@REVISION            model.safetensors or model.safetensors.index.json and its shards
    hf:OWNER/REPO/PATH/FILE.gguf      one GGUF file (PATH may be empty)
    hf:OWNER/REPO@REVISION/FILE.gguf

A file lives at `{endpoint}/{owner}/{repo}/resolve/{revision}/{path}`, the Hugging Face hub's layout; the
endpoint is $RUVLLM_HF_ENDPOINT, else https://huggingface.co. Downloads go to the hub folder of the cache
root (`cache_root`: $RUVLLM_CACHE_DIR, else $XDG_CACHE_HOME/ruvllm, else ~/.cache/ruvllm) as
`<root>/hub/<owner>/<repo>/<revision>/<path>`. The npm package reads and writes `hf:` names in the same
folder the same way (npm/src/worker/hub-folder.js), so a model downloaded by either runtime is read by the
other without a request.

A file is renamed to its final path only once it has arrived whole and checked (files/transfer.py: the
size and, where the hub gives it, the sha256 or git blob id; then its format: a GGUF's magic, JSON that
parses, a safetensors header), so a file at its final path is complete and is never fetched again. A model
folder is complete once its `.complete` record (the files and their sizes) exists. $HF_TOKEN, if set, is
sent to the endpoint (never to the CDN it redirects to), for private and gated repos.

Only the standard library is used. huggingface_hub (installed with the text extra) was measured against
a misbehaving local hub and not taken: a server dripping a byte every 2 s holds its downloads forever
(a per-read timeout), a silent one for 394 s, and it keeps a file cut short without Content-Length or
whose sha256 is wrong as complete.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from ..errors import DownloadError, InvalidArgumentError, LoadError
from . import layout
from .jsonfields import parse_json
from .transfer import Expected, HTTPStatusError, Progress, Stall, fetch, is_partial, read_small, write_atomically

PREFIX = "hf:"
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
FORMS = "hf:OWNER/REPO (a model folder) or hf:OWNER/REPO/FILE.gguf (one GGUF file), with @REVISION after REPO optional"
GGUF_MAGIC = b"GGUF"
COMPLETE = ".complete"  # a model folder's record of its files: written last, so it means "all arrived"
CACHE_DIR_ENV = "RUVLLM_CACHE_DIR"
RETIRED_ENV = "RUVLLM_MODELS_DIR"  # the hub folder itself, until the two runtimes shared one root
HUB_FOLDER = "hub"  # the root's folder of hub downloads (the npm package keeps urls/ and boot/ beside it)

# Owner, repo and revision: letters, digits, '.', '_', '-' (the hub's own rule, less its length limits).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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
    """$RUVLLM_HF_ENDPOINT, else https://huggingface.co (no trailing slash); an http(s) URL."""
    endpoint = (os.environ.get("RUVLLM_HF_ENDPOINT") or DEFAULT_ENDPOINT).strip().rstrip("/")
    parts = urllib.parse.urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise InvalidArgumentError(f"$RUVLLM_HF_ENDPOINT must be an http:// or https:// URL; got {endpoint!r}")
    return endpoint


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """The root of everything ruvllm keeps on disk: $RUVLLM_CACHE_DIR, else $XDG_CACHE_HOME/ruvllm (only an
    absolute XDG_CACHE_HOME counts, as the XDG spec says), else ~/.cache/ruvllm; absolute and normalised,
    symlinks left as they are, a leading `~` meaning $HOME.

        <root>/hub/<owner>/<repo>/<revision>/<path>    hub downloads, by this module and the npm package
        <root>/urls/<sha256 of the URL>/               the npm package's files given by URL
        <root>/boot/                                   the npm package's boot snapshots

    The same rule as cacheRoot in npm/src/worker/cache-folder.js (npm/test/shared-cache.test.js holds the two
    to the same answers). InvalidArgumentError when the retired $RUVLLM_MODELS_DIR is set to another folder
    than the hub folder this gives: it is never ignored in silence.
    """
    env = os.environ if environ is None else environ
    home = env.get("HOME") or str(Path.home())

    def absolute(path: str) -> str:
        if path == "~" or path.startswith("~/"):
            path = home + path[1:]
        return os.path.abspath(path)

    xdg = env.get("XDG_CACHE_HOME", "")
    if env.get(CACHE_DIR_ENV):
        root = absolute(env[CACHE_DIR_ENV])
    elif os.path.isabs(xdg):
        root = absolute(os.path.join(xdg, "ruvllm"))
    else:
        root = absolute(os.path.join(home, ".cache", "ruvllm"))
    hub = os.path.join(root, HUB_FOLDER)
    if env.get(RETIRED_ENV) and absolute(env[RETIRED_ENV]) != hub:
        raise InvalidArgumentError(retired_message(absolute(env[RETIRED_ENV]), hub))
    return Path(root)


def retired_message(models_dir: str, hub: str) -> str:
    """What a $RUVLLM_MODELS_DIR of `models_dir` is told, the hub folder being `hub` (cache-folder.js says the same)."""
    parent, name = os.path.split(models_dir)
    if name == HUB_FOLDER:
        advice = f"Set {CACHE_DIR_ENV}={parent} to keep using it"
    else:
        advice = f"Set {CACHE_DIR_ENV} instead and move the models of {models_dir} into its {HUB_FOLDER}/ folder"
    return (
        f"${RETIRED_ENV} is no longer read (it is {models_dir}): ${CACHE_DIR_ENV} replaced it, the root of "
        f"everything ruvllm caches, hub downloads being kept in its {HUB_FOLDER}/ folder (now {hub}). {advice}, "
        f"and unset {RETIRED_ENV}"
    )


def cache_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where hub downloads are kept: the `hub` folder of `cache_root`."""
    return cache_root(environ) / HUB_FOLDER


def download(name: str, cache_dir: str | os.PathLike | None = None, progress: Progress | None = None) -> Path:
    """Fetch hub name `name` into the cache unless it is there: the GGUF file's path, or the model folder.

    progress(path, done_bytes, total_bytes or None) is called as each file arrives (first with the bytes
    already there: 0, or those of a partial file it resumes).
    Raises DownloadError (what could not be fetched and why) and InvalidArgumentError (a malformed name,
    a malformed $RUVLLM_HF_ENDPOINT, $RUVLLM_HF_STALL_SECONDS or $RUVLLM_HF_MIN_SPEED, or the retired
    $RUVLLM_MODELS_DIR).
    """
    model = parse(name)
    folder = model.folder(Path(cache_dir) if cache_dir is not None else cache_folder())
    if model.file is not None and (folder / model.file).is_file():
        return folder / model.file  # only complete files are ever renamed to their final path
    if model.file is None and _folder_complete(folder):
        return folder
    source = _Source(model, hub_endpoint(), hub_token(), Stall.from_env(), progress)
    if model.file is not None:
        return source.fetch(model.file, folder)
    _fetch_folder(source, folder)
    return folder


def ensure_local(name: str, progress: Progress | None = None) -> str:
    """The local path of hub name `name` (a .gguf file or a model folder), downloaded into the cache if missing."""
    return str(download(name, progress=progress))


def hub_token() -> str | None:
    """$HF_TOKEN (the Hugging Face access token, for private and gated repos), or None."""
    return os.environ.get("HF_TOKEN", "").strip() or None


class _Source:
    """One repo at one revision on the hub, with what downloading from it needs."""

    def __init__(self, model: HubModel, endpoint: str, token: str | None, stall: Stall, progress) -> None:
        self.model, self.endpoint, self.token, self.stall, self.progress = model, endpoint, token, stall, progress
        self._listing: dict[str, Expected] | None = None

    def url(self, path: str) -> str:
        return self.model.url(path, self.endpoint)

    @overload
    def fetch(self, path: str, folder: Path, optional: Literal[False] = False) -> Path: ...

    @overload
    def fetch(self, path: str, folder: Path, optional: bool) -> Path | None: ...

    def fetch(self, path: str, folder: Path, optional: bool = False) -> Path | None:
        """The local copy of `path` of the repo, downloaded if missing; None if `optional` and the hub has none."""
        target = folder / path
        if target.is_file():
            return target
        url = self.url(path)
        try:
            fetch(
                url,
                target,
                token=self.token,
                token_origin=self.endpoint,
                stall=self.stall,
                progress=self.progress,
                lookup=lambda: self.listing().get(path, Expected()),
                check=lambda partial: _problem(target.suffix.lower(), partial),
            )
        except HTTPStatusError as e:
            if e.code == 404 and optional and e.error_code not in ("RepoNotFound", "RevisionNotFound"):
                return None
            raise self._status_error(e) from None
        return target

    def listing(self) -> dict[str, Expected]:
        """The repo's files at this revision with their sizes and hashes, from the hub's API ({} if it has none).

        Asked only when an answer gives no size: `GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true`
        lists `siblings`, each with `rfilename`, `size`, `blobId` and, for a large file, `lfs: {sha256, size}`.
        """
        if self._listing is None:
            self._listing = {}
            m = self.model
            parts = ("api", "models", m.owner, m.repo, "revision", m.revision)
            url = self.endpoint + "/" + "/".join(urllib.parse.quote(p, safe="") for p in parts) + "?blobs=true"
            try:
                body = read_small(url, token=self.token, token_origin=self.endpoint, stall=self.stall)
                self._listing = _siblings(parse_json(body, url))
            except (DownloadError, HTTPStatusError, LoadError, ValueError):
                pass  # no listing: the download that asked says it has no size to check against
        return self._listing

    def _status_error(self, e: HTTPStatusError) -> DownloadError:
        m, where = self.model, f"{e.url}: HTTP {e.code} {e.reason}"
        if e.error_code == "RevisionNotFound":
            return DownloadError(f"{where}: {m.owner}/{m.repo} has no revision {m.revision!r} on the hub")
        if e.code == 404:
            return DownloadError(
                f"{e.url}: not found (HTTP 404): the file or repo of {m.name} does not exist on the hub"
            )
        if e.code in (401, 403):
            # The hub answers 401 for repos that do not exist as well as for private or gated ones.
            page = f"{self.endpoint}/{m.owner}/{m.repo}"
            if e.error_code == "GatedRepo":
                why = f"{m.owner}/{m.repo} is gated: accept its conditions at {page}, then set HF_TOKEN"
            else:
                why = f"{m.owner}/{m.repo} does not exist on the hub, or is private or gated"
            token = "HF_TOKEN is set but does not give access" if self.token else "no HF_TOKEN is set"
            return DownloadError(f"{where}: {why} ({token})")
        return DownloadError(where)


def _siblings(answer) -> dict[str, Expected]:
    """The API's `siblings` as path -> Expected; entries of another shape are left out."""
    found = {}
    for sibling in answer.get("siblings", []) if isinstance(answer, dict) else []:
        if not isinstance(sibling, dict) or not isinstance(sibling.get("rfilename"), str):
            continue
        lfs = sibling.get("lfs")
        if isinstance(lfs, dict) and isinstance(lfs.get("size"), int) and isinstance(lfs.get("sha256"), str):
            found[sibling["rfilename"]] = Expected(lfs["size"], lfs["sha256"].lower())
        elif isinstance(sibling.get("size"), int):
            blob = sibling.get("blobId")
            found[sibling["rfilename"]] = Expected(sibling["size"], None, blob if isinstance(blob, str) else None)
    return found


def _problem(suffix: str, path: Path) -> str | None:
    """What is wrong with a finished file for its kind (a GGUF's magic, JSON that parses, a safetensors header)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if suffix == ".gguf" and head[:4] != GGUF_MAGIC:
        return f"not a GGUF file (it starts with {head[:4]!r}, a GGUF file with {GGUF_MAGIC!r})"
    if suffix == ".safetensors":
        size = int.from_bytes(head[:8], "little") if len(head) == 9 else None
        if size is None or head[8:9] != b"{" or size > path.stat().st_size - 8:
            return f"not a safetensors file (it starts with {head!r}, a safetensors file with a header size and '{{')"
    if suffix == ".json":
        try:
            parse_json(path.read_bytes(), "it")
        except LoadError as e:
            return e.message.removeprefix("it is ").splitlines()[0][:200]
    return None


def _fetch_folder(source: _Source, folder: Path) -> None:
    model = source.model
    config = source.fetch("config.json", folder, optional=True)
    if config is None:
        raise DownloadError(
            f"{model.name}: no config.json at {source.url('config.json')} (HTTP 404): the repo does not exist on "
            f"the hub, or it is not a model folder (for one GGUF file of a repo, name it: {model.name}/FILE.gguf)"
        )
    files = [config, source.fetch(layout.TOKENIZER, folder)]  # (a model to run: its tokenizer is needed)
    documents = (name for name, optional in layout.DOCUMENTS if optional and name != layout.WEIGHTS_INDEX)
    files += [f for f in (source.fetch(name, folder, optional=True) for name in documents) if f]
    index = source.fetch(layout.WEIGHTS_INDEX, folder, optional=True)
    if index is not None:
        files.append(index)
    files += [source.fetch(name, folder) for name in _weight_files(source, index)]
    record = {"name": model.name, "files": {f.name: f.stat().st_size for f in files}}
    write_atomically(folder / COMPLETE, json.dumps(record, indent=1).encode())


def _weight_files(source: _Source, index: Path | None) -> list[str]:
    """The weight files of the folder (files/layout.py): the shards its index names, or model.safetensors."""
    if index is None:
        return layout.weight_files(None)
    where = source.url(layout.WEIGHTS_INDEX)
    try:
        return layout.weight_files(parse_json(index.read_bytes(), where), where)
    except LoadError as e:
        index.unlink()  # not a usable index: fetched again next time
        raise DownloadError(str(e)) from None


def _folder_complete(folder: Path) -> bool:
    """True when the folder's `.complete` record exists and every file it lists has its recorded size."""
    try:
        files = parse_json((folder / COMPLETE).read_bytes(), COMPLETE)["files"]  # type: ignore[index]
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, LoadError, ValueError, KeyError, TypeError, AttributeError):
        return False


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
            files = parse_json((folder / COMPLETE).read_bytes(), COMPLETE)["files"]  # type: ignore[index]
            found.append(CachedModel(model.name, folder, sum(files.values()), "folder"))
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            hidden = any(p.startswith(".") for p in relative.parts)  # temporary files are hidden
            if path.is_file() and not hidden and path.suffix.lower() == ".gguf":
                name = HubModel(owner, repo, revision, relative.as_posix()).name
                found.append(CachedModel(name, path, path.stat().st_size, "gguf"))
    return sorted(found, key=lambda m: m.name)


def list_partial(cache_dir: str | os.PathLike | None = None) -> list[CachedModel]:
    """Partial files in the cache (kept to be resumed, or left by a killed download), as the models they belong to.

    The next download of the model resumes from (or removes) them.
    """
    root = Path(cache_dir) if cache_dir is not None else cache_folder()
    found = []
    for folder in sorted(root.glob("*/*/*")):  # <owner>/<repo>/<revision>
        owner, repo, revision = folder.relative_to(root).parts
        if not (folder.is_dir() and _is_name(owner) and _is_name(repo) and _is_name(revision)):
            continue
        for path in sorted(folder.rglob(".*.part")):
            target = path.name[1:].rsplit(".", 2)[0]  # .{name}.{tag}.part
            if not path.is_file() or not is_partial(path.name) or target == COMPLETE:
                continue
            relative = path.parent.relative_to(folder) / target
            gguf = relative.suffix.lower() == ".gguf"
            model = HubModel(owner, repo, revision, relative.as_posix() if gguf else None)
            found.append(CachedModel(model.name, path, path.stat().st_size, "partial"))
    return sorted(found, key=lambda m: m.name)
