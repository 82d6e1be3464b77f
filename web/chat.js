// The demo page's conversation: the mode (a chat, or a text the model continues), the composer, the
// answers streamed and rendered from Markdown, and under each answer its actions (Copy, Good / Bad, which
// the lessons learn from, Regenerate).
//
//   const chat = createChat(status, lessons);
//   chat.useModel(llm, 'chat'); // each model loaded: the chat starts over in its mode
//   chat.stop(); await chat.idle(); // before the model goes

import { renderMarkdown } from './markdown.js';
import { $, $first, describe } from './page.js';

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

/**
 * The conversation and its state: the model it talks to, the mode, the turns so far, the answer under way.
 * @param {import('./page.js').Status} status
 * @param {import('./lessons.js').Lessons} lessons what Good / Bad teach, and whether answers use it
 */
export function createChat(status, lessons) {
  const ui = {
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
  };
  // On touch screens Enter makes a new line and the Send button sends, as in chat apps.
  const touchScreen = matchMedia('(pointer: coarse)');

  /** @type {import('/npm/browser/index.js').RuvLLM | null} */
  let llm = null; // the model in use
  let mode = 'chat';
  let history = []; // [{ role, content }] of the conversation so far, without the system prompt
  /** @type {AbortController | null} */
  let running = null; // AbortController of the generation in progress
  let answering = Promise.resolve(); // settles when the generation in progress has ended

  /** The model in use: the controls that need one are disabled until one is loaded. */
  function model() {
    if (llm === null) throw new Error('no model is loaded');
    return llm;
  }

  status.follow((state) => {
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
  });

  /** Ready for the next message; not on a touch screen, where focus opens the on-screen keyboard over the answer. */
  function focusPrompt() {
    if (!touchScreen.matches) ui.prompt.focus();
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
    label.textContent = role === 'user' ? 'You' : role === 'assistant' ? 'Model' : lessons.regeneratedLabel();
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
    const options = { ...generationSettings(), seed: request.seed, ...lessons.adapterOption() };
    running = new AbortController();
    status.set('generating', 'Generating…');
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
      status.set('ready', 'Ready');
    } catch (error) {
      if (error.name === 'AbortError') {
        markStopped(output);
        status.set('ready', 'Stopped');
      } else {
        status.set('error', describe(error, 'while generating'));
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
      button.addEventListener('click', () => lessons.learn(request.messages, reply, reward, button));
      row.append(button);
    }
    row.append(again);
    item.append(row);
  }

  /** An empty conversation, with the welcome text and its examples. */
  function clearChat() {
    running?.abort();
    history = [];
    ui.messages.replaceChildren();
    ui.stats.textContent = '';
    ui.welcome.hidden = false;
  }

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
  ui.clear.addEventListener('click', () => {
    clearChat();
    focusPrompt();
  });
  for (const radio of /** @type {NodeListOf<HTMLInputElement>} */ (document.querySelectorAll('input[name=mode]'))) {
    radio.addEventListener('change', () => setMode(radio.value));
  }
  touchScreen.addEventListener('change', () => setMode(mode));

  return {
    setMode,
    focus: focusPrompt,
    /** The answer under way stops, as Stop stops it. */
    stop: () => running?.abort(),
    /** Settles when the answer under way (if any) has ended. */
    idle: () => answering,
    /**
     * Chat with `next` from now on, in `mode` ('chat' | 'completion'), or else in the one its chat template
     * suggests; the conversation starts over.
     * @param {import('/npm/browser/index.js').RuvLLM} next
     * @param {string | null} nextMode
     */
    useModel(next, nextMode) {
      llm = next;
      const chatTemplate = next.info.chatTemplate;
      // A model without a chat template cannot chat; one whose file has none (Gemma's built-in turn format
      // stands in) is most likely a base model: text completion first, unless the server's list says.
      $first('input[name=mode][value=chat]', HTMLInputElement).disabled = chatTemplate === null;
      setMode(nextMode ?? (chatTemplate === 'model' || chatTemplate === 'option' ? 'chat' : 'completion'));
      clearChat();
    },
  };
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
