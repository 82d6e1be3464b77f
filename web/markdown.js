// A small Markdown renderer for the model's answers: paragraphs, headings, bulleted and numbered lists,
// fenced code blocks, inline code, bold and italic.
//
// Safety: it builds DOM nodes (createElement and text nodes) and never parses the text as HTML, so
// nothing the model writes can become markup: `<img onerror=…>` stays the text `<img onerror=…>`.
//
// Streaming: the page renders the whole answer again after every token, so one call reads the text once,
// line by line, and every inline search moves forward only (O(length) per call). Unfinished syntax
// shows as it stands until its end arrives: an unclosed fence is a code block so far, an unclosed `**`
// is two asterisks.
//
//   import { renderMarkdown } from './markdown.js';
//   element.replaceChildren(renderMarkdown('Some **bold** text\n\n- a\n- b'));

const FENCE = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/; // ```python, ~~~
const HEADING = /^ {0,3}(#{1,6})\s+(.*)$/; // ## Title
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/; // ---, * * *
const BULLET = /^\s*[-*+]\s+(.*)$/; // - item, * item, + item
const NUMBERED = /^\s*(\d{1,9})[.)](?:\s+(.*))?$/; // 1. item, 2) item, a lone "3." while it streams
const INDENTED = /^\s+\S/;

/**
 * The DOM of Markdown `text`: a DocumentFragment of p, h3–h6, ul/ol > li, pre > code and hr elements,
 * with code, strong and em inside them.
 * @param {string} text
 * @returns {DocumentFragment}
 */
export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  /** @type {string[] | null} */
  let paragraph = null; // lines of the paragraph being read
  /** @type {{ fence: string, lines: string[], element: HTMLElement } | null} */
  let code = null; // { fence, lines, element } of the open code block
  /** @type {{ ordered: boolean, element: HTMLOListElement | HTMLUListElement } | null} */
  let list = null; // { ordered, element } of the open list
  /** @type {string[] | null} */
  let item = null; // lines of the open list item
  let blankBefore = false; // a blank line came since the last line of text

  const endParagraph = () => {
    if (paragraph) root.append(inlineElement('p', paragraph.join('\n')));
    paragraph = null;
  };
  const endItem = () => {
    if (item && list) list.element.append(inlineElement('li', item.join('\n')));
    item = null;
  };
  const endList = () => {
    endItem();
    if (list) root.append(list.element);
    list = null;
  };
  const endCode = () => {
    if (code) code.element.textContent = code.lines.join('\n');
    code = null;
  };

  for (const line of text.split('\n')) {
    if (code) {
      if (line.trim().startsWith(code.fence)) endCode();
      else code.lines.push(line);
      continue;
    }
    if (!line.trim()) {
      endParagraph();
      blankBefore = true;
      continue;
    }
    const fence = FENCE.exec(line);
    const heading = HEADING.exec(line);
    const rule = RULE.test(line);
    const bullet = !rule && BULLET.exec(line);
    const numbered = NUMBERED.exec(line);
    if (fence || heading || rule) {
      endParagraph();
      endList();
      if (fence) {
        code = { fence: fence[1], lines: [], element: codeBlock(root, fence[2]) };
      } else if (heading) {
        root.append(inlineElement(`h${Math.min(heading[1].length + 2, 6)}`, heading[2]));
      } else {
        root.append(document.createElement('hr'));
      }
    } else if (bullet || numbered) {
      endParagraph();
      const ordered = Boolean(numbered);
      if (list && list.ordered !== ordered) endList();
      endItem();
      if (!list) {
        list = { ordered, element: numbered ? document.createElement('ol') : document.createElement('ul') };
        if (numbered && numbered[1] !== '1' && list.element instanceof HTMLOListElement)
          list.element.start = Number(numbered[1]);
      }
      item = [numbered ? (numbered[2] ?? '') : bullet ? bullet[1] : ''];
    } else if (item && (!blankBefore || INDENTED.test(line))) {
      item.push(line.trim()); // the item goes on
    } else {
      endList();
      paragraph ??= [];
      paragraph.push(line);
    }
    blankBefore = false;
  }
  endParagraph();
  endList();
  endCode();
  return root;
}

/** An empty pre > code appended to `root`, with its language (if any) as a class; returns the code. */
function codeBlock(root, language) {
  const pre = document.createElement('pre');
  const element = document.createElement('code');
  if (language) element.className = `language-${language}`;
  pre.append(element);
  root.append(pre);
  return element;
}

function inlineElement(tag, text) {
  const element = document.createElement(tag);
  appendInline(element, text);
  return element;
}

const EMPHASIS = { '**': 'strong', __: 'strong', '*': 'em', _: 'em' };
const SPACE = /\s/;
const WORD = /[\p{L}\p{N}]/u;

/**
 * Append `text` to `parent` with `code`, **strong** and *em* spans as elements, the rest as text.
 * Emphasis opens only before a non-space and closes only after one; underscores inside words
 * (snake_case) are plain text. Spans do not nest in themselves, so each character is read at most once
 * per nesting level.
 */
function appendInline(parent, text) {
  const next = forwardFinder(text);
  let plain = 0; // start of the text not yet appended
  let i = 0;
  const span = (element, start, after) => {
    parent.append(text.slice(plain, start), element);
    i = plain = after;
  };
  while (i < text.length) {
    const c = text[i];
    if (c === '`') {
      let n = 1;
      while (text[i + n] === '`') n += 1;
      const ticks = '`'.repeat(n);
      const end = next(ticks, i + n);
      if (end < 0) {
        i += n;
        continue;
      }
      const element = document.createElement('code');
      element.textContent = text.slice(i + n, end);
      span(element, i, end + n);
    } else if (c === '*' || c === '_') {
      const mark = text[i + 1] === c ? c + c : c;
      const start = i + mark.length;
      const opens = start < text.length && !SPACE.test(text[start]) && !(c === '_' && WORD.test(text[i - 1] ?? ''));
      let end = opens ? next(mark, start + 1) : -1;
      if (end > 0 && mark.length === 2 && text[end + 2] === c) end += 1; // ***both***: the inner * is the em's
      const closes = end > 0 && !SPACE.test(text[end - 1]) && !(c === '_' && WORD.test(text[end + mark.length] ?? ''));
      if (!closes) {
        i += mark.length;
        continue;
      }
      const element = document.createElement(EMPHASIS[mark]);
      appendInline(element, text.slice(start, end));
      span(element, i, end + mark.length);
    } else {
      i += 1;
    }
  }
  parent.append(text.slice(plain));
}

/**
 * `next(mark, from)`: text.indexOf(mark, from) for `from` that only grow, reading each part of the text
 * at most once per mark: a search that ended at p answers every later search that starts at or before p.
 */
function forwardFinder(text) {
  const last = new Map(); // mark -> where its latest search ended (-1: no more)
  return (mark, from) => {
    const found = last.get(mark);
    if (found !== undefined && (found === -1 || found >= from)) return found;
    const at = text.indexOf(mark, from);
    last.set(mark, at);
    return at;
  };
}
