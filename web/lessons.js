// The demo page's learning panel: Good / Bad on an answer teaches the model in use a small LoRA adapter
// (RuvLLM.adapt, in the worker's idle time); the panel says what the lessons under way do, offers Cancel,
// "Use what it learned" and the adapter's download.
//
//   const lessons = createLessons(status);
//   lessons.useModel(llm); // each model loaded: no adapter yet
//   button.addEventListener('click', () => lessons.learn(messages, reply, 1, button));

import { $, describe } from './page.js';
import { zipFiles } from './zip.js';

const ADAPTER = 'feedback';
// The library's default adapter (measured: benchmarks/RESULTS.md), under the page's own name.
const ADAPTER_CONFIG = { name: ADAPTER };

/**
 * @typedef {import('/npm/browser/index.js').RuvLLM} RuvLLM
 * @typedef {{ kind: string, started: number, progress: import('/npm/browser/index.js').LearningProgress | null,
 *   controller: AbortController, cancelled: boolean }} Lesson
 */

/**
 * The learning panel and its state: the model it teaches, its lessons under way, the steps learned.
 * @param {import('./page.js').Status} status
 */
export function createLessons(status) {
  const ui = {
    useAdapter: $('use-adapter', HTMLInputElement),
    learning: $('learning', HTMLElement),
    learningText: $('learning-text', HTMLElement),
    cancel: $('cancel-learning', HTMLButtonElement),
    download: $('download-adapter', HTMLButtonElement),
  };

  /** @type {RuvLLM | null} */
  let llm = null; // the model in use, which the lessons teach
  let adapterReady = false; // the model in use has its feedback adapter
  /**
   * Lessons under way, oldest first: { kind, started (performance.now()), progress (the last one, or null),
   * controller (Cancel aborts them all), cancelled (Cancel was pressed) }. The panel shows the oldest.
   * @type {Set<Lesson>}
   */
  const lessons = new Set();
  let learnedSteps = 0; // optimizer steps of the lessons finished (or cancelled) so far
  /** @type {ReturnType<typeof setInterval> | null} */
  let ticking = null; // the timer that keeps the elapsed time current
  /** @type {WeakMap<RuvLLM, Promise<unknown>>} */
  const adapters = new WeakMap(); // per loaded model: the promise of its feedback adapter (made once)

  /** The model in use: the controls that need one are disabled until one is loaded. */
  function model() {
    if (llm === null) throw new Error('no model is loaded');
    return llm;
  }

  // Learning never locks the page: it runs in the worker's idle time, and a new message goes first.
  status.follow((state) => {
    const loaded = llm !== null && state !== 'loading';
    ui.useAdapter.disabled = !loaded || !adapterReady;
    ui.download.disabled = !loaded || !adapterReady;
  });

  /**
   * Teach the adapter that `reply` to `messages` was good (reward 1) or bad (-1). The first step lands at
   * once; the rest runs in the worker's idle time, so the page stays usable: a new message goes first and
   * learning resumes after it. The panel says what the lesson is doing and for how long, and offers Cancel.
   * @param {HTMLButtonElement} button the Good or Bad button pressed
   */
  async function learn(messages, reply, reward, button) {
    /** @type {Lesson} */
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
      status.refresh(); // the adapter's controls are usable now
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
      else status.set('error', describe(error, 'while learning'));
    } finally {
      lessons.delete(lesson);
      if (lessons.size) showLessons();
      else {
        clearInterval(ticking ?? undefined);
        ticking = null;
        ui.learning.dataset.state = 'idle';
        ui.cancel.hidden = true;
      }
    }
  }

  /** The oldest lesson under way in the panel, with the time since it was given (kept current). */
  function showLessons() {
    const [oldest] = lessons;
    if (!oldest) return;
    const more = lessons.size > 1 ? ` (${lessons.size - 1} more waiting)` : '';
    ui.learning.dataset.state = 'learning';
    ui.learningText.textContent = lessonText(oldest, performance.now() - oldest.started) + more;
    ui.cancel.hidden = false;
    ticking ??= setInterval(showLessons, 1000);
  }

  /** Every lesson under way stops (Cancel); the steps they took are kept. */
  function cancel() {
    for (const lesson of lessons) {
      lesson.cancelled = true;
      lesson.controller.abort();
    }
  }

  ui.cancel.addEventListener('click', cancel);

  ui.download.addEventListener('click', async () => {
    let files;
    try {
      files = await model().saveAdapter(ADAPTER);
    } catch (error) {
      status.set('error', describe(error, 'while saving the adapter'));
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

  return {
    learn,
    cancel,
    /**
     * The model to teach from now on (the lessons of the one before were cancelled): it has no adapter yet.
     * @param {RuvLLM} next
     */
    useModel(next) {
      llm = next;
      adapterReady = false;
    },
    /** The generation option that says whether an answer uses the adapter: none before it exists. */
    adapterOption: () => (adapterReady ? { adapter: ui.useAdapter.checked ? ADAPTER : null } : {}),
    /** The label of an answer asked again: after learning only when no lesson is under way. */
    regeneratedLabel() {
      const [oldest] = lessons;
      const p = oldest?.progress;
      if (oldest) return `Model, asked again while learning${p ? ` (step ${p.step}/${p.steps} so far)` : ''}`;
      return learnedSteps ? 'Model, asked again after learning' : 'Model, asked again';
    },
  };
}

/** @typedef {ReturnType<typeof createLessons>} Lessons */

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
