// What the demo page's parts (chat.js, lessons.js, loader.js) share: its elements, checked; the status line,
// which their controls follow; errors in words a visitor can act on. No state of its own but the status
// line's followers.

/**
 * The page's element `id` (index.html has each: a missing one is a bug of the page, said at once), of
 * the kind given (HTMLInputElement, ...), checked.
 * @template {HTMLElement} T
 * @param {string} id
 * @param {{ new (): T, name: string }} kind
 * @returns {T}
 */
export const $ = (id, kind) => {
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
export function $first(selector, kind) {
  const element = document.querySelector(selector);
  if (!(element instanceof kind)) throw new Error(`the page has no ${kind.name} ${selector}`);
  return element;
}

/** @typedef {'loading' | 'ready' | 'generating' | 'error'} State */

/**
 * The status line: a state and its words. The controls follow the state: each part of the page says how
 * its own do with `follow`, and every `set` (or `refresh`) sets them all.
 *
 *   const status = createStatus();
 *   status.follow((state) => (stop.disabled = state !== 'generating'));
 *   status.set('generating', 'Generating…');
 */
export function createStatus() {
  const element = $('status', HTMLElement);
  /** @type {((state: State) => void)[]} */
  const followers = [];

  /**
   * @param {State} state
   * @param {string} text
   */
  function set(state, text) {
    element.dataset.state = state;
    element.textContent = text;
    for (const follow of followers) follow(state);
  }

  return {
    set,
    /** The state and words as they are, the controls set again (after what they follow changed). */
    refresh: () => set(/** @type {State} */ (element.dataset.state), element.textContent ?? ''),
    /** @param {(state: State) => void} follower */
    follow: (follower) => void followers.push(follower),
  };
}

/** @typedef {ReturnType<typeof createStatus>} Status */

/** A message a visitor can act on, from any error. */
export function describe(error, during) {
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
