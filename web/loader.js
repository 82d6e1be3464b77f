// The demo page's model: the picker (the models the server lists, or any URL or hub name), loading one
// with its progress and plan, what failed and Retry, the technical details of the one in use.
//
// Loading another model checks its location first (model-check.js) and loads it beside the current one:
// the current model and its chat stay usable until the new one is ready, and a location that is wrong is
// said in words, in a second, without costing anything.
//
//   const loader = createLoader(status, { release, adopt }); // what the page does when the model changes
//   await loader.start(await serverConfig());

import { RuvLLM } from '/npm/browser/index.js';

import { ModelCheckError, checkModel } from './model-check.js';
import { $, describe } from './page.js';

/**
 * @typedef {{ model: string, name: string, mode: 'chat' | 'completion' | null }} Entry a model to load: a URL
 *   or hub name, its name on the page, how the page uses it (null: as its chat template suggests)
 * @typedef {{ name: string, url: string, mode?: 'chat' | 'completion' }} Listed a model the server lists
 * @typedef {{ model?: string, models?: Listed[], pyodideIndexURL?: string | null }} Config /config.json
 */

const MiB = 2 ** 20;
const mib = (bytes) => (bytes / MiB).toFixed(1);
/** A size in plain words: whole MiB (one decimal below 10). */
const aboutMib = (bytes) => (bytes < 10 * MiB ? mib(bytes) : String(Math.round(bytes / MiB)));
const OTHER = ''; // the picker's "Another model…"

/** What the server says (web/serve.py answers /config.json); nothing when there is no such server. */
export async function serverConfig() {
  /** @type {Config} */
  let config = {};
  try {
    const response = await fetch('config.json');
    if (response.ok) config = await response.json();
  } catch {
    // No server config: the defaults apply.
  }
  return config;
}

/**
 * The loader and its state: the model in use, the load under way, the last one asked for (Retry).
 * @param {import('./page.js').Status} status
 * @param {{ release: () => Promise<void>, adopt: (next: RuvLLM, entry: Entry) => void }} page what the page
 *   does when a loaded model replaces the one in use: `release` stops what uses the old one (awaited before
 *   the switch), `adopt` hands the new one to what uses it (the page is ready after it)
 */
export function createLoader(status, { release, adopt }) {
  const ui = {
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
    deviceSelect: $('device-select', HTMLSelectElement),
    modelUrl: $('model-url', HTMLInputElement),
    plan: $('plan', HTMLElement),
    details: $('details-list', HTMLElement),
    retry: $('retry', HTMLButtonElement),
  };

  /** @type {RuvLLM | null} */
  let llm = null; // the model in use
  /** @type {{ name: string, plan: string } | null} */
  let current = null; // what it is: { name, plan (the plan line's text) }
  let pyodide; // where Pyodide comes from (config.json), for every load
  /** @type {AbortController | null} */
  let loading = null; // AbortController of the load under way
  /** @type {Entry | null} */
  let lastAsked = null; // the model entry the last load was for (Retry loads it again)

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
    if (llm === null) status.set('loading', label);
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

  /** The technical details of the model in use, as lines (the "Technical details" disclosure). */
  function showDetails(info, checked, seconds) {
    ui.details.replaceChildren(
      ...detailLines(info, checked, seconds).map((line) => {
        const item = document.createElement('li');
        item.textContent = line;
        return item;
      }),
    );
  }

  /**
   * Load `entry`. Its location is checked first; the model in use stays in use (its chat too) until the
   * new one is ready, and stays if the new one fails. Loading another model meanwhile abandons this one.
   * @param {Entry} entry
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
      const device = /** @type {'auto' | 'webgpu' | 'cpu'} */ (ui.deviceSelect.value);
      next = await RuvLLM.load({ model, pyodide, signal, device, onProgress: progressOf(checked, named) });
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
    await release();
    const previous = llm;
    llm = next;
    current = { name: entry.name, plan: planWords(checked, next.info.plan) };
    ui.plan.textContent = current.plan;
    ui.modelName.textContent = entry.name;
    ui.loading.hidden = true;
    ui.loadingNote.hidden = true;
    const url = new URL(location.href);
    url.searchParams.set('model', entry.model);
    window.history.replaceState(null, '', url); // a reload loads the same model
    adopt(next, entry);
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
    if (llm === null) status.set('error', 'No model loaded');
    else if (current !== null) ui.plan.textContent = current.plan;
  }

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

  return {
    /**
     * The picker filled from the server's `config`, and the first model loading: `?model=URL` in the page
     * address, else the server's default, else the first it lists.
     * @param {Config} config
     */
    async start(config) {
      const models = config.models ?? [{ name: 'SmolLM2-135M-Instruct', url: '/models/smollm2-135m-instruct/' }];
      const first = new URLSearchParams(location.search).get('model') || config.model || models[0].url;
      pyodide = config.pyodideIndexURL ? { indexURL: config.pyodideIndexURL } : undefined;
      fillPicker(models, first);
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
      ui.retry.addEventListener('click', () => loadModel(/** @type {Entry} */ (lastAsked)));
      // another device takes a new load of the model in use (its weights move to the GPU, or off it)
      ui.deviceSelect.addEventListener('change', () => {
        if (lastAsked !== null) loadModel(lastAsked);
      });
      await loadModel(entryOf(models, first));
    },
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

/** The technical details of a loaded model (RuvLLM.info), as lines; `seconds`: how long the load took. */
function detailLines(info, checked, seconds) {
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
  return [
    `Engine: ruvllm, NumPy in Pyodide (WebAssembly), in a Web Worker; ${info.architecture}, ${parameters}`,
    `Weights: ${plan.compute} compute form, ${mib(plan.weightBytes)} MiB in memory (${forms}); ` +
      `${mib(info.downloadedBytes)} MiB file`,
    `KV cache: ${mib(plan.kvBytes)} MiB for ${info.contextLength} positions; ` +
      `workspace ${mib(plan.workspaceBytes)} MiB; total ${mib(plan.totalBytes)} MiB`,
    `Kernels: ${kernels}, ${info.arithmetic} arithmetic; ${threadsLine(info.threads)}`,
    deviceLine(info.device),
    `Chat template: ${template[info.chatTemplate] ?? 'none: text completion only'}`,
    `Loaded in ${seconds} s${cached} from ${checked.url}`,
  ];
}

/** Where the decode plan runs: the GPU (its adapter, the check's figures) or the CPU and why (info.device). */
function deviceLine({ path, reason, adapter, check }) {
  const named = adapter ? [adapter.vendor, adapter.architecture, adapter.description].filter(Boolean).join(' ') : '';
  if (path === 'webgpu' && check) {
    const difference = check.relative.toExponential(1);
    return `Device: GPU through WebGPU (${named}); its logits checked against the CPU's at load: largest difference ${difference} of their scale, the same top tokens`;
  }
  return `Device: CPU (${reason})`;
}

/** How many threads compute the products, and why one when only one does (info.threads). */
function threadsLine({ count, reason, adaptive }) {
  if (count === 1) return `1 thread (${reason})`;
  return `${count} threads${adaptive ? ', each product on one or all, whichever measures faster' : ''}`;
}

/** The entry of `model`: the server's, when it lists it; else the model is named by its location. */
function entryOf(models, model) {
  const listed = models.find((m) => m.url === model);
  return listed ? { model, name: listed.name, mode: listed.mode ?? null } : { model, name: model, mode: null };
}
