// Chat templates are untrusted code: hostile ones end, within bounds, in an error naming the template.
// The cases are shared with the Python test (tests/data/hostile_templates.json); each test has a
// timeout, so a template that hangs fails instead of hanging the suite.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { ChatTemplate } from '../src/text/chat-template.js';
import { RuvLLMError } from '../src/errors.js';

const { cases } = JSON.parse(readFileSync(new URL('../../tests/data/hostile_templates.json', import.meta.url)));
const MESSAGES = [{ role: 'user', content: 'hi' }];

for (const c of cases) {
  test(`a hostile template fails cleanly naming the template: ${c.name}`, { timeout: 30_000 }, () => {
    const template = new ChatTemplate(c.template, {}, 'models/x/tokenizer_config.json');
    assert.throws(
      () => template.render(MESSAGES),
      (e) => {
        assert.ok(e instanceof RuvLLMError, `not a RuvLLMError: ${e}`);
        assert.equal(e.type, c.type, e.message);
        assert.ok(e.message.includes(c.js), e.message);
        if (c.type === 'load')
          assert.ok(e.message.startsWith('the chat_template in models/x/tokenizer_config.json fails: '), e.message);
        return true;
      },
    );
  });
}

test('a template that does not parse is a load error', () => {
  assert.throws(
    () => new ChatTemplate('{% for %}', {}, 't/tokenizer_config.json'),
    (e) => e.type === 'load' && e.message.startsWith('the chat_template in t/tokenizer_config.json does not parse: '),
  );
});

test('bounds leave ordinary templates alone, with the globals templates use', () => {
  const template = new ChatTemplate(
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m['role'] }}: {{ m['content'] }}{% endfor %}{{ ns.n }}{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ true }}{{ none is none }}{{ bos_token }}",
    { bos_token: '<s>' },
  );
  assert.equal(template.render(MESSAGES), 'user: hi1[0, 1, 2][1, 3, 5]truetrue<s>');
  assert.match(new ChatTemplate("{{ strftime_now('%d %b %Y') }}").render(MESSAGES), /^\d\d [A-Z][a-z]{2} \d{4}$/);
});

test('tools reach the template as `tools` (null without them), and tool-calling messages render', () => {
  const template = new ChatTemplate(
    '{% if tools %}{% for t in tools %}{{ t.function.name }};{% endfor %}{% else %}{{ tools is none }};{% endif %}' +
      '{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}' +
      '{% else %}{{ m.content }}{% endif %}{% if m.tool_call_id %}@{{ m.tool_call_id }}{% endif %}|{% endfor %}',
  );
  const call = { id: 'c1', type: 'function', function: { name: 'f', arguments: { city: 'Paris' } } };
  const messages = [
    { role: 'user', content: 'hi' },
    { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: 'c1', content: '21' },
  ];
  const tools = [{ type: 'function', function: { name: 'f', parameters: {} } }];
  const rendered = 'user:hi|assistant:{"city": "Paris"}|tool:21@c1|';
  assert.equal(template.render(messages, { tools }), `f;${rendered}`);
  assert.equal(template.render(messages), `true;${rendered}`);
  assert.equal(template.render(messages, { tools: null }), `true;${rendered}`);
});
