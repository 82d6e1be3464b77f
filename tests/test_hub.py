"""Hub names (`hf:`): parsing, downloads into the cache against a local hub, and `ruvllm download` / `list`."""

from __future__ import annotations

import json
import shutil
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from ruvllm import cli
from ruvllm.errors import DownloadError, InvalidArgumentError
from ruvllm.files import hub

from conftest import byte_tokenizer_json, tiny_model

GGUF_REPO = "acme/tiny-gguf"
FOLDER_REPO = "acme/tiny-llama"
SHARDED_REPO = "acme/tiny-sharded"
NOT_A_MODEL_REPO = "acme/only-gguf"


def write_gguf(path: Path, rows: int = 256) -> None:
    """A small but real GGUF file (one f32 tensor)."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.arange(rows * 16, dtype=np.float32).reshape(rows, 16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_model_folder(folder: Path, shard_size: str | None = None) -> None:
    """A tiny random Llama in safetensors (in shards of `shard_size`), with a byte-level tokenizer.json."""
    model = tiny_model("llama")
    model.save_pretrained(folder, **({"max_shard_size": shard_size} if shard_size else {}))
    (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()), encoding="utf-8")


class LocalHub:
    """Files under `root` served as `/<owner>/<repo>/resolve/<revision>/<path>`, each request recorded.

    faults: URL path -> "short" (half the announced bytes, then the connection closes), an HTTP status
    (int), or ("redirect", URL path), as the hub does for large files it keeps on a CDN.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[str] = []
        self.faults: dict[str, object] = {}
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
                hub_.requests.append(path)
                fault = hub_.faults.get(path)
                if isinstance(fault, int):
                    self.send_error(fault)
                    return
                if isinstance(fault, tuple):
                    self.send_response(302)
                    self.send_header("Location", fault[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                file = hub_.root / path.lstrip("/")
                if not file.is_file():
                    self.send_error(404)
                    return
                data = file.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2] if fault == "short" else data)

            def log_message(self, *args) -> None:
                pass  # quiet: the test output is the requests list

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def source(self, repo: str, path: str = "", revision: str = "main") -> Path:
        return self.root / repo / "resolve" / revision / path

    def requested(self, suffix: str = "") -> list[str]:
        return [r for r in self.requests if r.endswith(suffix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def local_hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    server = LocalHub(root)
    write_gguf(server.source(GGUF_REPO, "tiny-f32.gguf"))
    write_gguf(server.source(GGUF_REPO, "quants/tiny q8.gguf"), rows=64)
    write_gguf(server.source(GGUF_REPO, "tiny-f32.gguf", revision="v1.0"), rows=32)
    write_gguf(server.source(NOT_A_MODEL_REPO, "model.gguf"))
    write_model_folder(server.source(FOLDER_REPO))
    write_model_folder(server.source(SHARDED_REPO), shard_size="100KB")
    yield server
    server.close()


@pytest.fixture
def local(local_hub, tmp_path, monkeypatch):
    """The local hub, fresh (no requests, no faults), as the endpoint; an empty cache folder."""
    local_hub.requests.clear()
    local_hub.faults.clear()
    monkeypatch.setenv("RUVLLM_HF_ENDPOINT", local_hub.endpoint)
    monkeypatch.setenv("RUVLLM_MODELS_DIR", str(tmp_path / "cache"))
    return local_hub


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def no_temporary_files(folder: Path) -> bool:
    return not [p for p in folder.rglob("*") if p.name.endswith(".part")]


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


def test_the_cache_folder_is_models_dir_else_absolute_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.setenv("RUVLLM_MODELS_DIR", str(tmp_path / "models"))
    assert hub.cache_folder() == tmp_path / "models"
    monkeypatch.delenv("RUVLLM_MODELS_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_folder() == tmp_path / "xdg" / "ruvllm" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG spec: relative paths are ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert hub.cache_folder() == tmp_path / "home" / ".cache" / "ruvllm" / "hub"


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
    assert path == tmp_path / "cache" / repo / revision / file
    assert path.read_bytes() == local.source(repo, file, revision).read_bytes()
    assert no_temporary_files(tmp_path / "cache")


def test_a_model_folder_lands_at_its_documented_path_with_identical_bytes(local, tmp_path):
    folder = hub.download(f"hf:{FOLDER_REPO}")
    assert folder == tmp_path / "cache" / FOLDER_REPO / "main"
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
    import ruvllm

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
    assert not (tmp_path / "cache").exists()


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


def test_a_download_cut_short_leaves_no_complete_looking_file(local, tmp_path):
    name, path = f"hf:{GGUF_REPO}/tiny-f32.gguf", f"/{GGUF_REPO}/resolve/main/tiny-f32.gguf"
    local.faults[path] = "short"
    with pytest.raises(DownloadError, match="arrived incomplete"):
        hub.download(name)
    folder = tmp_path / "cache" / GGUF_REPO / "main"
    assert not (folder / "tiny-f32.gguf").exists()
    assert no_temporary_files(tmp_path / "cache")
    assert hub.list_cached() == []
    del local.faults[path]  # the next try fetches it again, whole
    assert hub.download(name).read_bytes() == local.source(GGUF_REPO, "tiny-f32.gguf").read_bytes()


def test_an_interrupted_folder_download_resumes_with_the_files_it_lacks(local, tmp_path):
    weights = f"/{FOLDER_REPO}/resolve/main/model.safetensors"
    local.faults[weights] = "short"
    with pytest.raises(DownloadError, match="arrived incomplete"):
        hub.download(f"hf:{FOLDER_REPO}")
    folder = tmp_path / "cache" / FOLDER_REPO / "main"
    assert (folder / "config.json").exists()
    assert not (folder / "model.safetensors").exists()
    assert not (folder / hub.COMPLETE).exists()
    del local.faults[weights]
    local.requests.clear()
    hub.download(f"hf:{FOLDER_REPO}")
    assert not local.requested("/config.json")  # complete files stay
    assert local.requested("/model.safetensors") == [weights]
    assert files_of(folder) == files_of(local.source(FOLDER_REPO))


def test_a_body_that_is_not_gguf_is_refused(local, tmp_path):
    local.faults[f"/{GGUF_REPO}/resolve/main/tiny-f32.gguf"] = ("redirect", f"/{FOLDER_REPO}/resolve/main/config.json")
    with pytest.raises(DownloadError, match="not a GGUF file"):
        hub.download(f"hf:{GGUF_REPO}/tiny-f32.gguf")
    assert not (tmp_path / "cache" / GGUF_REPO / "main" / "tiny-f32.gguf").exists()


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
    assert out == f"{tmp_path / 'cache' / FOLDER_REPO / 'main'}\n"
    assert "downloading config.json" in err
    assert "downloading model.safetensors" in err
    assert cli.main(["download", f"hf:{FOLDER_REPO}"]) == 0  # cached: same path, nothing downloaded
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'cache' / FOLDER_REPO / 'main'}\n"
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
    cache = tmp_path / "cache"
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


def test_ruvllm_download_rewrites_one_line_per_file_on_a_terminal(local, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli.main(["download", f"hf:{GGUF_REPO}/tiny-f32.gguf"]) == 0
    err = capsys.readouterr().err
    size = local.source(GGUF_REPO, "tiny-f32.gguf").stat().st_size / 2**20
    assert err.startswith("\rtiny-f32.gguf 0.0/")
    assert err.endswith(f"\rtiny-f32.gguf {size:.1f}/{size:.1f} MiB\n")
    assert err.count("\n") == 1
