/**
 * Chat templates in JavaScript: the model's Jinja template, parsed and run by @huggingface/jinja,
 * with the bounds the Python side has (py_src/ruvllm/chat_template.py).
 *
 * A template comes with a model, possibly from anywhere: it is untrusted code that runs inside the
 * worker, where a template that never ends would leave the worker deaf to every later request. So
 * rendering may take at most MAX_MS (checked as the interpreter evaluates each node, so loops of any
 * kind end), no string or list may exceed MAX_CHARS, and `range` holds at most MAX_RANGE items (as in
 * Jinja's Python sandbox). `raise_exception(...)` means the template refuses these messages: an
 * `invalid_argument` error; any other failure is a `load` error naming the template.
 */

import { Environment, Interpreter, Template } from '@huggingface/jinja';

import { RuvLLMError } from '../errors.js';

export const MAX_MS = 2000; // real templates take a few milliseconds
export const MAX_CHARS = 2 ** 22; // 4 Mi characters: far beyond any context window's worth of text
export const MAX_RANGE = 100_000; // Jinja's sandbox limit (jinja2.sandbox.MAX_RANGE)

class BoundError extends Error {}
class Refusal extends Error {}

function bounded(value, what) {
  const size = typeof value?.value === 'string' || Array.isArray(value?.value) ? value.value.length : 0;
  if (size > MAX_CHARS)
    throw new BoundError(
      `${what} of ${size.toLocaleString('en')} items (the limit is ${MAX_CHARS.toLocaleString('en')})`,
    );
  return value;
}

/** An interpreter that checks the clock and the size of what it builds at every node it evaluates. */
class BoundedInterpreter extends Interpreter {
  #deadline;

  constructor(env, deadline) {
    super(env);
    this.#deadline = deadline;
  }

  evaluate(statement, environment) {
    if (performance.now() > this.#deadline) {
      throw new BoundError(`took longer than ${MAX_MS / 1000} s`);
    }
    return bounded(super.evaluate(statement, environment), 'built a value');
  }
}

function range(...args) {
  const [start, stop, step] = args.length === 1 ? [0, args[0], 1] : [args[0], args[1], args[2] ?? 1];
  if (![start, stop, step].every(Number.isInteger) || step === 0)
    throw new Error('range() needs integers and a non-zero step');
  const count = Math.max(0, Math.ceil((stop - start) / step));
  if (count > MAX_RANGE) throw new BoundError(`asked for a range of ${count} items (the limit is ${MAX_RANGE})`);
  return Array.from({ length: count }, (_, i) => start + i * step);
}

/** The current date and time in `format` (%Y %m %d %H %M %b %B %%), English month names as Python's C locale. */
function strftimeNow(format) {
  const now = new Date();
  const two = (n) => String(n).padStart(2, '0');
  const month = (style) => new Intl.DateTimeFormat('en-US', { month: style }).format(now);
  const parts = {
    Y: String(now.getFullYear()),
    m: two(now.getMonth() + 1),
    d: two(now.getDate()),
    H: two(now.getHours()),
    M: two(now.getMinutes()),
    '%': '%',
  };
  return String(format).replace(/%([YmdHMbB%])/g, (_, c) => parts[c] ?? month(c === 'b' ? 'short' : 'long'));
}

function raiseException(message) {
  throw new Refusal(String(message));
}

/** What a template sees besides its variables (as @huggingface/jinja and transformers give it). */
const GLOBALS = {
  true: true,
  false: false,
  none: null,
  True: true,
  False: false,
  None: null,
  raise_exception: raiseException,
  range,
  strftime_now: strftimeNow,
};

export class ChatTemplate {
  #program;
  #where;

  /**
   * @param {string} source the template
   * @param {Record<string, string>} specialTokens bos_token, eos_token, ... as template variables
   * @param {string} where the file it came from, for error messages
   */
  constructor(source, specialTokens = {}, where = 'tokenizer_config.json') {
    this.#where = `the chat_template in ${where}`;
    this.specialTokens = specialTokens;
    try {
      this.#program = new Template(source).parsed;
    } catch (error) {
      throw new RuvLLMError('load', `${this.#where} does not parse: ${error.message}`);
    }
  }

  /**
   * The prompt for `messages`. `tools` (OpenAI tool objects) reach the template as the variable `tools`,
   * null when there are none, as transformers' apply_chat_template passes them. Messages may be OpenAI's
   * tool-calling ones: an assistant message with `tool_calls` (and `content: null`), a `role: 'tool'`
   * message with `tool_call_id`; the template decides how they read.
   * @param {object[]} messages
   * @param {{ tools?: object[] | null, addGenerationPrompt?: boolean }} [options]
   */
  render(messages, { tools = null, addGenerationPrompt = true } = {}) {
    const env = new Environment();
    const variables = {
      ...GLOBALS,
      ...this.specialTokens,
      messages,
      tools: tools ?? null,
      add_generation_prompt: addGenerationPrompt,
    };
    for (const [name, value] of Object.entries(variables)) env.set(name, value);
    try {
      const result = new BoundedInterpreter(env, performance.now() + MAX_MS).run(this.#program);
      return bounded(result, 'rendered a prompt').value;
    } catch (error) {
      if (error instanceof Refusal)
        throw new RuvLLMError('invalid_argument', `the chat template rejected these messages: ${error.message}`);
      if (error instanceof RangeError && /string length/.test(error.message))
        throw new RuvLLMError('load', `${this.#where} fails: built a string too long for JavaScript`);
      throw new RuvLLMError('load', `${this.#where} fails: ${error.message}`);
    }
  }
}
