// The demo chat page: loads a model with @ruvector/ruvllm (its browser build) and streams answers.
// The server (web/serve.py) answers /config.json with the default model and, when it has one, a local
// Pyodide distribution; `?model=URL` in the page address picks another model.
import { RuvLLM } from '/npm/browser/index.js';

const $ = (id) => document.getElementById(id);
const ui = {
  status: $('status'),
  modelName: $('model-name'),
  progress: $('progress'),
  progressText: $('progress-text'),
  messages: $('messages'),
  composer: $('composer'),
  prompt: $('prompt'),
  send: $('send'),
  stop: $('stop'),
  stats: $('stats'),
  temperature: $('temperature'),
  maxTokens: $('max-tokens'),
  system: $('system'),
  clear: $('clear'),
};

let llm = null;
let history = []; // [{ role, content }] of the conversation so far, without the system prompt
let running = null; // AbortController of the generation in progress

function setStatus(state, text) {
  ui.status.dataset.state = state;
  ui.status.textContent = text;
  const idle = state === 'ready' || (state === 'error' && llm !== null);
  ui.prompt.disabled = !idle;
  ui.send.disabled = !idle;
  ui.stop.disabled = state !== 'generating';
}

const MiB = 2 ** 20;

function showProgress(p) {
  if (p.phase === 'runtime') {
    setStatus('loading', 'Starting Python (Pyodide + NumPy)…');
  } else if (p.phase === 'download') {
    const percent = p.total ? (100 * p.loaded) / p.total : 0;
    ui.progress.value = percent;
    const source = p.fromCache ? ' from the browser cache' : '';
    ui.progressText.textContent = `${(p.loaded / MiB).toFixed(1)} / ${(p.total / MiB).toFixed(1)} MiB (${percent.toFixed(0)}%)${source}`;
    setStatus('loading', `Downloading the model${source}…`);
  } else if (p.phase === 'load') {
    ui.progress.value = 100;
    setStatus('loading', 'Preparing the weights…');
  }
}

/** A message a visitor can act on, from any error. */
function describe(error, during) {
  const message = error?.message ?? String(error);
  if (/out of memory|Out of memory|Cannot enlarge memory|memory access out of bounds/i.test(message) || error instanceof RangeError) {
    return `Out of memory: this model needs more memory than this tab can have. Close other tabs or pick a smaller model. (${message})`;
  }
  if (error?.type === 'download') return `Could not download the model: ${message}`;
  if (error?.type === 'load') return `Could not load the model: ${message}`;
  if (error?.type === 'context_full') return `The conversation no longer fits the model's context: ${message}. Clear the chat to start over.`;
  if (error?.type === 'invalid_argument') return `Invalid setting: ${message}`;
  return `Something went wrong ${during}: ${message}`;
}

function addMessage(role, text) {
  const item = document.createElement('li');
  item.className = role;
  const label = document.createElement('span');
  label.className = 'role';
  label.textContent = role === 'user' ? 'You' : 'Model';
  const body = document.createElement('span');
  body.className = 'text';
  body.textContent = text;
  item.append(label, body);
  ui.messages.append(item);
  return body;
}

function showStats(stats) {
  ui.stats.textContent = `TTFT ${(stats.ttftMs / 1000).toFixed(2)} s · ${stats.decodeTokS.toFixed(1)} tok/s · ${stats.completionTokens} tokens (prompt ${stats.promptTokens})`;
}

async function send() {
  const text = ui.prompt.value.trim();
  if (!text || !llm || running) return;
  ui.prompt.value = '';
  history.push({ role: 'user', content: text });
  addMessage('user', text);
  document.querySelector('[data-testid="output"]')?.removeAttribute('data-testid');
  const output = addMessage('assistant', '');
  output.dataset.testid = 'output';

  const system = ui.system.value.trim();
  const messages = system ? [{ role: 'system', content: system }, ...history] : [...history];
  const options = { temperature: Number(ui.temperature.value), maxTokens: Number(ui.maxTokens.value) };
  running = new AbortController();
  setStatus('generating', 'Generating…');
  let reply = '';
  try {
    for await (const chunk of llm.chat(messages, { ...options, signal: running.signal })) {
      reply += chunk.text;
      output.textContent = reply;
      showStats(chunk.stats);
    }
    setStatus('ready', 'Ready');
  } catch (error) {
    if (error.name === 'AbortError') setStatus('ready', 'Stopped');
    else setStatus('error', describe(error, 'while generating'));
  } finally {
    running = null;
    history.push({ role: 'assistant', content: reply });
    ui.prompt.focus();
  }
}

ui.composer.addEventListener('submit', (event) => {
  event.preventDefault();
  send();
});
ui.prompt.addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
ui.stop.addEventListener('click', () => running?.abort());
ui.clear.addEventListener('click', () => {
  running?.abort();
  history = [];
  ui.messages.replaceChildren();
  ui.stats.textContent = '';
  ui.prompt.focus();
});

async function main() {
  setStatus('loading', 'Starting…');
  let config = {};
  try {
    const response = await fetch('config.json');
    if (response.ok) config = await response.json();
  } catch {
    // No server config: the defaults below apply.
  }
  const model = new URLSearchParams(location.search).get('model') || config.model || '/models/smollm2-135m-instruct/';
  ui.modelName.textContent = model;
  const pyodide = config.pyodideIndexURL ? { indexURL: config.pyodideIndexURL } : undefined;
  try {
    const started = performance.now();
    llm = await RuvLLM.load({ model, pyodide, onProgress: showProgress });
    ui.progress.value = 100;
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const cached = llm.info.fromCache ? ', weights from the browser cache' : '';
    ui.progressText.textContent = `${(llm.info.downloadedBytes / MiB).toFixed(1)} MiB (100%)${cached}`;
    setStatus('ready', `Ready (loaded in ${seconds} s${cached})`);
    ui.prompt.focus();
  } catch (error) {
    llm = null;
    setStatus('error', describe(error, 'while loading'));
  }
}

main();
