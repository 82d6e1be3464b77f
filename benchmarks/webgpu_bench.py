"""WebGPU: the decode plan on whatever GPU adapter the browser offers, beside the CPU plan in the same
page, in one headless Chromium run: load time, prefill (a --prompt-length prompt) and decode (--gen-length
greedy tokens) speed, and per decoded token the GPU's plan calls, submits, dispatches, bytes read back and
bytes of weights read (each matrix once, in its quantized form), with the GPU memory held.

    .venv/bin/python benchmarks/webgpu_bench.py [--model /models/NAME/ | --gguf /gguf/NAME.gguf]
        [--prompt-length 128] [--gen-length 32] [--cpu-threads auto] [--gpu] [--chromium PATH] [--json OUT]

On a machine without a GPU, Chromium's --enable-unsafe-webgpu gives SwiftShader (a CPU running the
shaders): its times are not speeds, and the script says so; the per-token counts hold anywhere. On a
machine with a GPU, --gpu drops --disable-gpu and asks Chromium for Vulkan (Linux); the adapter row says
which GPU answered. Needs a local Pyodide distribution (docs/pyodide.md), the browser bundle (./build.sh
npm) and a Chromium (Debian's by default).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_bench import GGUF, MODEL, load_serve_module, prompt_text

MiB = 2**20
GPU_ARGS = ["--enable-unsafe-webgpu", "--enable-features=Vulkan", "--use-angle=vulkan", "--ignore-gpu-blocklist"]

# One device's run: load, a warm-up, a prompt with one token (prefill), the same prompt with gen tokens,
# the device's counters around each; answers the figures.
RUN = """async ({ model, device, threads, prompt, gen }) => {
    const { RuvLLM } = await import('/npm/browser/index.js');
    const t0 = performance.now();
    const llm = await RuvLLM.load({ model, pyodide: { indexURL: '/pyodide/' }, cache: false, device, threads });
    const loadMs = performance.now() - t0;
    const run = async (maxTokens) => {
        const before = await llm.deviceStats();
        const start = performance.now();
        let first = null, count = 0;
        for await (const chunk of llm.generate(prompt, { maxTokens, temperature: 0, ignoreEos: true })) {
            if (first === null) first = performance.now();
            count += 1;
        }
        const end = performance.now();
        const after = await llm.deviceStats();
        const delta = Object.fromEntries(Object.entries(after).filter(([k]) => k !== 'path' && k !== 'gpuBytes')
            .map(([k, v]) => [k, v - before[k]]));
        return { prefillMs: first - start, decodeMs: end - first, count, delta, gpuBytes: after.gpuBytes };
    };
    await run(2);
    const prefill = await run(1);
    const full = await run(gen);
    const { info } = llm;
    await llm.dispose();
    return { loadMs, prefill, full, device: info.device, weightBytes: info.weightBytes, promptTokens: null,
             heapBytes: info.heapBytes, threads: info.threads };
}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=f"a folder of models/ as served (default {MODEL})")
    parser.add_argument("--gguf", default=None, help=f"a GGUF of build/downloads as served (e.g. {GGUF})")
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--cpu-threads", default="auto")
    parser.add_argument("--gpu", action="store_true", help="a machine with a GPU: Chromium's GPU process on")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--page-timeout", type=int, default=1800, help="seconds a device's run may take")
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args()
    model = args.gguf or args.model or MODEL
    serve = load_serve_module()
    dist = serve.local_pyodide()
    if dist is None:
        raise SystemExit("no local Pyodide distribution: set RUVLLM_PYODIDE_DIST (docs/pyodide.md)")
    prompt = prompt_text(args.prompt_length)
    server = serve.DemoServer(0, dist)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/npm/README.md"
    flags = [a for a in serve.CHROMIUM_ARGS if not (args.gpu and a == "--disable-gpu")]
    flags += GPU_ARGS if args.gpu else ["--enable-unsafe-webgpu"]
    from playwright.sync_api import sync_playwright

    results = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=flags)
        for device, threads in (("webgpu", 1), ("cpu", args.cpu_threads)):
            page = browser.new_page()
            page.set_default_timeout(args.page_timeout * 1000)
            page.goto(url)
            threads = threads if threads == "auto" else int(threads)
            options = {"model": model, "device": device, "threads": threads, "prompt": prompt, "gen": args.gen_length}
            try:
                results[device] = page.evaluate(RUN, options)
            except Exception as error:  # (a device that fails is reported; the other still runs)
                results[device] = {"error": str(error).splitlines()[0]}
            page.close()
        browser.close()
    server.shutdown()
    report(model, args, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def report(model: str, args: argparse.Namespace, results: dict) -> None:
    gpu = results.get("webgpu", {})
    adapter = (gpu.get("device") or {}).get("adapter") or {}
    software = any(w in json.dumps(adapter).lower() for w in ("swiftshader", "llvmpipe", "lavapipe"))
    print(f"model {model}, prompt {args.prompt_length} tokens (SmolLM2's), {args.gen_length} greedy tokens")
    print(f"adapter: {adapter.get('vendor')} {adapter.get('architecture')} {adapter.get('description')}".rstrip())
    if software:
        print("SOFTWARE ADAPTER (SwiftShader): the GPU's times below are a CPU running shaders, not a GPU's speed")
    print(f"{'device':8s}{'path':8s}{'load s':>8s}{'prefill tok/s':>15s}{'decode tok/s':>14s}  note")
    for device, r in results.items():
        if "error" in r:
            print(f"{device:8s}{'-':8s}  failed: {r['error']}")
            continue
        full = r["full"]
        prefill = args.prompt_length / (r["prefill"]["prefillMs"] / 1000)
        decode = (full["count"] - 1) / (full["decodeMs"] / 1000) if full["count"] > 1 else float("nan")
        path = r["device"]["path"]
        note = r["device"]["reason"] or ""
        print(f"{device:8s}{path:8s}{r['loadMs'] / 1000:8.1f}{prefill:15.1f}{decode:14.2f}  {note}")
    if gpu.get("device", {}).get("path") == "webgpu":
        one, full = gpu["prefill"]["delta"], gpu["full"]["delta"]
        tokens = gpu["full"]["count"] - 1
        per = {k: (full[k] - one[k]) / tokens for k in full}
        check = gpu["device"]["check"]
        print(
            f"per decoded token on the GPU: {per['calls']:.2f} plan calls, {per['submits']:.2f} submits, "
            f"{per['dispatches']:.0f} dispatches, {per['readBytes']:.0f} bytes read back, "
            f"{per['weightBytes'] / MiB:.1f} MiB of weights read"
        )
        held, read = gpu["weightBytes"], per["weightBytes"]
        print(
            f"weights on the CPU (compute forms) {held / MiB:.0f} MiB; GPU memory held "
            f"{gpu['full']['gpuBytes'] / MiB:.0f} MiB; weights read a token / weights on the CPU {read / held:.3f}"
        )
        relative, bound, top1 = check["relative"], check["bound"], check["top1"]
        print(f"the check at load: relative difference {relative:.2g} (bound {bound}), top-1 agreement {top1}")
    heaps = {d: r["heapBytes"] / MiB for d, r in results.items() if "heapBytes" in r}
    if heaps:  # (the GPU's weights are copied from the CPU's a matrix at a time: no second copy in the heap)
        print("Pyodide's heap after load: " + ", ".join(f"{d} {mib:.0f} MiB" for d, mib in heaps.items()))


if __name__ == "__main__":
    main()
