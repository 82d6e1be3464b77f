"""Names from outside that become paths, and folders written whole or not at all.

Three rules hold for everything ruvllm writes (model folders, adapters, mixtures):

1. A name that comes from outside (an adapter's or expert's name, a file a config lists) becomes a
   path only when it is one plain folder or file name: no separator, not `.` or `..`, not absolute.
2. An output folder is written into a temporary folder beside it and renamed into place once complete,
   so an interruption leaves nothing half-written (and what a killed writer left is removed by the next
   one). It must not exist or be empty, unless `force`: then it is replaced, whole.
3. An output is never one of the command's inputs, nor a folder holding one (replacing it would delete
   the input), `force` or not.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from ..errors import InvalidArgumentError

MAX_NAME = 255  # bytes in one file name on the common file systems


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
    """Have `write` fill a temporary folder beside `out`, then move it into place (rules 2 and 3 above)."""
    out = check_output(out, force, inputs, option)
    parent = os.path.dirname(out) or "."
    os.makedirs(parent, exist_ok=True)
    with _writing(out):
        temporary = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.", dir=parent)
        try:
            write(temporary)
            _replace(temporary, out)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise


@contextmanager
def _writing(out: str) -> Iterator[None]:
    """Hold `.NAME.lock` beside `out` while it is written: a second writer of the same output is refused,
    and the temporary folders a killed writer left (`.NAME.*`: no one holds the lock) are removed first.
    Without file locks (Windows; Pyodide's file system has one process) neither happens."""
    try:
        import fcntl
    except ImportError:
        fcntl = None  # type: ignore[assignment]  # (the module, or None where it does not exist)
    if fcntl is None or sys.platform == "emscripten":
        yield
        return
    parent, name = os.path.dirname(out) or ".", os.path.basename(out)
    lock_path = os.path.join(parent, f".{name}.lock")
    lock = open(lock_path, "a+b")  # held open for the whole write
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise InvalidArgumentError(f"{out} is being written by another process (it holds {lock_path})") from None
    try:
        # what a killed writer left: mkdtemp's .NAME.XXXXXXXX and .NAME.old.XXXXXXXX (8 of its characters)
        ours = re.compile(re.escape(f".{name}.") + r"(old\.)?[a-z0-9_]{8}")
        for entry in os.listdir(parent):
            stale = os.path.join(parent, entry)
            if ours.fullmatch(entry) and os.path.isdir(stale) and not os.path.islink(stale):
                shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        try:
            os.unlink(lock_path)  # (before the lock goes, so no one takes a lock on a file about to vanish)
        except OSError:
            pass
        lock.close()


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


def _replace(new: str, out: str) -> None:
    """Move the folder `new` to `out`, replacing whatever is there; `out` is never half-written."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(new, 0o777 & ~mask)  # mkdtemp makes it private; a model folder is not a secret
    if not os.path.lexists(out):
        os.rename(new, out)
        return
    old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old.", dir=os.path.dirname(out) or ".")
    os.rmdir(old)
    os.rename(out, old)
    os.rename(new, out)
    if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old)
    else:
        os.remove(old)
