"""Hub names (`hf:`): parsing, downloads into the cache against a local hub, and `ruvllm download` / `list`."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import socket
import struct
import sys
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import ruvllm
from ruvllm import cli
from ruvllm.errors import DownloadError, InvalidArgumentError
from ruvllm.files import hub

from conftest import byte_tokenizer_json, numpy_model

GGUF_REPO = "acme/tiny-gguf"
FOLDER_REPO = "acme/tiny-llama"
SHARDED_REPO = "acme/tiny-sharded"
NOT_A_MODEL_REPO = "acme/only-gguf"


def write_gguf(path: Path, rows: int = 256) -> None:
    """A small but real GGUF file (version 3; llama with one block; one f32 tensor of (rows, 16)), as
    gguf-py's GGUFWriter writes it."""

    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text)) + text.encode()

    kvs = string("general.architecture") + struct.pack("<I", 8) + string("llama")  # 8: a string
    kvs += string("llama.block_count") + struct.pack("<II", 4, 1)  # 4: a uint32
    tensor = string("token_embd.weight") + struct.pack("<I2QIQ", 2, 16, rows, 0, 0)  # dims in ggml order, F32
    header = b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + kvs + tensor
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + bytes(-len(header) % 32) + np.arange(rows * 16, dtype="<f4").tobytes())


def write_model_folder(folder: Path, shard_bytes: int | None = None) -> None:
    """A tiny random Llama in safetensors (in shards of `shard_bytes`), with a byte-level tokenizer.json."""
    numpy_model("llama", folder, shard_bytes=shard_bytes)
    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()), encoding="utf-8")


COMMIT = "c0ffee" * 6 + "c0ff"  # the commit every revision of the local hub is at (40 hex digits)


def git_blob_id(data: bytes) -> str:
    """What the hub's ETag is for a small file: git's blob id."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Request:
    server: str  # "hub" or "cdn"
    path: str  # unquoted, without the query
    authorization: str | None
    range: str | None


class LocalHub:
    """Files under `root` served in the Hugging Face hub's layout, each request recorded.

    `/<owner>/<repo>/resolve/<revision>/<path>` answers with X-Repo-Commit. A small file comes back itself
    with its git blob id as ETag; a large one (.gguf, .safetensors) is a 302 to a second server, the CDN
    (at `localhost` and another port: another origin), with X-Linked-Size and X-Linked-Etag (its sha256),
    as the hub does. `/api/models/<owner>/<repo>/revision/<revision>` lists the files (unless `api` is off).
    Bodies honour `Range`.

    faults: resolve path -> an HTTP status (int), ("redirect", URL or path), or flags joined by "+":
      loop (a redirect to itself), garbage (bytes that are not HTTP), bad-status, hangup (closes without an
      answer), html (an HTML page), silent (no answer), header-drip, gated (401 with X-Error-Code: GatedRepo),
      no-revision (404 with X-Error-Code: RevisionNotFound),
      and for the body, wherever it is served: short (half the bytes, then the connection closes), unsized
      (no Content-Length: the body ends when the connection closes), drip (a byte every 0.2 s), pause (half,
      then the rest 0.5 s later), corrupt (the last byte flipped), no-range (Range ignored), anonymous (no
      hub headers: a plain web server).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log: list[Request] = []
        self.faults: dict[str, object] = {}
        self.api = True
        self.closing = threading.Event()  # ends the answers that hang
        self.hub = self._serve("hub")
        self.cdn = self._serve("cdn")
        self.endpoint = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_endpoint = f"http://localhost:{self.cdn.server_address[1]}"

    @property
    def requests(self) -> list[str]:
        """The paths asked of the hub (not of the CDN)."""
        return [r.path for r in self.log if r.server == "hub"]

    def _serve(self, role: str) -> ThreadingHTTPServer:
        local = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                try:
                    local.answer(self, role)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a stalled download it stopped)

            def log_message(self, *args) -> None:
                pass  # quiet: the test output is the log

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def answer(self, h: BaseHTTPRequestHandler, role: str) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(h.path).path)
        self.log.append(Request(role, path, h.headers.get("Authorization"), h.headers.get("Range")))
        if role == "cdn":  # /lfs/<resolve path>: the file's bytes
            resolve = path.removeprefix("/lfs")
            return self.body(h, self.root / resolve.lstrip("/"), self.flags(resolve), {})
        if path.startswith("/api/models/"):
            return self.listing(h, path)
        fault = self.faults.get(path)
        flags = self.flags(path)
        if isinstance(fault, int):
            h.send_response(fault)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        if isinstance(fault, tuple):
            return self.redirect(h, fault[1], {})
        if "loop" in flags:
            return self.redirect(h, path, {})
        if flags & {"garbage", "bad-status", "hangup", "silent", "header-drip", "html", "gated", "no-revision"}:
            return self.misbehave(h, flags)
        file = self.root / path.lstrip("/")
        if "/resolve/" not in path or not file.is_file():
            h.send_response(404)
            h.send_header("X-Repo-Commit", COMMIT)
            h.send_header("X-Error-Code", "EntryNotFound")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        data = file.read_bytes()
        if "anonymous" in flags:
            return self.body(h, file, flags, {})
        if file.suffix in (".gguf", ".safetensors"):
            sha256 = hashlib.sha256(data).hexdigest()
            linked = {"X-Linked-Size": str(len(data)), "X-Linked-Etag": f'"{sha256}"'}
            return self.redirect(h, f"{self.cdn_endpoint}/lfs{urllib.parse.quote(path)}", linked)
        return self.body(h, file, flags, {"ETag": f'"{git_blob_id(data)}"'})

    def redirect(self, h, location: str, headers: dict[str, str]) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("X-Repo-Commit", COMMIT)
        for name, value in headers.items():
            h.send_header(name, value)
        h.send_header("Content-Length", "0")
        h.end_headers()

    def body(self, h, file: Path, flags: set[str], headers: dict[str, str]) -> None:
        data = file.read_bytes()
        start = 0
        asked = h.headers.get("Range")
        if asked and "no-range" not in flags:
            start = int(asked.removeprefix("bytes=").partition("-")[0])
        h.send_response(206 if start else 200)
        if "anonymous" not in flags:
            h.send_header("X-Repo-Commit", COMMIT)
            for name, value in headers.items():
                h.send_header(name, value)
        h.send_header("Accept-Ranges", "bytes")
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if "unsized" in flags:
            h.send_header("Connection", "close")
            h.close_connection = True
        else:
            h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        data = data[start:]
        if "corrupt" in flags:
            data = data[:-1] + bytes([data[-1] ^ 1])
        if "short" in flags:
            h.wfile.write(data[: len(data) // 2])
            h.close_connection = True
        elif "drip" in flags:
            for i in range(len(data)):
                h.wfile.write(data[i : i + 1])
                h.wfile.flush()
                if self.closing.wait(0.2):
                    return
        elif "pause" in flags:
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            self.closing.wait(0.5)
            h.wfile.write(data[len(data) // 2 :])
        else:
            h.wfile.write(data)

    def misbehave(self, h, flags: set[str]) -> None:
        h.close_connection = True
        if "garbage" in flags:
            h.wfile.write(b"\x00\x01\x02 not HTTP at all \xff\xfe\r\n\r\n")
        elif "bad-status" in flags:
            h.wfile.write(b"HTTP/1.1 2OO Fine\r\nContent-Length: 2\r\n\r\nok")
        elif "silent" in flags:
            self.closing.wait(30)
        elif "header-drip" in flags:
            for byte in b"HTTP/1.1 200 OK\r\nX-Padding: " + b"x" * 1000:
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
                if self.closing.wait(0.2):
                    return
        elif "html" in flags:
            page = b"<!doctype html><html><body><h1>Welcome</h1></body></html>"
            h.send_response(200)
            h.send_header("Content-Type", "text/html; charset=utf-8")
            h.send_header("Content-Length", str(len(page)))
            h.end_headers()
            h.wfile.write(page)
        elif "gated" in flags or "no-revision" in flags:
            h.send_response(401 if "gated" in flags else 404)
            h.send_header("X-Error-Code", "GatedRepo" if "gated" in flags else "RevisionNotFound")
            h.send_header("Content-Length", "0")
            h.end_headers()
        # hangup: nothing at all

    def listing(self, h, path: str) -> None:
        owner, repo, kind, revision = path.removeprefix("/api/models/").split("/")[:4]
        folder = self.root / owner / repo / "resolve" / revision
        if not self.api or kind != "revision" or not folder.is_dir():
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        siblings = []
        for file in sorted(p for p in folder.rglob("*") if p.is_file()):
            data = file.read_bytes()
            sibling = {"rfilename": file.relative_to(folder).as_posix(), "size": len(data), "blobId": "0" * 40}
            if file.suffix in (".gguf", ".safetensors"):
                sibling["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            else:
                sibling["blobId"] = git_blob_id(data)
            siblings.append(sibling)
        body = json.dumps({"id": f"{owner}/{repo}", "sha": COMMIT, "siblings": siblings}).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def flags(self, path: str) -> set[str]:
        fault = self.faults.get(path)
        return set(fault.split("+")) if isinstance(fault, str) else set()

    def source(self, repo: str, path: str = "", revision: str = "main") -> Path:
        return self.root / repo / "resolve" / revision / path

    def requested(self, suffix: str = "") -> list[str]:
        return [r for r in self.requests if r.endswith(suffix)]

    def close(self) -> None:
        self.closing.set()
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()


@pytest.fixture(scope="module")
def local_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    server = LocalHub(root)
    write_gguf(server.source(GGUF_REPO, "tiny-f32.gguf"))
    write_gguf(server.source(GGUF_REPO, "quants/tiny q8.gguf"), rows=64)
    write_gguf(server.source(GGUF_REPO, "tiny-f32.gguf", revision="v1.0"), rows=32)
    write_gguf(server.source(NOT_A_MODEL_REPO, "model.gguf"))
    write_model_folder(server.source(FOLDER_REPO))
    write_model_folder(server.source(SHARDED_REPO), shard_bytes=100_000)
    yield server
    server.close()


@pytest.fixture
def local(local_hub, tmp_path, monkeypatch):
    """The local hub, fresh (no requests, no faults), as the endpoint; an empty cache folder."""
    local_hub.log.clear()
    local_hub.faults.clear()
    local_hub.api = True
    for name in ("HF_TOKEN", "RUVLLM_HF_STALL_SECONDS", "RUVLLM_HF_MIN_SPEED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUVLLM_HF_ENDPOINT", local_hub.endpoint)
    monkeypatch.setenv("RUVLLM_CACHE_DIR", str(tmp_path / "cache"))  # the hub folder: tmp_path/cache/hub
    monkeypatch.delenv("RUVLLM_MODELS_DIR", raising=False)
    return local_hub


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def no_temporary_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.name.endswith(".part")]


def partial_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.name.endswith(".part"))


def within(seconds: float, call):
    """call()'s result, or a failed test if it has not returned after `seconds` (a hang guard, not a timing)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(call).result(timeout=seconds)
    finally:
        pool.shutdown(wait=False)


GGUF_NAME, GGUF_PATH = f"hf:{GGUF_REPO}/tiny-f32.gguf", f"/{GGUF_REPO}/resolve/main/tiny-f32.gguf"
CONFIG_PATH = f"/{FOLDER_REPO}/resolve/main/config.json"


# --- names ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("hf:owner/repo", hub.HubModel("owner", "repo", "main", None)),
        ("hf:owner/repo@v1.0", hub.HubModel("owner", "repo", "v1.0", None)),
        ("hf:Org-1/Repo_2.x/model.Q4_0.gguf", hub.HubModel("Org-1", "Repo_2.x", "main", "model.Q4_0.gguf")),
        ("hf:owner/repo/sub/dir/x.gguf", hub.HubModel("owner", "repo", "main", "sub/dir/x.gguf")),
        ("hf:owner/repo@0123abcd/x y.gguf", hub.HubModel("owner", "repo", "0123abcd", "x y.gguf")),
    ],
)
def test_parse_takes_a_folder_or_a_gguf_file_with_an_optional_revision(name, expected):
    model = hub.parse(name)
    assert model == expected
    assert model.kind == ("folder" if expected.file is None else "gguf")
    assert hub.parse(model.name) == model


@pytest.mark.parametrize(
    "name, why",
    [
        ("owner/repo", "does not start with 'hf:'"),
        ("hf:", "owner ''"),
        ("hf:owner", "repo ''"),
        ("hf:owner/", "repo ''"),
        ("hf:owner/repo/", "ends with '/'"),
        ("hf:owner/repo@", "revision ''"),
        ("hf:owner/repo@refs/pr/1", "file 'pr/1' is not a .gguf"),  # a revision has no "/"
        ("hf:owner/repo/config.json", "is not a .gguf file"),
        ("hf:owner/repo/sub", "is not a .gguf file"),
        ("hf:owner/repo/../x.gguf", "'..' segment"),
        ("hf:owner/repo//x.gguf", "empty"),
        ("hf:own er/repo", "owner 'own er'"),
        ("hf:owner/re..po", "repo 're..po'"),
        ("hf:-owner/repo", "owner '-owner'"),
    ],
)
def test_parse_refuses_malformed_names_and_says_the_accepted_forms(name, why):
    with pytest.raises(InvalidArgumentError) as e:
        hub.parse(name)
    assert why in e.value.message
    assert "hf:OWNER/REPO (a model folder) or hf:OWNER/REPO/FILE.gguf" in e.value.message
    assert e.value.type == "invalid_argument"


def test_file_urls_follow_the_hub_layout_with_quoted_segments(monkeypatch):
    monkeypatch.delenv("RUVLLM_HF_ENDPOINT", raising=False)
    model = hub.parse("hf:owner/repo@v2/sub dir/a#b.gguf")
    assert model.url(model.file) == "https://huggingface.co/owner/repo/resolve/v2/sub%20dir/a%23b.gguf"
    monkeypatch.setenv("RUVLLM_HF_ENDPOINT", "http://127.0.0.1:9/mirror/")
    assert model.url("config.json") == "http://127.0.0.1:9/mirror/owner/repo/resolve/v2/config.json"


def test_the_cache_root_is_cache_dir_else_absolute_xdg_else_home_and_hub_downloads_go_to_its_hub_folder(
    monkeypatch, tmp_path
):
    for name in ("RUVLLM_CACHE_DIR", "RUVLLM_MODELS_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RUVLLM_CACHE_DIR", str(tmp_path / "root"))
    assert hub.cache_root() == tmp_path / "root"
    assert hub.cache_folder() == tmp_path / "root" / "hub"
    monkeypatch.delenv("RUVLLM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_folder() == tmp_path / "xdg" / "ruvllm" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG spec: relative paths are ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.cache_folder() == tmp_path / "home" / ".cache" / "ruvllm" / "hub"
    # (npm/test/shared-cache.test.js holds Node's cacheRoot to the same answers)


@pytest.mark.parametrize(
    "models_dir, cache_dir, advice",
    [
        ("models", None, "Set RUVLLM_CACHE_DIR instead and move the models of {tmp}/models into its hub/ folder"),
        ("data/hub", None, "Set RUVLLM_CACHE_DIR={tmp}/data to keep using it"),
        ("models", "root", "Set RUVLLM_CACHE_DIR instead and move the models of {tmp}/models into its hub/ folder"),
    ],
)
def test_the_retired_models_dir_is_refused_saying_what_replaced_it(
    local, monkeypatch, tmp_path, capsys, models_dir, cache_dir, advice
):
    monkeypatch.setenv("RUVLLM_MODELS_DIR", str(tmp_path / models_dir))
    if cache_dir is None:
        monkeypatch.delenv("RUVLLM_CACHE_DIR")
    else:
        monkeypatch.setenv("RUVLLM_CACHE_DIR", str(tmp_path / cache_dir))
    with pytest.raises(InvalidArgumentError) as e:
        hub.download(GGUF_NAME)
    hub_folder = hub.cache_folder({k: v for k, v in os.environ.items() if k != "RUVLLM_MODELS_DIR"})
    assert e.value.message == (
        f"$RUVLLM_MODELS_DIR is no longer read (it is {tmp_path / models_dir}): $RUVLLM_CACHE_DIR replaced it, the "
        f"root of everything ruvllm caches, hub downloads being kept in its hub/ folder (now {hub_folder}). "
        f"{advice.format(tmp=tmp_path)}, and unset RUVLLM_MODELS_DIR"
    )
    with pytest.raises(InvalidArgumentError, match="RUVLLM_MODELS_DIR is no longer read"):
        ruvllm.load(GGUF_NAME)
    assert cli.main(["download", GGUF_NAME]) == 1
    assert capsys.readouterr().err == f"ruvllm download: error: {e.value.message}\n"
    assert local.requests == []


def test_a_models_dir_that_is_the_hub_folder_is_taken(local, monkeypatch, tmp_path):
    monkeypatch.setenv("RUVLLM_MODELS_DIR", str(tmp_path / "cache" / "hub"))  # what RUVLLM_CACHE_DIR gives
    assert hub.download(GGUF_NAME) == tmp_path / "cache" / "hub" / GGUF_REPO / "main" / "tiny-f32.gguf"


# --- downloads -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, repo, revision, file",
    [
        (f"hf:{GGUF_REPO}/tiny-f32.gguf", GGUF_REPO, "main", "tiny-f32.gguf"),
        (f"hf:{GGUF_REPO}/quants/tiny q8.gguf", GGUF_REPO, "main", "quants/tiny q8.gguf"),
        (f"hf:{GGUF_REPO}@v1.0/tiny-f32.gguf", GGUF_REPO, "v1.0", "tiny-f32.gguf"),
    ],
)
def test_a_gguf_file_lands_at_its_documented_path_with_identical_bytes(local, tmp_path, name, repo, revision, file):
    path = hub.download(name)
    assert path == tmp_path / "cache" / "hub" / repo / revision / file
    assert path.read_bytes() == local.source(repo, file, revision).read_bytes()
    assert no_temporary_files(tmp_path / "cache" / "hub")


def test_a_model_folder_lands_at_its_documented_path_with_identical_bytes(local, tmp_path):
    folder = hub.download(f"hf:{FOLDER_REPO}")
    assert folder == tmp_path / "cache" / "hub" / FOLDER_REPO / "main"
    source = files_of(local.source(FOLDER_REPO))
    assert files_of(folder) == source
    assert set(source) == {"config.json", "generation_config.json", "tokenizer.json", "model.safetensors"}
    # tokenizer_config.json is optional: asked for once, missing, and not an error
    assert local.requested("/tokenizer_config.json") == [f"/{FOLDER_REPO}/resolve/main/tokenizer_config.json"]


def test_a_sharded_model_folder_brings_its_index_and_every_shard(local):
    folder = hub.download(f"hf:{SHARDED_REPO}")
    source = files_of(local.source(SHARDED_REPO))
    shards = [n for n in source if n.endswith(".safetensors")]
    assert len(shards) >= 2
    assert "model.safetensors.index.json" in source
    assert files_of(folder) == source
    assert not local.requested("/model.safetensors")  # the index says which files to fetch


def test_a_downloaded_folder_loads(local):
    pytest.importorskip("tokenizers")  # the text extra: the folder loads with its tokenizer

    model = ruvllm.load(hub.ensure_local(f"hf:{FOLDER_REPO}"))
    assert model.engine.config.num_hidden_layers == 2
    assert model.tokenizer.encode("hi") == [ord("h"), ord("i")]


def test_redirects_are_followed(local):
    target = f"/{GGUF_REPO}/resolve/v1.0/tiny-f32.gguf"
    local.faults[f"/{GGUF_REPO}/resolve/main/tiny-f32.gguf"] = ("redirect", target)
    path = hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf")
    assert path.read_bytes() == local.source(GGUF_REPO, "tiny-f32.gguf", "v1.0").read_bytes()
    assert local.requests[-1] == target


def test_a_second_download_does_not_ask_the_server(local):
    for name in (f"hf:{GGUF_REPO}/tiny-f32.gguf", f"hf:{FOLDER_REPO}", f"hf:{SHARDED_REPO}"):
        first = hub.download(name)
        asked = len(local.requests)
        assert hub.download(name) == first
        assert hub.ensure_local(name) == str(first)
        assert len(local.requests) == asked, name


def test_progress_reports_each_file_from_zero_to_its_size(local, tmp_path):
    calls = []
    path = hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf", progress=lambda *a: calls.append(a))
    size = path.stat().st_size
    assert calls[0] == (path, 0, size)
    assert calls[-1] == (path, size, size)
    assert [done for _, done, _ in calls] == sorted(done for _, done, _ in calls)


def test_cache_dir_argument_overrides_the_environment(local, tmp_path):
    path = hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf", cache_dir=tmp_path / "elsewhere")
    assert path == tmp_path / "elsewhere" / GGUF_REPO / "main" / "tiny-f32.gguf"
    assert not (tmp_path / "cache" / "hub").exists()


# --- failures ------------------------------------------------------------------------------------------------------


def test_a_missing_file_is_a_download_error_naming_the_url(local):
    with pytest.raises(DownloadError) as e:
        hub.download(f"hf:{GGUF_REPO}/no-such.gguf")
    url = f"{local.endpoint}/{GGUF_REPO}/resolve/main/no-such.gguf"
    assert url in e.value.message
    assert "404" in e.value.message
    assert "does not exist on the hub" in e.value.message
    assert e.value.type == "download"


def test_a_missing_repo_is_a_download_error(local):
    with pytest.raises(DownloadError, match="does not exist on the hub"):
        hub.download("hf:nobody/nothing")


def test_a_repo_without_config_json_is_not_a_model_folder(local):
    with pytest.raises(DownloadError) as e:
        hub.download(f"hf:{NOT_A_MODEL_REPO}")
    assert "no config.json" in e.value.message
    assert f"hf:{NOT_A_MODEL_REPO}/FILE.gguf" in e.value.message


def test_a_folder_missing_its_weights_is_a_download_error_and_not_complete(local, tmp_path):
    local.faults[f"/{FOLDER_REPO}/resolve/main/model.safetensors"] = 404
    with pytest.raises(DownloadError, match=r"model\.safetensors: not found"):
        hub.download(f"hf:{FOLDER_REPO}")
    assert hub.list_cached() == []


def test_an_interrupted_folder_download_resumes_with_the_files_it_lacks(local, tmp_path):
    weights = f"/{FOLDER_REPO}/resolve/main/model.safetensors"
    local.faults[weights] = "short"
    with pytest.raises(DownloadError, match="arrived incomplete"):
        hub.download(f"hf:{FOLDER_REPO}")
    folder = tmp_path / "cache" / "hub" / FOLDER_REPO / "main"
    assert (folder / "config.json").exists()
    assert not (folder / "model.safetensors").exists()
    assert not (folder / hub.COMPLETE).exists()
    del local.faults[weights]
    local.log.clear()
    hub.download(f"hf:{FOLDER_REPO}")
    assert not local.requested("/config.json")  # complete files stay
    assert local.requested("/model.safetensors") == [weights]
    assert files_of(folder) == files_of(local.source(FOLDER_REPO))


def test_a_body_that_is_not_gguf_is_refused(local, tmp_path):
    local.faults[f"/{GGUF_REPO}/resolve/main/tiny-f32.gguf"] = ("redirect", f"/{FOLDER_REPO}/resolve/main/config.json")
    with pytest.raises(DownloadError, match="not a GGUF file"):
        hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf")
    assert not (tmp_path / "cache" / "hub" / GGUF_REPO / "main" / "tiny-f32.gguf").exists()


def test_server_errors_are_download_errors_with_the_status(local):
    local.faults[f"/{GGUF_REPO}/resolve/main/tiny-f32.gguf"] = 503
    with pytest.raises(DownloadError, match="HTTP 503"):
        hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf")
    local.faults[f"/{GGUF_REPO}/resolve/main/tiny-f32.gguf"] = 401
    with pytest.raises(DownloadError, match="private or gated"):
        hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf")


def test_an_unreachable_hub_is_a_download_error(local, monkeypatch):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RUVLLM_HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(DownloadError, match="cannot connect"):
        hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf")


# --- incomplete and wrong bodies -----------------------------------------------------------------------------------


def test_a_download_cut_short_is_kept_only_as_a_partial_file_the_next_download_resumes(local, tmp_path):
    size = local.source(GGUF_REPO, "tiny-f32.gguf").stat().st_size
    local.faults[GGUF_PATH] = "short"
    with pytest.raises(DownloadError) as e:
        hub.download(GGUF_NAME)
    half = size // 2
    assert e.value.message == (
        f"{local.endpoint}{GGUF_PATH}: arrived incomplete, {half} of {size} bytes; its {half} bytes are kept and "
        "the next download resumes from them"
    )
    folder = tmp_path / "cache" / "hub" / GGUF_REPO / "main"
    assert not (folder / "tiny-f32.gguf").exists()
    assert hub.list_cached() == []
    assert [p.stat().st_size for p in partial_files(folder)] == [half]
    del local.faults[GGUF_PATH]
    local.log.clear()
    assert hub.download(GGUF_NAME).read_bytes() == local.source(GGUF_REPO, "tiny-f32.gguf").read_bytes()
    assert [r.range for r in local.log if r.server == "cdn"] == [f"bytes={half}-"]
    assert partial_files(tmp_path / "cache" / "hub") == []


@pytest.mark.parametrize("name, path", [(GGUF_NAME, GGUF_PATH), (f"hf:{FOLDER_REPO}", CONFIG_PATH)])
def test_a_body_cut_short_without_content_length_is_not_kept_and_is_fetched_again(local, tmp_path, name, path):
    source = local.root / path.lstrip("/")
    local.faults[path] = "short+unsized"  # the hub's X-Linked-Size (a GGUF) or its file list (config.json) tells
    with pytest.raises(DownloadError) as e:
        hub.download(name)
    size = source.stat().st_size
    assert e.value.message.startswith(f"{local.endpoint}{path}: arrived incomplete, {size // 2} of {size} bytes")
    target = tmp_path / "cache" / "hub" / path.lstrip("/").replace("resolve/", "")
    assert not target.exists()
    assert hub.list_cached() == []
    del local.faults[path]
    hub.download(name)
    assert target.read_bytes() == source.read_bytes()
    assert local.requested(path) == [path, path]
    assert partial_files(tmp_path / "cache" / "hub") == []


def test_a_body_without_content_length_is_taken_when_the_hubs_file_list_gives_its_size(local, tmp_path):
    local.faults[CONFIG_PATH] = "unsized"
    folder = hub.download(f"hf:{FOLDER_REPO}")
    assert files_of(folder) == files_of(local.source(FOLDER_REPO))
    assert local.requested(f"/api/models/{FOLDER_REPO}/revision/main") != []


def test_a_body_of_unknown_size_is_refused_when_nothing_gives_its_size(local, tmp_path):
    local.faults[CONFIG_PATH] = "unsized+anonymous"  # a plain web server: no X-Repo-Commit, no ETag
    local.api = False
    with pytest.raises(DownloadError) as e:
        hub.download(f"hf:{FOLDER_REPO}")
    assert e.value.message == (
        f"{local.endpoint}{CONFIG_PATH}: the server gave no size (no Content-Length or X-Linked-Size, and the "
        "hub's file list has none), so a body cut short could not be told from a whole one"
    )
    assert not (tmp_path / "cache" / "hub" / FOLDER_REPO / "main" / "config.json").exists()
    assert partial_files(tmp_path / "cache" / "hub") == []


@pytest.mark.parametrize(
    "name, path, what",
    [(GGUF_NAME, GGUF_PATH, "sha256"), (f"hf:{FOLDER_REPO}", CONFIG_PATH, "git blob id")],
)
def test_a_file_whose_hash_is_not_the_hubs_is_refused_and_not_kept(local, tmp_path, name, path, what):
    data = (local.root / path.lstrip("/")).read_bytes()
    want = hashlib.sha256(data).hexdigest() if what == "sha256" else git_blob_id(data)
    local.faults[path] = "corrupt"  # the last byte flipped: the size is right
    with pytest.raises(DownloadError) as e:
        hub.download(name)
    assert e.value.message.startswith(f"{local.endpoint}{path}: its {what} is ")
    assert e.value.message.endswith(f", the hub says {want}: what arrived is not the file; not kept")
    assert not (tmp_path / "cache" / "hub" / path.lstrip("/").replace("resolve/", "")).exists()
    assert partial_files(tmp_path / "cache" / "hub") == []
    del local.faults[path]
    hub.download(name)  # and fetched whole the next time


def test_a_config_that_is_not_json_is_refused(local, tmp_path):
    local.faults[CONFIG_PATH] = ("redirect", GGUF_PATH)
    with pytest.raises(DownloadError, match=r"config\.json: not valid JSON \(not UTF-8: byte 0x.*; not kept$"):
        hub.download(f"hf:{FOLDER_REPO}")
    assert not (tmp_path / "cache" / "hub" / FOLDER_REPO / "main" / "config.json").exists()


# --- misbehaving servers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault, message",
    [
        ("drip", "the download stalled after "),  # a byte every 0.2 s: a per-read timeout never fires
        ("silent", "no answer: "),
        ("header-drip", "no answer: "),
    ],
)
def test_a_dripping_or_silent_server_ends_in_a_download_error_after_the_stall_window(
    local, tmp_path, monkeypatch, fault, message
):
    monkeypatch.setenv("RUVLLM_HF_STALL_SECONDS", "1")
    local.faults[GGUF_PATH] = fault
    with pytest.raises(DownloadError) as e:
        within(60, lambda: hub.download(GGUF_NAME))
    assert e.value.message.startswith(f"{local.endpoint}{GGUF_PATH}")
    assert message in e.value.message
    assert "fewer than 1024 bytes in 1 s (RUVLLM_HF_MIN_SPEED=1024 bytes/s over RUVLLM_HF_STALL_SECONDS=1)" in (
        e.value.message
    )
    assert not (tmp_path / "cache" / "hub" / GGUF_REPO / "main" / "tiny-f32.gguf").exists()


def test_a_stalled_download_says_how_much_arrived_and_keeps_it(local, tmp_path, monkeypatch):
    monkeypatch.setenv("RUVLLM_HF_STALL_SECONDS", "1")
    local.faults[GGUF_PATH] = "drip"
    with pytest.raises(DownloadError) as e:
        within(60, lambda: hub.download(GGUF_NAME))
    (partial,) = partial_files(tmp_path / "cache" / "hub")
    size = local.source(GGUF_REPO, "tiny-f32.gguf").stat().st_size
    kept = partial.stat().st_size
    assert 0 < kept < size
    assert f"the download stalled after {kept} of {size} bytes: " in e.value.message
    assert e.value.message.endswith(f"; its {kept} bytes are kept and the next download resumes from them")


def test_a_redirect_loop_is_one_download_error(local):
    local.faults[GGUF_PATH] = "loop"
    with pytest.raises(DownloadError) as e:
        hub.download(GGUF_NAME)
    url = f"{local.endpoint}{GGUF_PATH}"
    assert e.value.message == f"{url}: more than 10 redirects (a loop?), the last to {url}"
    assert len(local.requested(GGUF_PATH)) == 11


def test_a_redirect_to_a_url_that_is_not_http_is_refused(local):
    local.faults[GGUF_PATH] = ("redirect", "file:///etc/passwd")
    with pytest.raises(DownloadError) as e:
        hub.download(GGUF_NAME)
    assert e.value.message == f"{local.endpoint}{GGUF_PATH}: redirected to file:///etc/passwd, not an http(s) URL"


@pytest.mark.parametrize(
    "fault, message",
    [
        ("garbage", "the answer is not HTTP: "),
        ("bad-status", "the answer is not HTTP: 'HTTP/1.1 2OO Fine\\r\\n'"),
        ("hangup", "the server closed the connection without an answer"),
        ("html", "an HTML page came instead of the file (Content-Type: text/html): http://127.0.0.1:"),
    ],
)
def test_a_server_that_does_not_answer_as_the_hub_does_is_one_download_error(local, tmp_path, fault, message):
    local.faults[GGUF_PATH] = fault
    with pytest.raises(DownloadError) as e:
        hub.download(GGUF_NAME)
    assert e.value.message.startswith(f"{local.endpoint}{GGUF_PATH}: {message}")
    assert e.value.message.isprintable()
    assert not (tmp_path / "cache" / "hub" / GGUF_REPO / "main" / "tiny-f32.gguf").exists()
    assert partial_files(tmp_path / "cache" / "hub") == []


# --- partial files -------------------------------------------------------------------------------------------------


def interrupt_midway(path: Path, done: int, total: int | None) -> None:
    """A progress callback that stops the download as Ctrl-C would, once some bytes have arrived."""
    if 0 < done < (total or done + 1):
        raise KeyboardInterrupt


def test_an_interrupted_download_of_a_file_without_a_hash_leaves_no_partial_file(local, tmp_path):
    local.faults[GGUF_PATH] = "anonymous+pause"  # a plain web server: nothing to check a resumed file against
    with pytest.raises(KeyboardInterrupt):
        hub.download(GGUF_NAME, progress=interrupt_midway)
    assert not (tmp_path / "cache" / "hub" / GGUF_REPO / "main" / "tiny-f32.gguf").exists()
    assert partial_files(tmp_path / "cache" / "hub") == []


def test_an_interrupted_download_of_a_file_with_a_hash_resumes_from_its_partial_file(local, tmp_path):
    local.faults[GGUF_PATH] = "pause"  # half, then the rest: the interrupt comes in between
    with pytest.raises(KeyboardInterrupt):
        hub.download(GGUF_NAME, progress=interrupt_midway)
    (partial,) = partial_files(tmp_path / "cache" / "hub")
    kept = partial.stat().st_size
    del local.faults[GGUF_PATH]
    local.log.clear()
    calls = []
    path = hub.download(GGUF_NAME, progress=lambda *a: calls.append(a))
    assert path.read_bytes() == local.source(GGUF_REPO, "tiny-f32.gguf").read_bytes()
    assert [r.range for r in local.log if r.server == "cdn"] == [f"bytes={kept}-"]
    assert calls[0] == (path, kept, path.stat().st_size)
    assert partial_files(tmp_path / "cache" / "hub") == []


def test_a_server_that_ignores_range_sends_the_whole_file_again(local, tmp_path):
    local.faults[GGUF_PATH] = "short"
    with pytest.raises(DownloadError):
        hub.download(GGUF_NAME)
    local.faults[GGUF_PATH] = "no-range"
    assert hub.download(GGUF_NAME).read_bytes() == local.source(GGUF_REPO, "tiny-f32.gguf").read_bytes()
    assert partial_files(tmp_path / "cache" / "hub") == []


def test_stale_partial_files_of_the_target_are_removed_when_its_download_starts(local, tmp_path):
    folder = tmp_path / "cache" / "hub" / GGUF_REPO / "main"
    folder.mkdir(parents=True)
    stale = [folder / ".tiny-f32.gguf.k3j_x9a2.part", folder / ".tiny-f32.gguf.0123456789abcdef.part"]
    other = folder / ".other.gguf.0123456789abcdef.part"  # another file's: not this download's to remove
    for path in [*stale, other]:
        path.write_bytes(b"GGUF left by a killed download")
    hub.download(GGUF_NAME)
    assert partial_files(folder) == [other]


fcntl = pytest.importorskip("fcntl") if sys.platform != "win32" else None


@pytest.mark.skipif(fcntl is None, reason="partial files are locked with fcntl.flock (POSIX)")
def test_a_partial_file_another_download_holds_is_left_alone(local, tmp_path):
    folder = tmp_path / "cache" / "hub" / GGUF_REPO / "main"
    folder.mkdir(parents=True)
    busy = folder / ".tiny-f32.gguf.0123456789abcdef.part"  # another version, being downloaded right now
    with open(busy, "wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        hub.download(GGUF_NAME)
        assert partial_files(folder) == [busy]


@pytest.mark.skipif(fcntl is None, reason="partial files are locked with fcntl.flock (POSIX)")
def test_a_download_of_a_version_another_download_holds_waits_for_it(local, tmp_path):
    data = local.source(GGUF_REPO, "tiny-f32.gguf").read_bytes()
    folder = tmp_path / "cache" / "hub" / GGUF_REPO / "main"
    folder.mkdir(parents=True)
    busy = folder / f".tiny-f32.gguf.{hashlib.sha256(data).hexdigest()[:16]}.part"
    with open(busy, "wb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        waiting = pool.submit(hub.download, GGUF_NAME)
        with pytest.raises(concurrent.futures.TimeoutError):
            waiting.result(timeout=0.5)  # it waits while the other holds the file...
    assert within(60, waiting.result).read_bytes() == data  # ...and downloads once it let go without finishing
    pool.shutdown()


# --- tokens --------------------------------------------------------------------------------------------------------


def test_hf_token_goes_to_the_hub_and_never_to_the_cdn_it_redirects_to(local, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_local_test_token")
    hub.download(GGUF_NAME)
    hub.download(f"hf:{FOLDER_REPO}")
    to_hub = [r.authorization for r in local.log if r.server == "hub"]
    to_cdn = [r.authorization for r in local.log if r.server == "cdn"]
    assert to_hub and set(to_hub) == {"Bearer hf_local_test_token"}
    assert to_cdn and set(to_cdn) == {None}


def test_without_hf_token_no_authorization_is_sent(local):
    hub.download(GGUF_NAME)
    assert {r.authorization for r in local.log} == {None}


def test_an_unauthorized_answer_says_whether_hf_token_is_set(local, monkeypatch):
    local.faults[GGUF_PATH] = 401
    url = f"{local.endpoint}{GGUF_PATH}"
    with pytest.raises(DownloadError) as e:
        hub.download(GGUF_NAME)
    assert e.value.message == (
        f"{url}: HTTP 401 Unauthorized: {GGUF_REPO} does not exist on the hub, or is private or gated "
        "(no HF_TOKEN is set)"
    )
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    local.faults[GGUF_PATH] = "gated"
    with pytest.raises(DownloadError) as e:
        hub.download(GGUF_NAME)
    assert e.value.message == (
        f"{url}: HTTP 401 Unauthorized: {GGUF_REPO} is gated: accept its conditions at "
        f"{local.endpoint}/{GGUF_REPO}, then set HF_TOKEN (HF_TOKEN is set but does not give access)"
    )


def test_a_revision_the_hub_does_not_have_is_named_even_for_an_optional_file(local):
    local.faults[CONFIG_PATH] = "no-revision"  # config.json is asked for as optional: a 404 alone means "no file"
    with pytest.raises(DownloadError) as e:
        hub.download(f"hf:{FOLDER_REPO}")
    assert e.value.message == (
        f"{local.endpoint}{CONFIG_PATH}: HTTP 404 Not Found: {FOLDER_REPO} has no revision 'main' on the hub"
    )


@pytest.mark.parametrize(
    "variable, value, message",
    [
        ("RUVLLM_HF_STALL_SECONDS", "soon", "$RUVLLM_HF_STALL_SECONDS must be a number of seconds > 0; got 'soon'"),
        ("RUVLLM_HF_STALL_SECONDS", "-1", "$RUVLLM_HF_STALL_SECONDS must be a number of seconds > 0; got '-1'"),
        ("RUVLLM_HF_STALL_SECONDS", "inf", "$RUVLLM_HF_STALL_SECONDS must be a number of seconds > 0; got 'inf'"),
        ("RUVLLM_HF_MIN_SPEED", "1.5", "$RUVLLM_HF_MIN_SPEED must be a whole number of bytes per second > 0"),
        ("RUVLLM_HF_MIN_SPEED", "0", "$RUVLLM_HF_MIN_SPEED must be a whole number of bytes per second > 0"),
        ("RUVLLM_HF_ENDPOINT", "file:///etc", "$RUVLLM_HF_ENDPOINT must be an http:// or https:// URL"),
        ("RUVLLM_HF_ENDPOINT", "huggingface.co", "$RUVLLM_HF_ENDPOINT must be an http:// or https:// URL"),
    ],
)
def test_malformed_download_settings_are_refused_before_any_request(local, monkeypatch, variable, value, message):
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidArgumentError) as e:
        hub.download(GGUF_NAME)
    assert e.value.message.startswith(message)
    assert local.log == []


# --- the cache -----------------------------------------------------------------------------------------------------


def test_list_cached_names_every_complete_model_with_its_size(local, tmp_path):
    assert hub.list_cached() == []
    gguf_path = hub.download(f"hf:{GGUF_REPO}@v1.0/tiny-f32.gguf")
    nested = hub.download(f"hf:{GGUF_REPO}/quants/tiny q8.gguf")
    folder = hub.download(f"hf:{FOLDER_REPO}")
    (folder.parent.parent / "stray-file").write_text("not a model")
    folder_size = sum(len(b) for b in files_of(folder).values())
    assert hub.list_cached() == [
        hub.CachedModel(f"hf:{GGUF_REPO}/quants/tiny q8.gguf", nested, nested.stat().st_size, "gguf"),
        hub.CachedModel(f"hf:{GGUF_REPO}@v1.0/tiny-f32.gguf", gguf_path, gguf_path.stat().st_size, "gguf"),
        hub.CachedModel(f"hf:{FOLDER_REPO}", folder, folder_size, "folder"),
    ]
    assert hub.list_cached(tmp_path / "elsewhere") == []


# --- the command ---------------------------------------------------------------------------------------------------


def test_ruvllm_download_prints_progress_on_stderr_and_the_path_on_stdout(local, tmp_path, capsys):
    assert cli.main(["download", f"hf:{FOLDER_REPO}"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'cache' / 'hub' / FOLDER_REPO / 'main'}\n"
    assert "downloading config.json" in err
    assert "downloading model.safetensors" in err
    assert cli.main(["download", f"hf:{FOLDER_REPO}"]) == 0  # cached: same path, nothing downloaded
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'cache' / 'hub' / FOLDER_REPO / 'main'}\n"
    assert err == ""


@pytest.mark.parametrize(
    "name, message",
    [
        (f"hf:{GGUF_REPO}/missing.gguf", "does not exist on the hub"),
        ("acme/tiny", "does not start with 'hf:'"),
    ],
)
def test_ruvllm_download_fails_with_one_line(local, capsys, name, message):
    assert cli.main(["download", name]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("ruvllm download: error: ")
    assert message in lines[0]


def test_ruvllm_list_shows_name_kind_size_and_path(local, tmp_path, capsys):
    cache = tmp_path / "cache" / "hub"
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().out == f"no models in {cache}\n"
    gguf_path = hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf")
    folder = hub.download(f"hf:{FOLDER_REPO}")
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    first, second = (line.split() for line in lines)
    assert first[:2] == [f"hf:{GGUF_REPO}/tiny-f32.gguf", "gguf"]
    assert first[-1] == str(gguf_path)
    assert second[:2] == [f"hf:{FOLDER_REPO}", "folder"]
    assert second[3:] == ["MiB", str(folder)]
    assert float(second[2]) == pytest.approx(hub.list_cached()[1].size / 2**20, abs=0.05)
    shutil.rmtree(cache)
    assert cli.main(["list"]) == 0
    assert capsys.readouterr().out == f"no models in {cache}\n"


def test_ruvllm_list_shows_partial_files_after_the_models(local, tmp_path, capsys):
    folder = hub.download(f"hf:{FOLDER_REPO}")
    local.faults[GGUF_PATH] = "short"
    assert cli.main(["download", GGUF_NAME]) == 1
    capsys.readouterr()
    assert cli.main(["list"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    (partial,) = partial_files(tmp_path / "cache" / "hub")
    assert [line[:2] for line in lines] == [[f"hf:{FOLDER_REPO}", "folder"], [GGUF_NAME, "partial"]]
    assert lines[0][-1] == str(folder)
    assert lines[1][-1] == str(partial)


@pytest.mark.parametrize("fault", ["garbage", "loop", "html", "short+unsized"])
def test_ruvllm_download_from_a_misbehaving_server_fails_with_one_line(local, capsys, fault):
    local.faults[GGUF_PATH] = fault
    assert cli.main(["download", GGUF_NAME]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    *progress, error = err.splitlines()  # the progress lines of the files begun, then the error in one line
    assert all(line.startswith("downloading tiny-f32.gguf") for line in progress)
    assert error.startswith(f"ruvllm download: error: {local.endpoint}{GGUF_PATH}: ")


def test_ruvllm_download_rewrites_one_line_per_file_on_a_terminal(local, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(["download", f"hf:{GGUF_REPO}/tiny-f32.gguf"]) == 0
    err = capsys.readouterr().err
    size = local.source(GGUF_REPO, "tiny-f32.gguf").stat().st_size / 2**20
    assert err.startswith("\rtiny-f32.gguf 0.0/")
    assert err.endswith(f"\rtiny-f32.gguf {size:.1f}/{size:.1f} MiB\n")
    assert err.count("\n") == 1
