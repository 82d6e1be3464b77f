"""Refuse a kernel build that could write into CPython's heap when it is instantiated on Pyodide's memory.

    python kernels/check.py OBJECT.o MODULE.wasm [--shared]

The module shares Pyodide's WebAssembly.Memory, so it must bring nothing of its own into it:
- no data section (an instance copies its data segments into memory at instantiation), in the object
  and in the linked module;
- no stack in linear memory: clang's code reaches its stack through the global `__stack_pointer`, which
  an object file imports as soon as one function needs a stack frame (the linker then points it at
  address 66560, inside CPython's heap). So the object must import no global at all;
- the linked module imports exactly one thing, the memory `env.memory`: unshared, or with --shared (the
  build for the kernel thread pool, npm/src/worker/pool.js) shared.

Only the section headers and the import section are read (the WebAssembly binary format, section 5.5).
"""

from __future__ import annotations

import sys

DATA, DATACOUNT, IMPORT = 11, 12, 2
KINDS = {0: "function", 1: "table", 2: "memory", -2: "shared memory", 3: "global", 4: "tag"}


def leb(data: bytes, at: int) -> tuple[int, int]:
    """An unsigned LEB128 number and the offset after it."""
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def sections(data: bytes) -> list[tuple[int, bytes]]:
    if data[:4] != b"\0asm":
        raise ValueError("not a WebAssembly binary")
    found, at = [], 8
    while at < len(data):
        sid = data[at]
        size, at = leb(data, at + 1)
        found.append((sid, data[at : at + size]))
        at += size
    return found


def imports(section: bytes) -> list[tuple[str, str, str]]:
    """(module, name, kind) of every import; a memory's kind says whether it is shared ("shared memory")."""
    count, at = leb(section, 0)
    out = []
    for _ in range(count):
        names = []
        for _ in range(2):
            n, at = leb(section, at)
            names.append(section[at : at + n].decode())
            at += n
        kind = section[at]
        at += 1
        if kind == 0:  # function: type index
            _, at = leb(section, at)
        elif kind == 1:  # table: reftype, limits
            at += 1
            flags, at = leb(section, at + 0)
            _, at = leb(section, at)
            if flags & 1:
                _, at = leb(section, at)
        elif kind == 2:  # memory: limits (flag 1: a maximum follows; flag 2: shared)
            flags, at = leb(section, at)
            if flags & 2:
                kind = -2
            _, at = leb(section, at)
            if flags & 1:
                _, at = leb(section, at)
        elif kind == 3:  # global: valtype, mutability
            at += 2
        else:
            raise ValueError(f"unexpected import kind {kind}")
        out.append((names[0], names[1], KINDS.get(kind, str(kind))))
    return out


def problems(obj: bytes, module: bytes, shared: bool = False) -> list[str]:
    found = []
    for what, data in (("object", obj), ("module", module)):
        ids = {sid for sid, _ in sections(data)}
        if ids & {DATA, DATACOUNT}:
            found.append(f"the {what} has a data section (constant tables or strings): compute them in code")
    obj_imports = [i for sid, body in sections(obj) if sid == IMPORT for i in imports(body)]
    for module_name, name, kind in obj_imports:
        if kind == "global":
            found.append(
                f"the object imports the global {module_name}.{name}: some function keeps locals in linear "
                "memory (an array, or a local whose address is taken); keep every local in registers"
            )
    mod_imports = [i for sid, body in sections(module) if sid == IMPORT for i in imports(body)]
    memory = ("env", "memory", "shared memory" if shared else "memory")
    if mod_imports != [memory]:
        found.append(f"the module must import only env.memory ({memory[2]}), it imports {mod_imports}")
    return found


def main() -> None:
    args = sys.argv[1:]
    shared = "--shared" in args
    if shared:
        args.remove("--shared")
    if len(args) != 2:
        sys.exit(__doc__)
    with open(args[0], "rb") as f, open(args[1], "rb") as g:
        found = problems(f.read(), g.read(), shared)
    if found:
        sys.exit("kernels/check.py: " + "\n  ".join(["refusing the build:", *found]))


if __name__ == "__main__":
    main()
