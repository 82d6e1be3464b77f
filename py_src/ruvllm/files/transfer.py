"""One file over HTTP into place, checked: the transport under files/hub.py (standard library only).

    fetch(url, target, token=..., token_origin=..., stall=Stall.from_env())

A file is complete only when what arrived has the size the server announced and, when the hub gives
one, its hash: the hub's answer on `resolve/` carries `X-Repo-Commit`, and then `X-Linked-Size` and
`X-Linked-Etag` (the sha256 of a large file, which the hub redirects to its CDN) or `ETag` (the git
blob id of a small file it serves itself). Only then is the file renamed to `target`.

- Stalls: a download that gets fewer than `min_speed` bytes a second over `seconds` seconds (from the
  request on: headers included) ends in a DownloadError, like curl's --speed-limit/--speed-time. A
  per-read socket timeout would let a server dripping a byte every few seconds hold on forever.
- Redirects are followed here, at most MAX_REDIRECTS, to http(s) URLs only; the token goes only to
  URLs of `token_origin` (the hub), never to the CDN a redirect leads to.
- Partial files: the bytes go to `.{name}.{tag}.part` beside the target, locked while in use. When the
  hub gives a hash, the tag is the start of it and a failed transfer keeps the partial file: the next
  download of the same version resumes from it with `Range` (the hash is checked over the whole file).
  Partial files of the target that no process holds are removed when a download of it starts, so at
  most one (the resumable one) stays per file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import io
import math
import os
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DownloadError, InvalidArgumentError

try:
    import fcntl  # POSIX: partial files are locked while a download writes them
except ImportError:  # Windows: no locks; a partial spoilt by two writers fails its hash check
    fcntl = None  # type: ignore[assignment]  # (the module, or None where it does not exist)

MAX_REDIRECTS = 10
CHUNK = 1 << 20
STALL_SECONDS_ENV, MIN_SPEED_ENV = "RUVLLM_HF_STALL_SECONDS", "RUVLLM_HF_MIN_SPEED"
REDIRECTS = (301, 302, 303, 307, 308)
_HEX = re.compile(r"[0-9a-f]+")

Progress = Callable[[Path, int, int | None], None]
Check = Callable[[Path], str | None]  # a finished file -> what is wrong with it, or None


@dataclass(frozen=True)
class Stall:
    """A download stalls when fewer than `min_speed` × `seconds` bytes arrive within `seconds` seconds."""

    seconds: float = 30.0
    min_speed: int = 1024  # bytes per second

    @property
    def min_bytes(self) -> int:
        return max(1, math.ceil(self.seconds * self.min_speed))

    @classmethod
    def from_env(cls) -> Stall:
        """$RUVLLM_HF_STALL_SECONDS (default 30) and $RUVLLM_HF_MIN_SPEED (bytes per second, default 1024)."""
        seconds = _env_number(STALL_SECONDS_ENV, float, cls.seconds, "a number of seconds > 0")
        min_speed = _env_number(MIN_SPEED_ENV, int, cls.min_speed, "a whole number of bytes per second > 0")
        return cls(seconds, min_speed)

    def describe(self) -> str:
        """`fewer than B bytes in S s (the two settings)`: what a stall is, for error messages."""
        return (
            f"fewer than {self.min_bytes} bytes in {self.seconds:g} s ({MIN_SPEED_ENV}={self.min_speed} bytes/s "
            f"over {STALL_SECONDS_ENV}={self.seconds:g})"
        )


def _env_number(name: str, kind: type, default, expected: str):
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not value > 0 or not math.isfinite(value):
        raise InvalidArgumentError(f"${name} must be {expected}; got {text!r}")
    return value


@dataclass(frozen=True)
class Expected:
    """What the server says the file is: its size, and its sha256 or git blob id (sha1 of b"blob <size>\\0" + bytes)."""

    size: int | None = None
    sha256: str | None = None
    git_blob: str | None = None

    @property
    def key(self) -> str | None:
        """What names this version of the file (its partial file's tag): its hash, if the hub gave one."""
        return self.sha256 or self.git_blob

    def merged(self, other: Expected) -> Expected:
        """These values, with what is missing taken from `other`."""
        return Expected(self.size or other.size, self.sha256 or other.sha256, self.git_blob or other.git_blob)


class HTTPStatusError(Exception):
    """An HTTP error answer (not a redirect): the caller turns it into a DownloadError that names the model."""

    def __init__(self, url: str, code: int, reason: str, headers) -> None:
        super().__init__(f"{url}: HTTP {code} {reason}")
        self.url, self.code, self.reason = url, code, reason
        self.error_code = headers.get("X-Error-Code") if headers is not None else None


def fetch(
    url: str,
    target: Path,
    *,
    token: str | None = None,
    token_origin: str | None = None,
    stall: Stall | None = None,
    progress: Progress | None = None,
    lookup: Callable[[], Expected] | None = None,
    check: Check | None = None,
) -> None:
    """Download `url` to `target` (renamed into place once complete and checked).

    token: sent as `Authorization: Bearer` to URLs of `token_origin` only. lookup: asked for the size
    and hash when the answer gives no size. check: a last look at the finished file (its format).
    Raises DownloadError naming `url`, or HTTPStatusError for an error answer.
    """
    transfer = _Transfer(url, target, token, token_origin, stall or Stall.from_env(), progress, lookup, check)
    for _ in range(5):  # each round after the first follows another process's download of the file
        if transfer.run():
            return
        if target.is_file():
            return  # the other process finished it
    raise DownloadError(f"{url}: other processes kept downloading {target} (its partial file stayed in use)")


def read_small(
    url: str, *, token: str | None = None, token_origin: str | None = None, stall: Stall, limit: int = 1 << 24
) -> bytes:
    """The whole body at `url` (at most `limit` bytes; redirects followed): the hub's JSON answers."""
    transfer = _Transfer(url, Path(), token, token_origin, stall, None, None, None)
    here = url
    for _ in range(MAX_REDIRECTS + 1):
        try:
            with transfer._open(here, 0) as response:
                if response.status in REDIRECTS:
                    here = transfer._redirect_target(here, response)
                    continue
                body = response.read(limit + 1)
        except _StallError:
            raise DownloadError(f"{url}: no answer: {stall.describe()}") from None
        except (OSError, http.client.HTTPException) as e:
            raise DownloadError(f"{url}: cannot fetch: {type(e).__name__}: {_short(e)}") from None
        if len(body) > limit:
            raise DownloadError(f"{url}: the answer is larger than {limit} bytes")
        return body
    raise DownloadError(f"{url}: more than {MAX_REDIRECTS} redirects (a loop?), the last to {here}")


class _StallError(Exception):
    """Fewer bytes than the stall rule asks for arrived in its window."""


class _RefusedError(Exception):
    """The bytes that arrived are not the file: the partial file is removed, not resumed."""


class _Transfer:
    def __init__(self, url, target, token, token_origin, stall, progress, lookup, check) -> None:
        self.url, self.target, self.token, self.stall = url, target, token, stall
        self.token_origin = _origin(token_origin) if token_origin else None
        self.progress, self.lookup, self.check = progress, lookup, check
        self.opener = urllib.request.build_opener(
            _NoRedirects(), _GuardedHTTPHandler(stall), _GuardedHTTPSHandler(stall)
        )

    def run(self) -> bool:
        """One attempt: True once the target is in place, False when another process holds its partial file."""
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.said, self.heard = Expected(), False  # what the hub said (its answer that carries X-Repo-Commit)
        self.partial: _Partial | None = None
        self.total: int | None = None  # the bytes the body should have, once its headers are read
        self.hop, self.receiving, self.done = self.url, False, 0
        try:
            with contextlib.ExitStack() as stack:
                response = self._follow()
                if response is None:
                    return False
                stack.enter_context(response)
                self._receive(response)
            self._finish()
            return True
        except _RefusedError as e:
            wrote = self.receiving
            self._release(keep=False)
            raise DownloadError(f"{self.url}: {e}" + ("; not kept" if wrote else "")) from None
        except _StallError:
            kept = self._release(keep=True)
            if not self.receiving:
                raise DownloadError(f"{self._where(self.hop)}: no answer: {self.stall.describe()}") from None
            raise DownloadError(
                f"{self.url}: the download stalled after {self.done} of {self.total or '?'} bytes: "
                f"{self.stall.describe()}{kept}"
            ) from None
        except DownloadError as e:
            kept = self._release(keep=True)
            raise DownloadError(e.message + kept) from None
        except BaseException:  # HTTPStatusError, KeyboardInterrupt, ...: a resumable partial file stays
            self._release(keep=True)
            raise

    # --- the request chain -------------------------------------------------------------------------------------

    def _follow(self) -> http.client.HTTPResponse | None:
        """The answer with the file's bytes, redirects followed; None if another process holds the partial file."""
        here, offset = self.url, 0
        for _ in range(MAX_REDIRECTS + 1):
            response = self._open(here, offset)
            if response.status in REDIRECTS:
                with response:
                    self._note_hub(response)
                    here = self._redirect_target(here, response)
                if self.said.key is not None and self.partial is None:
                    if not self._take_partial():
                        return None
                    offset = self._resume_offset()
                continue
            self._note_hub(response)
            if self.partial is None:
                if not self._take_partial():
                    response.close()
                    return None
                if (offset := self._resume_offset()) and response.headers.get("Accept-Ranges") == "bytes":
                    response.close()  # the hub served the file itself: ask again for the part that is missing
                    response = self._open(here, offset)
            return self._started(response, here, offset)
        raise DownloadError(f"{self.url}: more than {MAX_REDIRECTS} redirects (a loop?), the last to {here}")

    def _open(self, url: str, offset: int) -> http.client.HTTPResponse | urllib.error.HTTPError:
        self.hop = url
        headers = {"User-Agent": "ruvllm", "Accept-Encoding": "identity"}
        if self.token and _origin(url) == self.token_origin:
            headers["Authorization"] = f"Bearer {self.token}"
        if offset:
            headers["Range"] = f"bytes={offset}-"
        try:
            return self.opener.open(urllib.request.Request(url, headers=headers), timeout=self.stall.seconds)
        except urllib.error.HTTPError as e:
            if e.code in REDIRECTS and e.headers.get("Location"):
                return e  # an HTTPError is a response too: read its headers, then close it
            e.close()
            if e.code == 416 and offset:
                raise _RefusedError(f"the server cannot send bytes {offset}- (HTTP 416)") from None
            raise HTTPStatusError(self._where(url), e.code, e.reason, e.headers) from None
        except _StallError:
            raise
        except urllib.error.URLError as e:
            raise DownloadError(f"{self._where(url)}: cannot connect: {_short(e.reason)}") from None
        except http.client.RemoteDisconnected:
            raise DownloadError(f"{self._where(url)}: the server closed the connection without an answer") from None
        except http.client.HTTPException as e:
            raise DownloadError(f"{self._where(url)}: the answer is not HTTP: {_short(e)}") from None
        except (OSError, ValueError) as e:  # a reset connection; an URL http.client refuses
            raise DownloadError(f"{self._where(url)}: cannot fetch: {type(e).__name__}: {_short(e)}") from None

    def _redirect_target(self, here: str, response) -> str:
        location = response.headers["Location"]
        there = urllib.parse.urljoin(here, location.strip())
        if urllib.parse.urlsplit(there).scheme not in ("http", "https"):
            raise DownloadError(f"{self.url}: redirected to {_short(location)}, not an http(s) URL")
        return there

    def _note_hub(self, response) -> None:
        """Keep what the hub says of the file: its first answer that carries X-Repo-Commit."""
        headers = response.headers
        if self.heard or not headers.get("X-Repo-Commit"):
            return
        self.heard = True
        tag = _etag(headers.get("X-Linked-Etag") or headers.get("ETag"))
        size = _integer(headers.get("X-Linked-Size"))
        if size is None and response.status not in REDIRECTS:
            size = _content_length(headers)
        sha256 = tag if tag is not None and len(tag) == 64 else None
        git_blob = tag if tag is not None and len(tag) == 40 and size is not None else None
        self.said = Expected(size, sha256, git_blob)

    def _started(self, response, here: str, offset: int) -> http.client.HTTPResponse:
        """Check the answer's headers before its body is read; set the expected size and the resume offset."""
        headers = response.headers
        if response.status not in (200, 206) or (response.status == 206 and not offset):
            raise _RefusedError(f"the server answered HTTP {response.status} {_short(response.reason)}, not the file")
        if (encoding := headers.get("Content-Encoding", "identity").strip().lower()) != "identity":
            raise _RefusedError(f"the server sent the file compressed (Content-Encoding: {encoding}), not as asked")
        if headers.get_content_type() == "text/html":
            raise _RefusedError(
                f"an HTML page came instead of the file (Content-Type: text/html): {_origin_text(here)} does not "
                "serve the hub's files"
            )
        if response.status == 206 and offset:
            start, total = _content_range(headers.get("Content-Range"))
            if start != offset:
                raise _RefusedError(f"asked for bytes {offset}- and got {headers.get('Content-Range')!r}")
            length = total
        else:
            offset = 0
            length = _content_length(headers)
        expected = self.said if self.said.size is not None else self.said.merged(Expected(length))
        chunked = headers.get("Transfer-Encoding", "").strip().lower() == "chunked"
        if expected.size is None and self.lookup is not None and not chunked:
            expected = expected.merged(self.lookup())
        if expected.size is None and not chunked:
            raise _RefusedError(
                "the server gave no size (no Content-Length or X-Linked-Size, and the hub's file list has none), "
                "so a body cut short could not be told from a whole one"
            )
        self.expected, self.offset, self.here = expected, offset, here
        return response

    # --- the body ---------------------------------------------------------------------------------------------

    @property
    def _partial_file(self) -> _Partial:
        assert self.partial is not None  # (taken before the body is read)
        return self.partial

    def _take_partial(self) -> bool:
        self.partial = _Partial.take(self.target, self.said.key)
        return self.partial is not None

    def _resume_offset(self) -> int:
        """Bytes of a resumable partial file to keep: only for a file with a hash, and short of its size."""
        size = self._partial_file.size()
        if self.said.key is None or self.said.size is None or not 0 < size < self.said.size:
            return 0
        return size

    def _receive(self, response) -> None:
        self._partial_file.truncate(self.offset)
        hasher = self._hasher()
        if hasher is not None and self.offset:
            self._partial_file.feed(hasher, self.offset)
        self.hasher, self.done, self.total = hasher, self.offset, self.expected.size
        self.receiving = True
        if self.progress is not None:
            self.progress(self.target, self.done, self.total)
        while True:
            try:
                chunk = response.read1(CHUNK)
            except (http.client.IncompleteRead, ConnectionError) as e:
                if self.total is None:  # a chunked body cut short: nothing else tells
                    raise DownloadError(
                        f"{self.url}: arrived incomplete, the connection closed after {self.done} bytes "
                        f"({type(e).__name__})"
                    ) from None
                chunk = b""  # the size check below says what is missing
            except (OSError, http.client.HTTPException) as e:
                raise DownloadError(
                    f"{self._where(self.here)}: failed after {self.done} bytes: {type(e).__name__}: {_short(e)}"
                ) from None
            if not chunk:
                break
            self._partial_file.write(chunk)
            if hasher is not None:
                hasher.update(chunk)
            self.done += len(chunk)
            if self.progress is not None:
                self.progress(self.target, self.done, self.total)
        if self.total is not None and self.done < self.total:
            raise DownloadError(f"{self.url}: arrived incomplete, {self.done} of {self.total} bytes")
        if self.total is not None and self.done > self.total:
            raise _RefusedError(f"{self.done} bytes arrived, the server announced {self.total}")

    def _hasher(self):
        if self.expected.sha256:
            return hashlib.sha256()
        if self.expected.git_blob:
            hasher = hashlib.sha1()
            hasher.update(b"blob %d\0" % self.expected.size)
            return hasher
        return None

    def _finish(self) -> None:
        if self.hasher is not None:
            sha256, git_blob = self.expected.sha256, self.expected.git_blob
            name, want = ("sha256", sha256) if sha256 else ("git blob id", git_blob)
            if (got := self.hasher.hexdigest()) != want:
                raise _RefusedError(f"its {name} is {got}, the hub says {want}: what arrived is not the file")
        if self.check is not None and (problem := self.check(self._partial_file.path)):
            raise _RefusedError(problem)
        self._partial_file.commit(self.target)
        self.partial = None

    def _release(self, keep: bool) -> str:
        """Let go of the partial file; kept (for a resume) only if it has a hash and bytes. The note to add."""
        partial, self.partial = self.partial, None
        if partial is None:
            return ""
        kept = keep and self.said.key is not None and partial.size() > 0
        partial.release(keep=kept)
        return f"; its {partial.size_at_release} bytes are kept and the next download resumes from them" if kept else ""

    def _where(self, url: str) -> str:
        """The URL asked for, and the host a redirect led to, if another."""
        return self.url if _origin(url) == _origin(self.url) else f"{self.url} (redirected to {_origin_text(url)})"


# --- partial files ----------------------------------------------------------------------------------------------


class _Partial:
    """A target's partial file `.{name}.{tag}.part` beside it, held under an exclusive lock while in use."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd, self.size_at_release = path, fd, 0

    @classmethod
    def take(cls, target: Path, key: str | None) -> _Partial | None:
        """The partial file for this version (key: its hash, or None for a fresh unique one), locked; stale
        partial files of the target removed. None if another process holds this version's partial file."""
        tag = key[:16] if key is not None else uuid.uuid4().hex[:12]
        path = target.parent / f".{target.name}.{tag}.part"
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
            if not _lock(fd, wait=False):
                os.close(fd)
                _wait_for(path)  # another process downloads this very version: wait for it, then look again
                return None
            if _same_file(fd, path):
                break
            os.close(fd)  # removed as stale between open and lock: open it again
        partial = cls(path, fd)
        _remove_stale(target, keep=path)
        return partial

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        os.lseek(self.fd, size, os.SEEK_SET)

    def feed(self, hasher, size: int) -> None:
        """Hash the first `size` bytes (those kept from an earlier try)."""
        os.lseek(self.fd, 0, os.SEEK_SET)
        left = size
        while left and (block := os.read(self.fd, min(CHUNK, left))):
            hasher.update(block)
            left -= len(block)
        os.lseek(self.fd, size, os.SEEK_SET)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    def commit(self, target: Path) -> None:
        """Rename the finished file to `target`. Under a lock, the lock is let go only after the rename: another
        download could otherwise take the file in between and start it over."""
        os.fsync(self.fd)
        if fcntl is None:
            os.close(self.fd)  # Windows renames no file that is open
        os.replace(self.path, target)
        if fcntl is not None:
            os.close(self.fd)

    def release(self, keep: bool) -> None:
        """Let go of the file, removing it unless `keep` (again: under a lock, removed before the lock goes)."""
        self.size_at_release = self.size()
        if fcntl is None:
            os.close(self.fd)  # Windows removes no file that is open
        if not keep:
            with contextlib.suppress(OSError):  # gone already, or (Windows) opened by another download
                self.path.unlink()
        if fcntl is not None:
            os.close(self.fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a locked partial file (a killed write leaves one the next cleans up)."""
    partial = _Partial.take(path, None)
    assert partial is not None  # (a fresh unique name: no other process holds it)
    try:
        partial.write(data)
        partial.commit(path)
    except BaseException:
        partial.release(keep=False)
        raise


def is_partial(name: str) -> bool:
    return name.startswith(".") and name.endswith(".part")


def _remove_stale(target: Path, keep: Path) -> None:
    """Remove the partial files of `target` that no process holds (left by killed downloads), all but `keep`."""
    own = re.compile(re.escape(f".{target.name}.") + r"[A-Za-z0-9_]{6,16}\.part")
    for path in target.parent.iterdir():
        if path == keep or not own.fullmatch(path.name):
            continue
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            if _lock(fd, wait=False) and _same_file(fd, path):
                path.unlink()
        except OSError:
            pass  # in use (Windows) or already gone: not ours to clean
        finally:
            os.close(fd)


def _lock(fd: int, wait: bool) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        return True
    except BlockingIOError:
        return False


def _wait_for(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(path, os.O_RDONLY)
        try:
            _lock(fd, wait=True)
        finally:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


# --- the stall guard: every read from the server's socket, headers included -------------------------------------


class _GuardedReader(io.RawIOBase):
    """The socket's bytes, raising _StallError when fewer than `stall.min_bytes` arrive within `stall.seconds`.

    A window starts when the response does and again each time the window's quota is met; each read
    waits at most until the window's end, so a silent server and a dripping one end the same way.
    """

    def __init__(self, sock: socket.socket, stall: Stall) -> None:
        super().__init__()
        self.sock, self.raw, self.stall = sock, sock.makefile("rb", buffering=0), stall
        self.start, self.got = time.monotonic(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        now = time.monotonic()
        if self.got >= self.stall.min_bytes:
            self.start, self.got = now, 0
        left = self.start + self.stall.seconds - now
        if left <= 0:
            raise _StallError()
        self.sock.settimeout(left)
        try:
            n = self.raw.readinto(buffer)
        except TimeoutError:
            raise _StallError() from None
        self.got += n or 0
        return n

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self.raw.close()
        super().close()


class _GuardedSocket:
    """What http.client.HTTPResponse takes as its socket: it only calls makefile("rb")."""

    def __init__(self, sock: socket.socket, stall: Stall) -> None:
        self.sock, self.stall = sock, stall

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_GuardedReader(self.sock, self.stall))


class _GuardedResponse(http.client.HTTPResponse):
    def __init__(self, sock, *args, stall: Stall, **kwargs) -> None:
        super().__init__(_GuardedSocket(sock, stall), *args, **kwargs)  # type: ignore[arg-type]  # (duck-typed)


def _guarded(connection_class, stall: Stall):
    def connect(*args, **kwargs):
        connection = connection_class(*args, **kwargs)
        connection.response_class = functools.partial(_GuardedResponse, stall=stall)
        return connection

    return connect


class _Guarded(urllib.request.AbstractHTTPHandler):
    """A handler whose connections answer through _GuardedResponse (the HTTP and the HTTPS one below)."""

    def __init__(self, stall: Stall) -> None:
        super().__init__()
        self.stall = stall

    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_guarded(http_class, self.stall), req, **kwargs)


class _GuardedHTTPHandler(_Guarded, urllib.request.HTTPHandler):
    pass


class _GuardedHTTPSHandler(_Guarded, urllib.request.HTTPSHandler):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects come back as answers: fetch follows them itself (to read the hub's headers, to keep the token)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


# --- header values ----------------------------------------------------------------------------------------------


def _integer(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


def _content_length(headers) -> int | None:
    if headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        return None
    return _integer(headers.get("Content-Length"))


def _content_range(text: str | None) -> tuple[int | None, int | None]:
    """`bytes START-END/TOTAL` -> (START, TOTAL), None for what is missing or unreadable."""
    match = re.fullmatch(r"\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*", text or "")
    if match is None:
        return None, None
    return int(match[1]), None if match[2] == "*" else int(match[2])


def _etag(text: str | None) -> str | None:
    """An ETag's value (W/ and quotes dropped, lower case) if it is a hex digest, else None."""
    value = (text or "").strip().removeprefix("W/").strip('"').lower()
    return value if len(value) in (40, 64) and _HEX.fullmatch(value) else None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.scheme.lower(), (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(parts.scheme)


def _origin_text(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _short(value, limit: int = 120) -> str:
    """A value fit for a one-line message: printable, at most `limit` characters."""
    text = str(value)
    text = text if text.isprintable() else repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
