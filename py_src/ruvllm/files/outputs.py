"""Names from outside that become paths, and folders written whole or not at all.

Three rules hold for everything ruvllm writes (model folders, adapters, mixtures):

1. A name that comes from outside (an adapter's or expert's name, a file a config lists) becomes a
   path only when it is one plain folder or file name: no separator, not `.` or `..`, not absolute.
2. An output folder is written into a temporary folder beside it and renamed into place once complete,
   so an interruption leaves nothing half-written. What a killed writer left is removed by the next
   one: only what ruvllm can prove it made, never a file or folder for its name alone. The output must
   not exist or be empty, unless `force`: then it is replaced, whole.
3. An output is never one of the command's inputs, nor a folder holding one (replacing it would delete
   the input), `force` or not.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from ..errors import InvalidArgumentError

MAX_NAME = 255  # bytes in one file name on the common file systems
WORK_INFIX = ".ruvllm-"  # .NAME.ruvllm-XXXXXXXX: the work folder (mkdtemp's 8 characters after it)
WORK_MARK = ".ruvllm-work"  # the file inside a work folder that says it is ruvllm's
WORK_TEXT = "ruvllm writes an output here; the next write of the same output removes this folder if it is left\n"
LOCK_SUFFIX = ".ruvllm-lock"  # .NAME.ruvllm-lock: held while NAME is written
LOCK_TEXT = "ruvllm holds this file while it writes the folder beside it\n"


def plain_name(name: object, what: str) -> str:
    """`name` if it is one plain file or folder name; InvalidArgumentError naming `what` otherwise."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"{what} must be a non-empty string, got {name!r}")
    bad = (
        name in (".", "..")
        or any(c in name for c in "/\\\0")
        or os.path.isabs(name)
        or (len(name) >= 2 and name[1] == ":")  # a Windows drive: C:x
        or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME
    )
    if bad:
        raise InvalidArgumentError(
            f"{what} {name!r} is not a plain folder name (no '/', '\\', '..', drive or absolute path; "
            f"at most {MAX_NAME} bytes): it would be written outside its folder"
        )
    return name


def relative_file(path: str, what: str) -> str:
    """`path` ("a/b/file") if every part of it is a plain name, so it stays inside its folder."""
    for part in path.split("/"):
        plain_name(part, what)
    return path


def check_output(out: str, force: bool, inputs: Iterable[str | None] = (), option: str = "") -> str:
    """The normalized `out`, once it is known that writing it replaces no input and, unless `force`,
    nothing that exists. `inputs`: the paths the command reads (None and missing ones are skipped);
    `option`: how the user named `out` (a command's --out), for the messages."""
    if not isinstance(out, str) or not out.strip():
        raise InvalidArgumentError(f"{option or 'the output'} must name a folder, got {out!r}")
    out = os.path.normpath(out)
    named = f"{option} {out}" if option else out
    real_out = os.path.realpath(out)
    for path in inputs:
        if path is None or not os.path.exists(path):
            continue
        # the file it names, and the link itself when it is one (replacing the folder deletes the link)
        found = [
            os.path.realpath(path),
            os.path.join(os.path.realpath(os.path.dirname(path) or "."), os.path.basename(path)),
        ]
        holder = real_out.rstrip(os.sep) + os.sep
        if any(real == real_out or real.startswith(holder) for real in found):
            what = "is" if real_out in found else "holds"
            raise InvalidArgumentError(
                f"{named} {what} {path}, an input of this command: write to another folder "
                "(inputs are never replaced, --force or not)"
            )
    if os.path.lexists(out) and not force:
        if not os.path.isdir(out):
            raise InvalidArgumentError(f"{named} exists and is not a folder (--force replaces it)")
        if os.listdir(out):
            raise InvalidArgumentError(
                f"{named} is not empty: writing into it would mix old files with new ones (--force replaces it, whole)"
            )
    return out


def write_folder(
    out: str,
    force: bool,
    write: Callable[[str], None],
    inputs: Iterable[str | None] = (),
    option: str = "",
) -> None:
    """Have `write` fill a folder that becomes `out` once complete (rules 2 and 3 above).

    The work happens in a folder of ruvllm's beside `out`, `.NAME.ruvllm-XXXXXXXX`, marked as ruvllm's by
    the file `.ruvllm-work` inside it: the new output is written to its `new/`, the output it replaces (with
    `force`) is moved to its `old/`, and the folder is removed once `new/` is in place. A writer killed
    outright leaves it behind, and the next writer of `out` removes it: only a folder holding that marker,
    so nothing a user keeps beside `out` (whatever its name) is ever touched."""
    out = check_output(out, force, inputs, option)
    parent = os.path.dirname(out) or "."
    os.makedirs(parent, exist_ok=True)
    with _writing(out):
        work = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}{WORK_INFIX}", dir=parent)
        try:
            with open(os.path.join(work, WORK_MARK), "w", encoding="utf-8") as f:
                f.write(WORK_TEXT)
            new = os.path.join(work, "new")
            os.mkdir(new)
            write(new)
            _replace(new, out, os.path.join(work, "old"))
        finally:
            shutil.rmtree(work, ignore_errors=True)


@contextmanager
def _writing(out: str) -> Iterator[None]:
    """Hold `.NAME.ruvllm-lock` beside `out` while it is written: a second writer of the same output is
    refused, and the work folders a killed writer left (no one holds the lock) are removed first.

    The lock file is ruvllm's by its text: a file of that name that does not hold it is not ours, and
    the write is refused rather than touching it. Without file locks (Windows; Pyodide's file system has
    one process) neither the lock nor the clean-up happens."""
    try:
        import fcntl
    except ImportError:
        fcntl = None  # type: ignore[assignment]  # (the module, or None where it does not exist)
    if fcntl is None or sys.platform == "emscripten":
        yield
        return
    parent, name = os.path.dirname(out) or ".", os.path.basename(out)
    lock_path = os.path.join(parent, f".{name}{LOCK_SUFFIX}")
    fd = _take_lock(lock_path, out, fcntl)
    try:
        for entry in os.listdir(parent):
            if entry.startswith(f".{name}{WORK_INFIX}") and _is_work_folder(os.path.join(parent, entry)):
                shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
        yield
    finally:
        try:
            os.unlink(lock_path)  # (before the lock goes, so no one takes a lock on a file about to vanish)
        except OSError:
            pass
        os.close(fd)


def _take_lock(lock_path: str, out: str, fcntl) -> int:
    """An open, locked descriptor of ruvllm's lock file at `lock_path`, made if it is not there."""
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            fd = os.open(lock_path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, LOCK_TEXT.encode())
        except FileExistsError:
            try:
                fd = os.open(lock_path, flags)
            except FileNotFoundError:
                continue  # let go by its writer between the two opens: make it again
            except OSError:
                fd = -1
            if fd < 0 or os.pread(fd, len(LOCK_TEXT) + 1, 0) != LOCK_TEXT.encode():
                if fd >= 0:
                    os.close(fd)
                raise InvalidArgumentError(
                    f"{lock_path} is there and is not ruvllm's lock file, which ruvllm writes while it writes "
                    f"{out}: ruvllm leaves it alone; move it, or write to another folder"
                ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise InvalidArgumentError(f"{out} is being written by another process (it holds {lock_path})") from None
        try:
            here, there = os.fstat(fd), os.stat(lock_path, follow_symlinks=False)
            if (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the file its last writer removed as it let go of it: take the one there now


def _is_work_folder(path: str) -> bool:
    """Whether `path` is a work folder of ruvllm's: a real folder holding the marker file with its text."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    mark = os.path.join(path, WORK_MARK)
    try:
        if os.path.islink(mark) or os.path.getsize(mark) != len(WORK_TEXT.encode()):
            return False
        with open(mark, encoding="utf-8") as f:
            return f.read() == WORK_TEXT
    except (OSError, UnicodeDecodeError):
        return False


def write_files(
    out: str,
    files: dict[str, bytes],
    force: bool = False,
    inputs: Iterable[str | None] = (),
    option: str = "",
) -> None:
    """Write `files` ({relative path: bytes}, every part of each path a plain name) as the folder `out`."""
    for path in files:
        relative_file(path, "a file name")

    def write(folder: str) -> None:
        for path, data in files.items():
            target = os.path.join(folder, *path.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)

    write_folder(out, force, write, inputs, option)


def _replace(new: str, out: str, old: str) -> None:
    """Move the folder `new` to `out`, replacing whatever is there (moved to `old` first, inside the same
    work folder); `out` is never half-written, and a failed move puts what was there back."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(new, 0o777 & ~mask)  # mkdtemp makes it private; a model folder is not a secret
    if not os.path.lexists(out):
        os.rename(new, out)
        return
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
