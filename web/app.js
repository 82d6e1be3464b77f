// The demo page: loads a model with @ruvector/ruvllm (its browser build) and streams answers, as a chat
// or, for a base model, as a continuation of the visitor's text. This entry wires the page's three parts,
// each with its own state: the loader (loader.js: the model picker, the load and its progress, Retry), the
// chat (chat.js) and the lessons (lessons.js: Good / Bad teach the model an adapter).
// The server (web/serve.py) answers /config.json with the models it serves (the picker lists them, each
// with its mode, and takes any other URL or hub name) and, when it has one, a local Pyodide
// distribution; `?model=URL` in the page address picks the model to load first.
import { createChat } from './chat.js';
import { createLessons } from './lessons.js';
import { createLoader, serverConfig } from './loader.js';
import { createStatus } from './page.js';

const status = createStatus();
const lessons = createLessons(status);
const chat = createChat(status, lessons);
// A loaded model replaces the one in use: what uses the old one stops first, then the new one comes in.
const loader = createLoader(status, {
  async release() {
    chat.stop();
    lessons.cancel(); // the lessons under way stop (as Cancel stops them)
    await chat.idle();
  },
  adopt(next, entry) {
    lessons.useModel(next);
    chat.useModel(next, entry.mode);
    status.set('ready', 'Ready');
    chat.focus();
  },
});

async function main() {
  const config = await serverConfig();
  chat.setMode('chat');
  await loader.start(config);
}

main();
