// The demo page: loads a model with @ruvector/ruvllm (its browser build) and streams answers, as a chat
// or, for a base model, as a continuation of the visitor's text.
// The server (web/serve.py) answers /config.json with the models it serves (the picker lists them, each
// with its mode, and takes any other URL or hub name) and, when it has one, a local Pyodide
// distribution; `?model=URL` in the page address picks the model to load first.
//
// Loading another model checks its location first (model-check.js) and loads it beside the current one:
// the current model and its chat stay usable until the new one is ready, and a location that is wrong is
// said in words, in a second, without costing anything.
import { RuvLLM } from '/npm/browser/index.js';

import { renderMarkdown } from './markdown.js';
import { ModelCheckError, checkModel } from './model-check.js';
import { zipFiles } from './zip.js';

/**
 * The page's element `id` (index.html has each: a missing one is a bug of the page, said at once), of
 * the kind given (HTMLInputElement, ...), checked.
 * @template {HTMLElement} T
 * @param {string} id
 * @param {{ new (): T, name: string }} kind
 * @returns {T}
 */
const $ = (id, kind) => {
  const element = document.getElementById(id);
  if (!(element instanceof kind)) throw new Error(`the page has no ${kind.name} #${id}`);
  return element;
};

/**
 * The page's first element matching `selector`, of the kind given (checked, as $ checks).
 * @template {HTMLElement} T
 * @param {string} selector
 * @param {{ new (): T, name: string }} kind
 * @returns {T}
 */
function $first(selector, kind) {
  const element = document.querySelector(selector);
  if (!(element instanceof kind)) throw new Error(`the page has no ${kind.name} ${selector}`);
  return element;
}

/** The model in use: the controls that need one are disabled until one is loaded. */
function model() {
  if (llm === null) throw new Error('no model is loaded');
  return llm;
}

const ui = {
  status: $('status', HTMLElement),
  modelName: $('model-name', HTMLElement),
  loading: $('loading', HTMLElement),
  progressLabel: $('progress-label', HTMLElement),
  progress: $('progress', HTMLProgressElement),
  progressText: $('progress-text', HTMLElement),
  loadingNote: $('loading-note', HTMLElement),
  loadFailed: $('load-failed', HTMLElement),
  loadError: $('load-error', HTMLElement),
  picker: $('picker', HTMLFormElement),
  modelSelect: $('model-select', HTMLSelectElement),
  modelUrl: $('model-url', HTMLInputElement),
  plan: $('plan', HTMLElement),
  details: $('details-list', HTMLElement),
  retry: $('retry', HTMLButtonElement),
  modeHint: $('mode-hint', HTMLElement),
  welcome: $('welcome', HTMLElement),
  welcomeText: $('welcome-text', HTMLElement),
  examples: $('examples', HTMLElement),
  messages: $('messages', HTMLElement),
  composer: $('composer', HTMLFormElement),
  prompt: $('prompt', HTMLTextAreaElement),
  send: $('send', HTMLButtonElement),
  stop: $('stop', HTMLButtonElement),
  stats: $('stats', HTMLElement),
  temperature: $('temperature', HTMLInputElement),
  topP: $('top-p', HTMLInputElement),
  repetitionPenalty: $('repetition-penalty', HTMLInputElement),
  maxTokens: $('max-tokens', HTMLInputElement),
  system: $('system', HTMLTextAreaElement),
  clear: $('clear', HTMLButtonElement),
  useAdapter: $('use-adapter', HTMLInputElement),
  learning: $('learning', HTMLElement),
  learningText: $('learning-text', HTMLElement),
  cancelLearning: $('cancel-learning', HTMLButtonElement),
  download: $('download-adapter', HTMLButtonElement),
};

const ADAPTER = 'feedback';
// The library's default adapter (measured: benchmarks/RESULTS.md), under the page's own name.
const ADAPTER_CONFIG = { name: ADAPTER };
let adapterReady = false;

/** @type {import('/npm/browser/index.js').RuvLLM | null} */
let llm = null; // the model in use
/** @type {{ name: string, plan: string } | null} */
let current = null; // what it is: { name, plan (the plan line's text) }
let history = []; // [{ role, content }] of the conversation so far, without the system prompt
/** @type {AbortController | null} */
let running = null; // AbortController of the generation in progress
let answering = Promise.resolve(); // settles when the generation in progress has ended

/**
 * The two ways to use a model: a chat (its chat template turns the conversation into text) or a text
 * completion (the model continues the visitor's text as it is: what a base model does).
 */
const MODES = {
  chat: {
    hint: '',
    placeholder: 'Ask something…',
    welcome:
      'Ask the model anything. Models small enough for a tab are small (the default, SmolLM2, has 135 ' +
      'million parameters, about a thousandth of the large chat assistants): best at short texts and simple ' +
      'questions, and often wrong on facts. It runs in this tab: nothing you type is sent anywhere. Try one of these:',
    examples: [
      'Give me two tips for better sleep.',
      'Write a short poem about the sea.',
      'What is the capital of France?',
      'Explain what a rainbow is to a child.',
    ],
  },
  completion: {
    hint: 'The model continues your text (a base model answers questions poorly).',
    placeholder: 'The start of a text for the model to continue…',
    welcome:
      'This is a base model: it was not trained to chat. It continues the text you give it, ' +
      'so write the beginning of something. Try one of these:',
    examples: [
      'Once upon a time, in a small village by the sea,',
      'The capital of France is',
      'A recipe for pancakes:',
    ],
  },
};
let mode = 'chat';
// On touch screens Enter makes a new line and the Send button sends, as in chat apps.
const touchScreen = matchMedia('(pointer: coarse)');

/** Ready for the next message; not on a touch screen, where focus opens the on-screen keyboard over the answer. */
function focusPrompt() {
  if (!touchScreen.matches) ui.prompt.focus();
}

function setStatus(state, text) {
  ui.status.dataset.state = state;
  ui.status.textContent = text;
  const idle = state === 'ready' || (state === 'error' && llm !== null);
  ui.prompt.disabled = !idle;
  ui.send.disabled = !idle;
  ui.stop.disabled = state !== 'generating';
  // Learning never locks the page: it runs in the worker's idle time, and a new message goes first.
  const loaded = llm !== null && state !== 'loading';
  const buttons = /** @type {NodeListOf<HTMLButtonElement>} */ (
    document.querySelectorAll('button.learn, button.regenerate')
  );
  for (const button of buttons) button.disabled = !loaded;
  ui.useAdapter.disabled = !loaded || !adapterReady;
  ui.download.disabled = !loaded || !adapterReady;
}

const MiB = 2 ** 20;
const mib = (bytes) => (bytes / MiB).toFixed(1);
/** A size in plain words: whole MiB (one decimal below 10). */
const aboutMib = (bytes) => (bytes < 10 * MiB ? mib(bytes) : String(Math.round(bytes / MiB)));

/**
 * The loading step in the progress block: what runs, how far (a percentage, or null: no measure),
 * details. The status says it too while no model is in use (the first load).
 */
function showStep(phase, label, percent, details) {
  ui.loading.hidden = false;
  ui.loading.dataset.phase = phase;
  ui.progressLabel.textContent = label;
  if (percent === null)
    ui.progress.removeAttribute('value'); // an indeterminate bar
  else ui.progress.value = percent;
  ui.progressText.textContent = details;
  if (llm === null) setStatus('loading', label);
}

/**
 * RuvLLM.load's onProgress, for the model `checked` (model-check.js): one phase after the other. While
 * another model is in use, the plan line names the one it is about (`name`).
 */
function progressOf(checked, name) {
  return (p) => {
    if (p.phase === 'runtime') {
      const details = 'Python and NumPy start in this tab: 10–20 s on a first visit, a few seconds on later ones';
      showStep('runtime', 'Starting the engine…', null, details);
    } else if (p.phase === 'plan') {
      showStep('plan', 'Checking memory…', null, '');
      ui.plan.textContent = name + planWords(checked, p.plan);
    } else if (p.phase === 'download') {
      const percent = p.total ? (100 * p.loaded) / p.total : 0;
      const label = p.fromCache ? "Reading the model from this browser's cache" : 'Downloading the model';
      showStep('download', label, percent, `${mib(p.loaded)} / ${mib(p.total)} MiB (${percent.toFixed(0)}%)`);
    } else if (p.phase === 'load') {
      showStep('load', 'Preparing the model…', null, `${mib(p.total)} MiB downloaded`);
    }
  };
}

/**
 * What loading the model takes, in plain words: the download (known once its location is checked) and,
 * once the engine has read the weights' header (before their data), the memory it will use.
 */
function planWords({ downloadBytes, cached }, plan) {
  let download = '';
  if (downloadBytes !== null) {
    download = cached
      ? `${aboutMib(downloadBytes)} MiB, already in this browser's cache`
      : `${aboutMib(downloadBytes)} MiB to download`;
  }
  if (!plan) return download ? `${download}.` : '';
  const { weightBytes, kvBytes, workspaceBytes, totalBytes } = plan;
  let weights = `weights ${aboutMib(weightBytes)} MiB`;
  if (downloadBytes !== null && weightBytes > 1.05 * downloadBytes)
    weights += ': more than the file, as some parts are unpacked into a faster form';
  else if (downloadBytes !== null && weightBytes < 0.95 * downloadBytes) weights += ': packed smaller than the file';
  const kv = `the conversation's memory ${aboutMib(kvBytes)} MiB`;
  const parts = `${weights}; ${kv}; working space ${aboutMib(workspaceBytes)} MiB`;
  const running = `about ${aboutMib(totalBytes)} MiB of memory while running (${parts})`;
  return download ? `${download}; ${running}.` : `${running[0].toUpperCase()}${running.slice(1)}.`;
}

/** The technical details of the model in use, as lines (the "Technical details" disclosure). */
function showDetails(info, checked, seconds) {
  const { plan } = info;
  const forms = Object.entries(plan.weightBytesByForm ?? {})
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([form, bytes]) => `${form} ${mib(bytes)}`)
    .join(', ');
  const template = {
    model: "the model's own",
    option: 'given to RuvLLM.load',
    'built-in gemma': 'none in the file: the built-in Gemma turn format',
  };
  const parameters = `${(info.parameters / 1e6).toFixed(1)}M parameters`;
  const simd = info.relaxedSimd ? 'WebAssembly relaxed SIMD' : 'WebAssembly SIMD';
  const kernels = info.kernels === 'wasm' ? simd : `NumPy (${info.kernelsNote ?? 'asked for'})`;
  const cached = info.fromCache ? ", weights from this browser's cache" : '';
  const lines = [
    `Engine: ruvllm, NumPy in Pyodide (WebAssembly), in a Web Worker; ${info.architecture}, ${parameters}`,
    `Weights: ${plan.compute} compute form, ${mib(plan.weightBytes)} MiB in memory (${forms}); ` +
      `${mib(info.downloadedBytes)} MiB file`,
    `KV cache: ${mib(plan.kvBytes)} MiB for ${info.contextLength} positions; ` +
      `workspace ${mib(plan.workspaceBytes)} MiB; total ${mib(plan.totalBytes)} MiB`,
    `Kernels: ${kernels}, ${info.arithmetic} arithmetic; ${threadsLine(info.threads)}`,
    `Chat template: ${template[info.chatTemplate] ?? 'none: text completion only'}`,
    `Loaded in ${seconds} s${cached} from ${checked.url}`,
  ];
  ui.details.replaceChildren(
    ...lines.map((line) => {
      const item = document.createElement('li');
      item.textContent = line;
      return item;
    }),
  );
}

/** How many threads compute the products, and why one when only one does (info.threads). */
function threadsLine({ count, reason, adaptive }) {
  if (count === 1) return `1 thread (${reason})`;
  return `${count} threads${adaptive ? ', each product on one or all, whichever measures faster' : ''}`;
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
  if (error?.type === 'download' && /^cannot (start|load) Pyodide/.test(message))
    return `Could not download the engine's runtime (Pyodide): ${message}`;
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
  ui.welcome.hidden = true;
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
  const first = (stats.ttftMs / 1000).toFixed(2);
  const speed = `${stats.decodeTokS.toFixed(1)} tokens/s`;
  ui.stats.textContent = `${stats.completionTokens} tokens · ${speed} · first after ${first} s`;
  ui.stats.title = `time to the first token ${first} s; the prompt had ${stats.promptTokens} tokens`;
}

/** The generation settings of the Settings panel. */
function generationSettings() {
  return {
    temperature: Number(ui.temperature.value),
    topP: Number(ui.topP.value),
    repetitionPenalty: Number(ui.repetitionPenalty.value),
    maxTokens: Number(ui.maxTokens.value),
  };
}

async function send() {
  const typed = ui.prompt.value;
  if (!typed.trim() || !llm || running) return;
  ui.prompt.value = '';
  if (mode === 'completion') {
    addMessage('user', typed);
    await answer({ prompt: typed }, 'assistant'); // as typed: a trailing space changes the continuation
    focusPrompt();
    return;
  }
  const text = typed.trim();
  const turns = history; // "Clear chat" during the answer starts a new history; this answer stays out of it
  turns.push({ role: 'user', content: text });
  addMessage('user', text);
  const system = ui.system.value.trim();
  const messages = system ? [{ role: 'system', content: system }, ...turns] : [...turns];
  const reply = await answer({ messages }, 'assistant');
  if (reply) turns.push({ role: 'assistant', content: reply });
  else turns.pop(); // no answer at all: the model does not see this message again
  focusPrompt();
}

/**
 * Stream the model's answer to `request` ({ messages }: a chat; { prompt }: text to continue) into a new
 * message of class `role` ('assistant', or 'assistant regenerated': the same question asked again after
 * learning, beside the first answer); returns the reply ('' when there was none).
 */
function answer(request, role) {
  const done = streamAnswer(request, role);
  answering = done.then(
    () => {},
    () => {},
  );
  return done;
}

async function streamAnswer(request, role) {
  document.querySelector('[data-testid="output"]')?.removeAttribute('data-testid');
  const output = addMessage(role, '');
  const label = output.previousElementSibling; // the role's label, which addMessage put before it
  if (request.prompt !== undefined && label !== null) label.textContent = 'Model, continuing your text';
  output.dataset.testid = 'output';
  output.dataset.raw = '';
  // the request's own seed: Regenerate asks again with it, so what differs is what a lesson changed, not chance
  request.seed ??= Math.floor(Math.random() * 2 ** 31);
  /** @type {ReturnType<typeof generationSettings> & { seed: number, adapter?: string | null }} */
  const options = { ...generationSettings(), seed: request.seed };
  if (adapterReady) options.adapter = ui.useAdapter.checked ? ADAPTER : null;
  running = new AbortController();
  setStatus('generating', 'Generating…');
  ui.messages.setAttribute('aria-busy', 'true'); // screen readers: read the answer once it is complete
  let reply = '';
  try {
    const signal = running.signal;
    const chunks = request.messages
      ? model().chat(request.messages, { ...options, signal })
      : model().generate(request.prompt, { ...options, signal });
    for await (const chunk of chunks) {
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
    if (reply) keepingBottom(() => addActions(output.parentElement, request, reply));
  }
  return reply;
}

/**
 * Under an answer: Copy (its raw text); in a chat, Good / Bad, which teach the adapter that this reply
 * to these messages was good or bad; Regenerate, which asks the same again (after learning: the
 * difference shows), the new answer beside this one.
 */
function addActions(item, request, reply) {
  const row = document.createElement('div');
  row.className = 'actions';
  row.append(copyButton(reply));
  const again = actionButton(
    'regenerate',
    'Regenerate',
    'regenerate',
    'Ask the same question again with the same seed: what differs is mostly what a lesson changed',
  );
  again.addEventListener('click', () => {
    if (!running) answer(request, 'assistant regenerated');
  });
  /** @type {[string, number, string][]} */
  const learnable = request.messages
    ? [
        ['Good', 1, 'thumbs-up'],
        ['Bad', -1, 'thumbs-down'],
      ]
    : [];
  for (const [label, reward, testid] of learnable) {
    const aria = reward > 0 ? 'Good answer: learn from it' : 'Bad answer: learn to avoid it';
    const button = actionButton('learn', label, testid, aria);
    button.setAttribute('aria-pressed', 'false');
    button.addEventListener('click', () => learn(request.messages, reply, reward, button));
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
/** @type {ReturnType<typeof setInterval> | null} */
let ticking = null; // the timer that keeps the elapsed time current
const adapters = new WeakMap(); // per loaded model: the promise of its feedback adapter (made once)

/**
 * Teach the adapter that `reply` to `messages` was good (reward 1) or bad (-1). The first step lands at
 * once; the rest runs in the worker's idle time, so the page stays usable: a new message goes first and
 * learning resumes after it. The panel says what the lesson is doing and for how long, and offers Cancel.
 */
async function learn(messages, reply, reward, button) {
  /** @type {{ kind: string, started: number, progress: import('/npm/browser/index.js').LearningProgress | null,
   *   controller: AbortController, cancelled: boolean }} */
  const lesson = {
    kind: reward > 0 ? 'good' : 'bad',
    started: performance.now(),
    progress: null,
    controller: new AbortController(),
    cancelled: false,
  };
  lessons.add(lesson);
  button.setAttribute('aria-pressed', 'true');
  showLessons();
  try {
    const llm = model();
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
      clearInterval(ticking ?? undefined);
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
  if (p.phase === 'preparing') {
    // (the calibration's spectra and bases: once per model, begun in idle time after loading)
    const taken = p.step ? `, step ${p.step}/${p.steps} taken` : '';
    return `${doing}: preparing, once per model (${p.prepared.done}/${p.prepared.total})${taken} · ${time}`;
  }
  if (p.outcome === 'already')
    return `Nothing to learn from this ${kind} answer: the model already gives it (greedy decoding); checking earlier lessons · ${time}`;
  if (p.phase === 'rehearsing')
    return `${doing}: rehearsing after step ${p.step}/${p.steps} (checking that the lessons so far hold; ${p.rehearsed} rehearsal steps) · ${time}`;
  if (p.phase === 'done') return `${doing}: done after step ${p.step}/${p.steps} · ${time}`; // (its report follows)
  return `${doing}: learning, step ${p.step}/${p.steps} · ${time}`;
}

/** A finished lesson's report (AdaptReport), in words. */
function reportText(kind, report) {
  const changed = report.summary.startsWith('Learned') || report.summary.startsWith('Partly');
  return `${kind === 'good' ? 'Good' : 'Bad'} answer. ${report.summary}${changed ? ' Regenerate shows the difference.' : ''}`;
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
    files = await model().saveAdapter(ADAPTER);
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
  if (event.key === 'Enter' && !event.shiftKey && !event.isComposing && !touchScreen.matches) {
    event.preventDefault();
    send();
  }
});
ui.stop.addEventListener('click', () => running?.abort());

/** An empty conversation, with the welcome text and its examples. */
function clearChat() {
  running?.abort();
  history = [];
  ui.messages.replaceChildren();
  ui.stats.textContent = '';
  ui.welcome.hidden = false;
}

ui.clear.addEventListener('click', () => {
  clearChat();
  focusPrompt();
});

/** Chat or text completion: the composer, the welcome text and its examples follow; the chat starts over. */
function setMode(next) {
  if (next !== mode) clearChat();
  mode = next;
  $first(`input[name=mode][value=${next}]`, HTMLInputElement).checked = true;
  const { hint, placeholder, welcome, examples } = MODES[next];
  ui.modeHint.textContent = hint;
  ui.prompt.placeholder = touchScreen.matches
    ? placeholder
    : `${placeholder} (Enter sends, Shift+Enter for a new line)`;
  ui.system.disabled = next !== 'chat';
  ui.welcomeText.textContent = welcome;
  ui.examples.replaceChildren(
    ...examples.map((text) => {
      const button = document.createElement('button');
      button.type = 'button';
      button.className = 'example';
      button.dataset.testid = 'example';
      button.textContent = text;
      button.addEventListener('click', () => {
        ui.prompt.value = text;
        if (ui.send.disabled)
          ui.prompt.focus(); // no model ready yet: it waits in the box
        else send();
      });
      return button;
    }),
  );
}

for (const radio of /** @type {NodeListOf<HTMLInputElement>} */ (document.querySelectorAll('input[name=mode]'))) {
  radio.addEventListener('change', () => setMode(radio.value));
}
touchScreen.addEventListener('change', () => setMode(mode));

let pyodide; // where Pyodide comes from (config.json), for every load
/** @type {AbortController | null} */
let loading = null; // AbortController of the load under way
let lastAsked = null; // the model entry the last load was for (Retry loads it again)

/**
 * Load `entry` ({ model: a URL or hub name, name, mode: 'chat' | 'completion' | null }). Its location is
 * checked first; the model in use stays in use (its chat too) until the new one is ready, and stays if
 * the new one fails. Loading another model meanwhile abandons this one.
 */
async function loadModel(entry) {
  loading?.abort();
  const controller = new AbortController();
  loading = controller;
  lastAsked = entry;
  const { signal } = controller;
  ui.loadError.hidden = true;
  ui.loadFailed.hidden = true;
  const switching = llm !== null; // the model in use stays until this one is ready
  const named = switching ? `${entry.name}: ` : '';
  ui.loadingNote.hidden = !switching;
  ui.loadingNote.textContent =
    `Loading ${entry.name}. The current model stays usable until it is ready ` + '(both are in memory until then).';
  if (!switching) ui.modelName.textContent = entry.name;
  showStep('check', `Checking ${entry.name}…`, null, '');
  let checked;
  let next;
  const started = performance.now();
  try {
    checked = await checkModel(entry.model, { signal });
    ui.plan.textContent = named + planWords(checked, null);
    const model = entry.model.startsWith('hf:') ? entry.model : checked.url;
    next = await RuvLLM.load({ model, pyodide, signal, onProgress: progressOf(checked, named) });
  } catch (error) {
    if (signal.aborted) return;
    if (error instanceof ModelCheckError) loadFailed(error.message, error.retryable);
    else loadFailed(describe(error, 'while loading'), error.type !== 'load'); // a file that is wrong stays wrong
    return;
  }
  if (signal.aborted) {
    await next.dispose(); // another model was asked for meanwhile
    return;
  }
  loading = null;
  showDetails(next.info, checked, ((performance.now() - started) / 1000).toFixed(1));
  await replaceModel(next, entry, checked);
  if (next.info.kernelsNote) console.info(`ruvllm: NumPy computes the products: ${next.info.kernelsNote}`);
}

/** The new model in, the old one out: its generation and lessons stop, its chat goes, then it is freed. */
async function replaceModel(next, entry, checked) {
  running?.abort();
  ui.cancelLearning.click(); // the lessons under way stop (as Cancel stops them)
  await answering;
  const previous = llm;
  llm = next;
  adapterReady = false;
  const chatTemplate = next.info.chatTemplate;
  current = { name: entry.name, plan: planWords(checked, next.info.plan) };
  ui.plan.textContent = current.plan;
  ui.modelName.textContent = entry.name;
  ui.loading.hidden = true;
  ui.loadingNote.hidden = true;
  // A model without a chat template cannot chat; one whose file has none (Gemma's built-in turn format
  // stands in) is most likely a base model: text completion first, unless the server's list says.
  $first('input[name=mode][value=chat]', HTMLInputElement).disabled = chatTemplate === null;
  setMode(entry.mode ?? (chatTemplate === 'model' || chatTemplate === 'option' ? 'chat' : 'completion'));
  clearChat();
  setStatus('ready', 'Ready');
  const url = new URL(location.href);
  url.searchParams.set('model', entry.model);
  window.history.replaceState(null, '', url); // a reload loads the same model
  focusPrompt();
  await previous?.dispose();
}

/** Say why the load failed, and offer Retry if trying again may help; the model in use, if any, stays. */
function loadFailed(message, retryable) {
  loading = null;
  ui.loading.hidden = true;
  ui.loadingNote.hidden = true;
  const sentence = /[.!?)]$/.test(message) ? message : `${message}.`;
  ui.loadError.textContent = llm === null ? sentence : `${sentence} The current model stays loaded.`;
  ui.loadError.hidden = false;
  ui.loadFailed.hidden = !retryable;
  if (llm === null) setStatus('error', 'No model loaded');
  else if (current !== null) ui.plan.textContent = current.plan;
}

const OTHER = '';

/** The picker: the models the server lists, then "Another model…" with a URL field. */
function fillPicker(models, chosen) {
  const options = models.map(({ name, url }) => new Option(name, url));
  options.push(new Option('Another model (URL or hf: name)…', OTHER));
  ui.modelSelect.replaceChildren(...options);
  const listed = models.some((m) => m.url === chosen);
  ui.modelSelect.value = listed ? chosen : OTHER;
  ui.modelUrl.value = listed ? '' : chosen;
  ui.modelUrl.hidden = listed;
}

/** The entry of `model`: the server's, when it lists it; else the model is named by its location. */
function entryOf(models, model) {
  const listed = models.find((m) => m.url === model);
  return listed ? { model, name: listed.name, mode: listed.mode ?? null } : { model, name: model, mode: null };
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
  const first = new URLSearchParams(location.search).get('model') || config.model || models[0].url;
  pyodide = config.pyodideIndexURL ? { indexURL: config.pyodideIndexURL } : undefined;
  fillPicker(models, first);
  setMode('chat');
  ui.modelSelect.addEventListener('change', () => {
    ui.modelUrl.hidden = ui.modelSelect.value !== OTHER;
    if (!ui.modelUrl.hidden) ui.modelUrl.focus();
  });
  ui.picker.addEventListener('submit', (event) => {
    event.preventDefault();
    const model = ui.modelSelect.value === OTHER ? ui.modelUrl.value.trim() : ui.modelSelect.value;
    if (model) loadModel(entryOf(models, model));
    else ui.modelUrl.focus();
  });
  ui.retry.addEventListener('click', () => loadModel(lastAsked));
  await loadModel(entryOf(models, first));
}

main();
