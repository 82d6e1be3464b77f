// The demo chat page: loads a model with @ruvector/ruvllm (its browser build) and streams answers.
// The server (web/serve.py) answers /config.json with the models it serves (the picker lists them, and
// takes any other URL or hub name) and, when it has one, a local Pyodide distribution; `?model=URL` in
// the page address picks the model to load first.
import { RuvLLM } from '/npm/browser/index.js';

import { renderMarkdown } from './markdown.js';
import { zipFiles } from './zip.js';

const $ = (id) => document.getElementById(id);
const ui = {
  status: $('status'),
  modelName: $('model-name'),
  loading: $('loading'),
  progressLabel: $('progress-label'),
  progress: $('progress'),
  progressText: $('progress-text'),
  loadFailed: $('load-failed'),
  picker: $('picker'),
  modelSelect: $('model-select'),
  modelUrl: $('model-url'),
  plan: $('plan'),
  retry: $('retry'),
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
  useAdapter: $('use-adapter'),
  learning: $('learning'),
  learningText: $('learning-text'),
  cancelLearning: $('cancel-learning'),
  download: $('download-adapter'),
};

const ADAPTER = 'feedback';
// The library's default adapter (measured: benchmarks/RESULTS.md), under the page's own name.
const ADAPTER_CONFIG = { name: ADAPTER };
let adapterReady = false;

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
  // Learning never locks the page: it runs in the worker's idle time, and a new message goes first.
  const loaded = llm !== null && state !== 'loading';
  for (const button of document.querySelectorAll('button.learn, button.regenerate')) button.disabled = !loaded;
  ui.useAdapter.disabled = !loaded || !adapterReady;
  ui.download.disabled = !loaded || !adapterReady;
}

const MiB = 2 ** 20;
const mib = (bytes) => (bytes / MiB).toFixed(1);

/** The loading step in the progress block: what runs, how far (a percentage, or null: no measure), details. */
function showStep(phase, label, percent, details) {
  ui.loading.hidden = false;
  ui.loading.dataset.phase = phase;
  ui.progressLabel.textContent = label;
  if (percent === null)
    ui.progress.removeAttribute('value'); // an indeterminate bar
  else ui.progress.value = percent;
  ui.progressText.textContent = details;
  setStatus('loading', label);
}

/** RuvLLM.load's onProgress: one phase after the other, each shown as what it is. */
function showProgress(p) {
  if (p.phase === 'runtime') {
    showStep('runtime', 'Starting Python…', null, 'Pyodide and NumPy, in a worker: 10–20 s the first time');
  } else if (p.phase === 'plan') {
    showStep('plan', 'Planning memory…', null, `${p.plan.compute} compute, ${mib(p.plan.totalBytes)} MiB in memory`);
    const { compute, weightBytes, kvBytes, workspaceBytes, totalBytes } = p.plan;
    ui.plan.textContent =
      `Memory plan: ${compute} weights ${mib(weightBytes)} MiB + KV cache ${mib(kvBytes)} MiB + ` +
      `workspace ${mib(workspaceBytes)} MiB = ${mib(totalBytes)} MiB`;
  } else if (p.phase === 'download') {
    const percent = p.total ? (100 * p.loaded) / p.total : 0;
    const label = p.fromCache ? 'Reading the weights from the browser cache' : 'Downloading the weights';
    showStep('download', label, percent, `${mib(p.loaded)} / ${mib(p.total)} MiB (${percent.toFixed(0)}%)`);
  } else if (p.phase === 'load') {
    showStep('load', 'Preparing the weights…', null, `${mib(p.total)} MiB downloaded`);
  }
}

/** A message a visitor can act on, from any error. */
function describe(error, during) {
  const message = error?.message ?? String(error);
  if (
    /out of memory|Out of memory|Cannot enlarge memory|memory access out of bounds/i.test(message) ||
    error instanceof RangeError
  ) {
    return `Out of memory: this model needs more memory than this tab can have. Close other tabs or pick a smaller model. (${message})`;
  }
  if (error?.type === 'download') return `Could not download the model: ${message}`;
  if (error?.type === 'load') return `Could not load the model: ${message}`;
  if (error?.type === 'context_full')
    return `The conversation no longer fits the model's context: ${message}. Clear the chat to start over.`;
  if (error?.type === 'invalid_argument') return `Invalid setting: ${message}`;
  return `Something went wrong ${during}: ${message}`;
}

/**
 * Run `update`, which may make the conversation taller, and keep its end in view if it was in view:
 * a visitor who scrolled up to read stays where they are.
 */
function keepingBottom(update) {
  const list = ui.messages;
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 32;
  update();
  if (atBottom) list.scrollTop = list.scrollHeight;
}

/** A new message of `role`; returns its text element. The visitor's text shows as typed. */
function addMessage(role, text) {
  const item = document.createElement('li');
  item.className = role;
  const label = document.createElement('span');
  label.className = 'role';
  label.textContent = role === 'user' ? 'You' : role === 'assistant' ? 'Model' : regeneratedLabel();
  const body = document.createElement('div');
  body.className = 'text';
  body.textContent = text;
  item.append(label, body);
  ui.messages.append(item);
  ui.messages.scrollTop = ui.messages.scrollHeight; // a new message always comes into view
  return body;
}

/** The answer so far, rendered from Markdown; the raw text stays in data-raw (what Copy copies). */
function showAnswer(output, reply) {
  keepingBottom(() => {
    output.dataset.raw = reply;
    output.replaceChildren(renderMarkdown(reply));
  });
}

function markStopped(output) {
  const marker = document.createElement('p');
  marker.className = 'stopped';
  marker.dataset.testid = 'stopped';
  marker.textContent = '(stopped)';
  keepingBottom(() => output.after(marker));
}

function showStats(stats) {
  ui.stats.textContent = `TTFT ${(stats.ttftMs / 1000).toFixed(2)} s · ${stats.decodeTokS.toFixed(1)} tok/s · ${stats.completionTokens} tokens (prompt ${stats.promptTokens})`;
}

async function send() {
  const text = ui.prompt.value.trim();
  if (!text || !llm || running) return;
  ui.prompt.value = '';
  const turns = history; // "Clear chat" during the answer starts a new history; this answer stays out of it
  turns.push({ role: 'user', content: text });
  addMessage('user', text);
  const system = ui.system.value.trim();
  const messages = system ? [{ role: 'system', content: system }, ...turns] : [...turns];
  const reply = await answer(messages, 'assistant');
  if (reply) turns.push({ role: 'assistant', content: reply });
  else turns.pop(); // no answer at all: the model does not see this message again
  ui.prompt.focus();
}

/**
 * Stream the model's answer to `messages` into a new message of class `role` ('assistant', or
 * 'assistant regenerated': the same question asked again after learning, beside the first answer);
 * returns the reply ('' when there was none).
 */
async function answer(messages, role) {
  document.querySelector('[data-testid="output"]')?.removeAttribute('data-testid');
  const output = addMessage(role, '');
  output.dataset.testid = 'output';
  output.dataset.raw = '';
  const options = { temperature: Number(ui.temperature.value), maxTokens: Number(ui.maxTokens.value) };
  if (adapterReady) options.adapter = ui.useAdapter.checked ? ADAPTER : null;
  running = new AbortController();
  setStatus('generating', 'Generating…');
  ui.messages.setAttribute('aria-busy', 'true'); // screen readers: read the answer once it is complete
  let reply = '';
  try {
    for await (const chunk of llm.chat(messages, { ...options, signal: running.signal })) {
      if (chunk.text) {
        reply += chunk.text;
        showAnswer(output, reply);
      }
      showStats(chunk.stats);
    }
    setStatus('ready', 'Ready');
  } catch (error) {
    if (error.name === 'AbortError') {
      markStopped(output);
      setStatus('ready', 'Stopped');
    } else {
      setStatus('error', describe(error, 'while generating'));
    }
  } finally {
    running = null;
    ui.messages.setAttribute('aria-busy', 'false');
    if (reply) keepingBottom(() => addActions(output.parentElement, messages, reply));
  }
  return reply;
}

/**
 * Under an answer: Copy (its raw text); Good / Bad, which teach the adapter that this reply to these
 * messages was good or bad; Regenerate, which asks the same question again (after learning: the
 * difference shows), the new answer beside this one.
 */
function addActions(item, messages, reply) {
  const row = document.createElement('div');
  row.className = 'actions';
  row.append(copyButton(reply));
  const again = actionButton(
    'regenerate',
    'Regenerate',
    'regenerate',
    'Ask the same question again (after learning, the difference shows)',
  );
  again.addEventListener('click', () => {
    if (!running) answer(messages, 'assistant regenerated');
  });
  for (const [label, reward, testid] of [
    ['Good', 1, 'thumbs-up'],
    ['Bad', -1, 'thumbs-down'],
  ]) {
    const aria = reward > 0 ? 'Good answer: learn from it' : 'Bad answer: learn to avoid it';
    const button = actionButton('learn', label, testid, aria);
    button.setAttribute('aria-pressed', 'false');
    button.addEventListener('click', () => learn(messages, reply, reward, button));
    row.append(button);
  }
  row.append(again);
  item.append(row);
}

/** A button of an answer's row of actions. */
function actionButton(className, text, testid, ariaLabel) {
  const button = document.createElement('button');
  button.type = 'button';
  button.className = className;
  button.textContent = text;
  button.dataset.testid = testid;
  button.setAttribute('aria-label', ariaLabel);
  return button;
}

function copyButton(text) {
  const button = actionButton('copy', 'Copy', 'copy', 'Copy this answer');
  button.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = 'Copied';
    } catch (error) {
      button.textContent = 'Copy failed';
      button.title = error?.message ?? String(error);
    }
    setTimeout(() => (button.textContent = 'Copy'), 2000);
  });
  return button;
}

/**
 * Lessons under way, oldest first: { kind, started (performance.now()), progress (the last one, or null),
 * controller (Cancel aborts them all), cancelled (Cancel was pressed) }. The panel shows the oldest.
 */
const lessons = new Set();
let learnedSteps = 0; // optimizer steps of the lessons finished (or cancelled) so far
let ticking = null; // the timer that keeps the elapsed time current
const adapters = new WeakMap(); // per loaded model: the promise of its feedback adapter (made once)

/**
 * Teach the adapter that `reply` to `messages` was good (reward 1) or bad (-1). The first step lands at
 * once; the rest runs in the worker's idle time, so the page stays usable: a new message goes first and
 * learning resumes after it. The panel says what the lesson is doing and for how long, and offers Cancel.
 */
async function learn(messages, reply, reward, button) {
  const lesson = { kind: reward > 0 ? 'good' : 'bad', started: performance.now(), progress: null };
  lesson.controller = new AbortController();
  lesson.cancelled = false;
  lessons.add(lesson);
  button.setAttribute('aria-pressed', 'true');
  showLessons();
  try {
    if (!adapters.has(llm)) adapters.set(llm, llm.newAdapter(ADAPTER_CONFIG)); // once, however fast the clicks
    await adapters.get(llm);
    adapterReady = true;
    ui.useAdapter.checked = true;
    setStatus(ui.status.dataset.state, ui.status.textContent); // the adapter's controls are usable now
    const onProgress = (p) => {
      lesson.progress = p;
      showLessons();
    };
    const report = await llm.adapt(
      { messages, completion: reply, reward, adapter: ADAPTER },
      { signal: lesson.controller.signal, onProgress },
    );
    learnedSteps += report.steps;
    ui.learningText.textContent = reportText(lesson.kind, report);
  } catch (error) {
    if (error.name === 'AbortError' && lesson.cancelled) {
      learnedSteps += lesson.progress?.step ?? 0;
      ui.learningText.textContent = 'Learning cancelled (the steps taken are kept).';
    } else if (/^learning stopped: /.test(error.message ?? ''))
      ui.learningText.textContent = `Learning stopped: ${error.message.slice('learning stopped: '.length)}.`;
    else setStatus('error', describe(error, 'while learning'));
  } finally {
    lessons.delete(lesson);
    if (lessons.size) showLessons();
    else {
      clearInterval(ticking);
      ticking = null;
      ui.learning.dataset.state = 'idle';
      ui.cancelLearning.hidden = true;
    }
  }
}

const seconds = (ms) => `${(ms / 1000).toFixed(1)} s`;

/** What a lesson under way is doing (LearningProgress), and for how long: `elapsedMs` since it was given. */
function lessonText({ kind, progress: p }, elapsedMs) {
  const doing = `Learning from a ${kind} answer`;
  const time = seconds(elapsedMs);
  if (p === null) return `${doing}: starting · ${time}`;
  if (p.phase === 'waiting')
    return `${doing}: waiting for ${p.ahead} earlier lesson${p.ahead === 1 ? '' : 's'} · ${time}`;
  if (p.phase === 'preparing')
    return `${doing}: preparing (projection bases ${p.prepared.done}/${p.prepared.total}), step ${p.step}/${p.steps} taken · ${time}`;
  if (p.outcome === 'already')
    return `Nothing to learn from this ${kind} answer: the model already gives it (greedy decoding); checking earlier lessons · ${time}`;
  if (p.phase === 'rehearsing')
    return `${doing}: rehearsing after step ${p.step}/${p.steps} (checking that the lessons so far hold; ${p.rehearsed} rehearsal steps) · ${time}`;
  if (p.phase === 'done') return `${doing}: done after step ${p.step}/${p.steps} · ${time}`; // (its report follows)
  return `${doing}: learning, step ${p.step}/${p.steps} · ${time}`;
}

/** A finished lesson's report (AdaptReport), in words. */
function reportText(kind, report) {
  const before = report.logProbBefore.toFixed(2);
  if (report.outcome === 'already')
    return `Nothing to learn (${kind} answer): the model already gives this answer (greedy decoding); log-probability ${before}, checked in ${seconds(report.wallMs)}.`;
  const after = report.logProbAfter.toFixed(2);
  return `Learned (${kind} answer): log-probability of that answer ${before} → ${after} in ${report.steps} steps, ${seconds(report.wallMs)}. Regenerate shows the difference.`;
}

/** The oldest lesson under way in the panel, with the time since it was given (kept current). */
function showLessons() {
  const [oldest] = lessons;
  if (!oldest) return;
  const more = lessons.size > 1 ? ` (${lessons.size - 1} more waiting)` : '';
  ui.learning.dataset.state = 'learning';
  ui.learningText.textContent = lessonText(oldest, performance.now() - oldest.started) + more;
  ui.cancelLearning.hidden = false;
  ticking ??= setInterval(showLessons, 1000);
}

/** The label of an answer asked again: after learning only when no lesson is under way. */
function regeneratedLabel() {
  const [oldest] = lessons;
  const p = oldest?.progress;
  if (oldest) return `Model, asked again while learning${p ? ` (step ${p.step}/${p.steps} so far)` : ''}`;
  return learnedSteps ? 'Model, asked again after learning' : 'Model, asked again';
}

ui.cancelLearning.addEventListener('click', () => {
  for (const lesson of lessons) {
    lesson.cancelled = true;
    lesson.controller.abort();
  }
});

ui.download.addEventListener('click', async () => {
  let files;
  try {
    files = await llm.saveAdapter(ADAPTER);
  } catch (error) {
    setStatus('error', describe(error, 'while saving the adapter'));
    return;
  }
  const link = document.createElement('a');
  link.href = URL.createObjectURL(zipFiles(files));
  link.download = 'ruvllm-adapter.zip';
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
});

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

/** Load the model; on failure say why and offer Retry, which calls this again. */
async function loadModel(model, pyodide) {
  ui.loadFailed.hidden = true;
  ui.plan.textContent = '';
  ui.modelName.textContent = model;
  showStep('files', 'Reading the model configuration…', null, '');
  try {
    const started = performance.now();
    llm = await RuvLLM.load({ model, pyodide, onProgress: showProgress });
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    const cached = llm.info.fromCache ? ', weights from the browser cache' : '';
    const kernels = llm.info.kernels === 'wasm' ? 'WebAssembly SIMD kernels' : 'NumPy kernels';
    const compute = `${llm.info.plan.compute} weights, ${kernels}`;
    ui.loading.hidden = true;
    setStatus('ready', `Ready (${mib(llm.info.downloadedBytes)} MiB loaded in ${seconds} s${cached}; ${compute})`);
    if (llm.info.kernelsNote) console.info(`ruvllm: NumPy computes the products: ${llm.info.kernelsNote}`);
    if (llm.info.chatTemplate === 'built-in gemma') {
      ui.plan.textContent += ' — no chat template in the file: the built-in Gemma turn format is used';
    }
    ui.prompt.focus();
  } catch (error) {
    llm = null;
    ui.loading.hidden = true;
    setStatus('error', describe(error, 'while loading'));
    ui.loadFailed.hidden = false;
  }
}

const OTHER = '';

/** The picker: the models the server lists, then "Another model…" with a URL field. */
function fillPicker(models, current) {
  const options = models.map(({ name, url }) => new Option(name, url));
  options.push(new Option('Another model (URL or hf: name)…', OTHER));
  ui.modelSelect.replaceChildren(...options);
  const listed = models.some((m) => m.url === current);
  ui.modelSelect.value = listed ? current : OTHER;
  ui.modelUrl.value = listed ? '' : current;
  ui.modelUrl.hidden = listed;
}

function pickedModel() {
  return ui.modelSelect.value === OTHER ? ui.modelUrl.value.trim() : ui.modelSelect.value;
}

async function switchModel(model, pyodide) {
  if (!model) {
    ui.modelUrl.focus();
    return;
  }
  running?.abort();
  const previous = llm;
  llm = null;
  adapterReady = false;
  history = [];
  ui.messages.replaceChildren();
  ui.stats.textContent = '';
  await previous?.dispose();
  const url = new URL(location.href);
  url.searchParams.set('model', model);
  window.history.replaceState(null, '', url); // a reload loads the same model
  await loadModel(model, pyodide);
}

async function main() {
  let config = {};
  try {
    const response = await fetch('config.json');
    if (response.ok) config = await response.json();
  } catch {
    // No server config: the defaults below apply.
  }
  const models = config.models ?? [{ name: 'SmolLM2-135M-Instruct', url: '/models/smollm2-135m-instruct/' }];
  let model = new URLSearchParams(location.search).get('model') || config.model || models[0].url;
  const pyodide = config.pyodideIndexURL ? { indexURL: config.pyodideIndexURL } : undefined;
  fillPicker(models, model);
  ui.modelSelect.addEventListener('change', () => {
    ui.modelUrl.hidden = ui.modelSelect.value !== OTHER;
    if (!ui.modelUrl.hidden) ui.modelUrl.focus();
  });
  ui.picker.addEventListener('submit', (event) => {
    event.preventDefault();
    model = pickedModel();
    switchModel(model, pyodide);
  });
  ui.retry.addEventListener('click', () => loadModel(model, pyodide));
  await loadModel(model, pyodide);
}

main();
