"""A chat answer streamed into the page, from Python: what a PyScript user writes to use ruvllm.

?model=URL picks the GGUF (default: the demo's SmolLM2); ?q=TEXT the question; ?text=TEXT continues raw
text instead of chatting; ?arithmetic=exact|fast the kernels' arithmetic. When the answer is done,
window.__result holds it (the browser test reads it).
"""

import asyncio
import json

from pyscript import document, window

import ruvllm

params = window.URLSearchParams.new(window.location.search)
model_url = params.get("model") or "/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
question = params.get("q") or "What is the capital of France?"
raw_text = params.get("text") or None  # (None: chat; a missing parameter is JavaScript's null, not None)
options = {"arithmetic": str(params.get("arithmetic"))} if params.get("arithmetic") else {}
status, answer = document.getElementById("status"), document.getElementById("answer")
document.getElementById("question").textContent = raw_text or question


def progress(p: dict) -> None:
    status.textContent = f"Loading {p['file']}: {100 * p['loaded'] // p['total']}%"


try:
    model = await ruvllm.load_async(model_url, progress, **options)  # noqa: F704 (PyScript runs this at the top level)
    status.textContent = f"Answering with {model.name} ({model.engine.kernels} kernels)…"
    ids = []
    if raw_text is not None:
        chunks = model.generate(raw_text, temperature=0, max_tokens=24)
    else:
        chunks = model.chat([{"role": "user", "content": question}], temperature=0, max_tokens=48)
    for chunk in chunks:
        answer.textContent += chunk.text
        ids.append(chunk.token_id)
        await asyncio.sleep(0)  # noqa: F704 (let the page paint each piece)
    status.textContent = "Done."
    window.__result = json.dumps({"text": answer.textContent, "ids": ids, "kernels": model.engine.kernels})
except Exception as error:  # shown in the page (a RuvLLMError says what was wrong in one line)
    status.textContent = f"Error: {error}"
    window.__result = json.dumps({"error": str(error)})
