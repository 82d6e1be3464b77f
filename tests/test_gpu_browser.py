"""`device` in the browser: the npm package's browser build in Debian's Chromium on WebGPU, driven by
Playwright. Without a GPU, Chromium's `--enable-unsafe-webgpu` gives a SwiftShader adapter: right answers,
never a speed (and `device: 'auto'` does not take it; 'webgpu' does).

- SmolLM2: with device 'webgpu' the plan runs on the GPU after its check passed (info.device names the
  adapter and gives the figures), and the greedy tokens of held-out-style prompts (read back alone: the
  plan's pick) equal the CPU plan's in the same page, or part only at a near-tie (the CPU's top-2 margin,
  printed); a generation aborted on the GPU, then another.
- Tiny random models of three families the same way (token-id prompts; the CPU plan is checked against
  the NumPy forward in tests/test_plan.py, the GPU's shaders against it for every family and weight form
  in tests/test_plan_gpu.py).
- The demo page: 'Run on: Auto' stays on the CPU (the software adapter refused, the details say so), and
  choosing the GPU loads the model there, the details naming the adapter and the check's figures.

Needs a local Pyodide distribution (as tests/test_e2e.py) and the browser bundle (npm/browser).
"""

from __future__ import annotations

import json

import pytest

from e2e_support import CHROMIUM, PYODIDE_MARKS, ROOT, demo_server, serve, url_of

from conftest import byte_tokenizer_json, tiny_model

BUILT = (ROOT / "npm" / "browser" / "worker" / "gpu-worker.js").exists()
pytestmark = [
    *PYODIDE_MARKS,
    pytest.mark.skipif(not BUILT, reason="the browser bundle is not built (./build.sh npm)"),
]
NEAR_TIE = 0.05  # the largest top-2 logprob gap at which the GPU and the CPU may pick differently
# biases; q/k norms; Gemma's sandwich norms, GELU, sliding windows and two RoPE bases (all six families, in
# each weight form, run on the GPU against the NumPy forward in tests/test_plan_gpu.py, through Dawn)
FAMILIES = ["qwen2", "qwen3", "gemma3"]

# Loads `model` on each device in turn and runs greedy generations of `prompts` (text or token ids): their
# token ids, as the sampler takes them (on the GPU: read back alone, the plan's pick), with the GPU's bytes
# read back and plan calls meanwhile; on the CPU also the same completions' top-2 logprobs (the margins of
# a near-tie). Answers {device: {info, answers: [{ids, top}], picks}}; `abort`: also a
# generation aborted after two chunks, then a short one.
RUN = """async ({ model, devices, prompts, tokens, abort }) => {
    const { RuvLLM } = await import('/npm/browser/index.js');
    const out = {};
    for (const device of devices) {
        const llm = await RuvLLM.load({ model, pyodide: { indexURL: '/pyodide/' }, cache: false, threads: 1, device });
        const answers = [];
        const before = device === 'cpu' ? null : await llm.deviceStats();
        for (const prompt of prompts) {
            const ids = [];
            const chunks = llm.generate(prompt, { maxTokens: tokens, temperature: 0 });
            for await (const chunk of chunks) ids.push(chunk.tokenId);
            answers.push({ ids });
        }
        const after = device === 'cpu' ? null : await llm.deviceStats();
        for (const [i, prompt] of device === 'cpu' ? prompts.entries() : []) {
            const answer = await llm.completions.create({ prompt, max_tokens: tokens, temperature: 0, logprobs: 2 });
            answers[i].top = answer.choices[0].logprobs.top_logprobs.map((t) => Object.values(t).sort((a, b) => b - a));
        }
        let aborted = null;
        if (abort) {
            const controller = new AbortController();
            let chunks = 0;
            try {
                for await (const chunk of llm.generate('Count to ten:', { maxTokens: 40, signal: controller.signal })) {
                    if (++chunks === 2) controller.abort();
                }
            } catch (error) {
                aborted = error.name;
            }
            let after = '';
            const more = llm.generate('Count to ten:', { maxTokens: 3, temperature: 0 });
            for await (const chunk of more) after += chunk.text;
            aborted = { error: aborted, after };
        }
        const picks = before && { calls: after.calls - before.calls, readBytes: after.readBytes - before.readBytes };
        out[device] = { info: { device: llm.info.device, decodePlan: llm.info.decodePlan }, answers, aborted, picks };
        await llm.dispose();
    }
    return out;
}"""


@pytest.fixture(scope="module")
def gpu_page():
    """A page of Chromium with WebGPU on SwiftShader (web/serve.py's flags and --enable-unsafe-webgpu)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[*serve.CHROMIUM_ARGS, "--enable-unsafe-webgpu"])
        yield browser.new_page()
        browser.close()


def assert_same_tokens(got: list[dict], want: list[dict], what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        parted = next((k for k, x in enumerate(w["ids"]) if k >= len(g["ids"]) or g["ids"][k] != x), None)
        if parted is None:
            assert len(g["ids"]) == len(w["ids"]), f"{what}, prompt {i}"
            continue
        margin = w["top"][parted][0] - w["top"][parted][1]
        print(f"{what}, prompt {i}: the GPU and the CPU part at token {parted}, top-2 margin {margin:.4f}")
        assert margin < NEAR_TIE, f"{what}, prompt {i}: parts at token {parted} with a top-2 margin of {margin}"


def assert_picked(report: dict) -> None:
    """Greedy generations on the GPU read back one pick a call (12 bytes: plan.py TopLogits), or nothing
    (a prompt's chunks before its last)."""
    picks = report["picks"]
    assert picks["calls"] > 0 and picks["readBytes"] <= 12 * picks["calls"], picks


def assert_on_gpu(report: dict, rows: int) -> None:
    device = report["info"]["device"]
    assert device["path"] == "webgpu" and device["reason"] is None, device
    assert "swiftshader" in device["adapter"]["architecture"].lower(), device["adapter"]
    check = device["check"]
    assert check["passed"] and check["rows"] == rows and check["relative"] < check["bound"], check
    assert report["info"]["decodePlan"] is True


def test_smollm2_on_webgpu_gives_the_cpu_plans_greedy_tokens(gpu_page, smollm2_dir):
    """And a generation aborted on the GPU, then another."""
    prompts = ["The three primary colors are", "Water boils at"]
    with demo_server() as httpd:
        gpu_page.goto(url_of(httpd) + "npm/README.md")
        args = {"devices": ["webgpu", "cpu"], "prompts": prompts, "tokens": 12, "abort": True}
        got = gpu_page.evaluate(RUN, {"model": "/models/smollm2-135m-instruct/", **args})
    assert_on_gpu(got["webgpu"], 8)
    print("the check:", json.dumps(got["webgpu"]["info"]["device"]["check"]))
    assert got["cpu"]["info"]["device"]["path"] == "cpu"
    assert_picked(got["webgpu"])
    assert_same_tokens(got["webgpu"]["answers"], got["cpu"]["answers"], "SmolLM2")
    assert got["webgpu"]["aborted"]["error"] == "AbortError"
    assert got["webgpu"]["aborted"]["after"], "nothing was generated after the abort"


def test_every_familys_tiny_model_on_webgpu_gives_the_cpu_plans_tokens(gpu_page, tmp_path):
    for kind in FAMILIES:
        folder = tmp_path / kind
        tiny_model(kind, folder)
        (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
    with demo_server() as httpd:
        httpd.mounts = {"/tiny/": tmp_path, **httpd.mounts}
        gpu_page.goto(url_of(httpd) + "npm/README.md")
        for kind in FAMILIES:
            args = {"devices": ["webgpu", "cpu"], "prompts": [[5, 17, 33, 9, 60]], "tokens": 8, "abort": False}
            got = gpu_page.evaluate(RUN, {"model": f"/tiny/{kind}/", **args})
            assert_on_gpu(got["webgpu"], 8)
            assert_picked(got["webgpu"])
            assert_same_tokens(got["webgpu"]["answers"], got["cpu"]["answers"], kind)


def test_the_demo_page_says_which_device_runs_and_switches(gpu_page, smollm2_dir):
    """The page's first load ('Run on: Auto') stays on the CPU, whose details line says why (the software
    adapter); choosing the GPU loads the model again on it, and the details say which adapter, with the
    check's figures; the answer comes from the GPU then."""
    with demo_server() as httpd:
        gpu_page.goto(url_of(httpd))
        ready = '[data-testid=status][data-state="ready"]'
        gpu_page.wait_for_selector(ready, timeout=300_000)
        details = gpu_page.text_content("[data-testid=details]")
        assert "Device: CPU (the only WebGPU adapter is a software one (swiftshader)" in details, details
        gpu_page.select_option("[data-testid=device-select]", "webgpu")
        gpu_page.wait_for_function(
            "document.querySelector('[data-testid=details]').textContent.includes('Device: GPU')", timeout=300_000
        )
        gpu_page.wait_for_selector(ready, timeout=300_000)
        details = gpu_page.text_content("[data-testid=details]")
        assert "Device: GPU through WebGPU (google swiftshader" in details, details
        assert "checked against the CPU's at load" in details, details
        gpu_page.fill("[data-testid=temperature]", "0")
        gpu_page.fill("[data-testid=max-tokens]", "4")
        gpu_page.fill("[data-testid=prompt]", "What is the capital of France?")
        gpu_page.click("[data-testid=send]")
        gpu_page.wait_for_selector(ready, timeout=300_000)
        gpu_page.wait_for_function(
            "document.querySelector('[data-testid=output]')?.textContent.length > 0", timeout=300_000
        )
