import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';

import { RuvLLMError } from '../src/errors.js';
import {
  HF_FORMS,
  hubHeaders,
  hubLocation,
  hubName,
  hubToken,
  isHubName,
  modelName,
  parseHubName,
  resolveModel,
} from '../src/hub.js';

test('hf: names of a folder resolve to the base URL of the repo at its revision', () => {
  assert.deepEqual(resolveModel('hf:HuggingFaceTB/SmolLM2-135M-Instruct'), {
    url: 'https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct/resolve/main/',
    kind: 'folder',
  });
  assert.deepEqual(resolveModel('hf:owner/repo@v1.0', { hfEndpoint: 'http://127.0.0.1:8080/mirror/' }), {
    url: 'http://127.0.0.1:8080/mirror/owner/repo/resolve/v1.0/',
    kind: 'folder',
  });
});

test('hf: names of a GGUF file resolve to its URL, each path segment quoted', () => {
  assert.deepEqual(resolveModel('hf:Org-1/Repo_2.x/model.Q4_0.gguf'), {
    url: 'https://huggingface.co/Org-1/Repo_2.x/resolve/main/model.Q4_0.gguf',
    kind: 'gguf',
  });
  assert.deepEqual(resolveModel("hf:owner/repo@0123abcd/sub dir/a#b(1)'.gguf", { hfEndpoint: 'http://h:1' }), {
    url: 'http://h:1/owner/repo/resolve/0123abcd/sub%20dir/a%23b%281%29%27.gguf',
    kind: 'gguf',
  });
});

test('parseHubName gives owner, repo, revision and file', () => {
  assert.deepEqual(parseHubName('hf:owner/repo'), { owner: 'owner', repo: 'repo', revision: 'main', file: null });
  assert.deepEqual(parseHubName('hf:owner/repo@v2/sub/dir/x.gguf'), {
    owner: 'owner',
    repo: 'repo',
    revision: 'v2',
    file: 'sub/dir/x.gguf',
  });
  assert.ok(isHubName('hf:x'));
  assert.ok(!isHubName('https://host/hf:x'));
  assert.ok(!isHubName(undefined));
});

test("hubLocation says where a model's files are in its repo (Node keeps them there); hubName is the canonical form", () => {
  assert.deepEqual(hubLocation('hf:owner/repo'), { owner: 'owner', repo: 'repo', revision: 'main', dir: '' });
  assert.deepEqual(hubLocation('hf:owner/repo@v2/sub/dir/x.gguf'), {
    owner: 'owner',
    repo: 'repo',
    revision: 'v2',
    dir: 'sub/dir/',
  });
  assert.equal(hubLocation('hf:owner/repo/x.gguf').dir, '');
  assert.equal(hubLocation('https://host/models/x.gguf'), null);
  for (const name of ['hf:owner/repo', 'hf:owner/repo@v2', 'hf:owner/repo@v2/sub/x.gguf']) {
    assert.equal(hubName(parseHubName(name)), name); // hub.py's HubModel.name
  }
  assert.equal(hubName(parseHubName('hf:owner/repo@main/x.gguf')), 'hf:owner/repo/x.gguf');
});

test('other models are returned as they are, a GGUF file when they end in .gguf', () => {
  for (const [model, kind] of [
    ['https://host/models/smollm2/', 'folder'],
    ['https://host/models/smollm2', 'folder'],
    ['https://host/m/SmolLM2.Q4_1.gguf', 'gguf'],
    ['https://host/m/SmolLM2.Q4_1.GGUF?download=true#x', 'gguf'],
    ['https://host/m/folder?name=x.gguf', 'folder'],
    ['./models/smollm2-135m-instruct', 'folder'],
    ['/data/model.gguf', 'gguf'],
  ])
    assert.deepEqual(resolveModel(model, { hfEndpoint: 'http://unused' }), { url: model, kind });
});

test('malformed hf: names are invalid_argument errors that say the accepted forms', () => {
  for (const [name, why] of [
    ['hf:', "owner ''"],
    ['hf:owner', "repo ''"],
    ['hf:owner/', "repo ''"],
    ['hf:owner/repo/', "ends with '/'"],
    ['hf:owner/repo@', "revision ''"],
    ['hf:owner/repo@refs/pr/1', "file 'pr/1' is not a .gguf"],
    ['hf:owner/repo/config.json', 'is not a .gguf file'],
    ['hf:owner/repo/sub', 'is not a .gguf file'],
    ['hf:owner/repo/../x.gguf', "'..' segment"],
    ['hf:owner/repo//x.gguf', 'empty'],
    ['hf:own er/repo', "owner 'own er'"],
    ['hf:owner/re..po', "repo 're..po'"],
    ['hf:-owner/repo', "owner '-owner'"],
  ]) {
    assert.throws(
      () => resolveModel(name),
      (error) => {
        assert.ok(error instanceof RuvLLMError);
        assert.equal(error.type, 'invalid_argument');
        assert.ok(error.message.includes(why), error.message);
        assert.ok(error.message.includes(HF_FORMS), error.message);
        return true;
      },
      name,
    );
  }
  assert.throws(() => parseHubName('owner/repo'), { message: /does not start with 'hf:'/ });
});

test("a model's name in OpenAI answers is the last segment of its location, without .gguf", () => {
  for (const [model, name] of [
    ['/work/models/smollm2-135m-instruct', 'smollm2-135m-instruct'],
    ['models/smollm2-135m-instruct/', 'smollm2-135m-instruct'],
    ['https://host/models/smollm2/?token=x', 'smollm2'],
    ['https://host/files/gemma-3-270m-it-Q4_K_M.gguf#part', 'gemma-3-270m-it-Q4_K_M'],
    ['C:\\models\\tiny.GGUF', 'tiny'],
    ['hf:HuggingFaceTB/SmolLM2-135M-Instruct', 'SmolLM2-135M-Instruct'],
    ['hf:unsloth/gemma-3-270m-it-GGUF@v1/sub/gemma-3-270m-it-Q4_K_M.gguf', 'gemma-3-270m-it-Q4_K_M'],
  ])
    assert.equal(modelName(model), name, model);
});

test('the token comes from hfToken, else HF_TOKEN, and goes only to URLs of the hub endpoint', (t) => {
  const saved = process.env.HF_TOKEN;
  t.after(() => (saved === undefined ? delete process.env.HF_TOKEN : (process.env.HF_TOKEN = saved)));
  delete process.env.HF_TOKEN;
  assert.equal(hubToken(), null);
  assert.deepEqual(hubHeaders('https://huggingface.co/o/r/resolve/main/x.gguf'), {});
  process.env.HF_TOKEN = ' hf_env ';
  assert.equal(hubToken(), 'hf_env');
  assert.equal(hubToken('hf_option'), 'hf_option');
  const endpoint = { hfEndpoint: 'http://127.0.0.1:8080/mirror/' };
  assert.deepEqual(hubHeaders('https://huggingface.co/o/r/resolve/main/x.gguf'), { Authorization: 'Bearer hf_env' });
  assert.deepEqual(hubHeaders('http://127.0.0.1:8080/o/r/resolve/main/x.gguf', endpoint), {
    Authorization: 'Bearer hf_env',
  });
  for (const url of [
    'http://127.0.0.1:8081/o/r/resolve/main/x.gguf', // another port
    'https://127.0.0.1:8080/o/r/resolve/main/x.gguf', // another scheme
    'http://localhost:8080/o/r/resolve/main/x.gguf', // another host
    'https://cdn-lfs.hf.co/repos/ab/cd/sha256', // the hub's CDN
    'file:///etc/passwd',
    'not a URL',
  ])
    assert.deepEqual(hubHeaders(url, endpoint), {}, url);
  assert.deepEqual(hubHeaders('https://huggingface.co/x', { hfToken: 'hf_option' }), {
    Authorization: 'Bearer hf_option',
  });
});

test('fetch() with hubHeaders sends the token to the hub and not to the CDN it redirects to', async (t) => {
  const seen = [];
  const listen = (handler) =>
    new Promise((resolve) => {
      const server = http.createServer(handler).listen(0, '127.0.0.1', () => resolve(server));
      t.after(() => server.close());
    });
  const cdn = await listen((request, response) => {
    seen.push(['cdn', request.headers.authorization ?? null]);
    response.end('GGUF');
  });
  const hub = await listen((request, response) => {
    seen.push(['hub', request.headers.authorization ?? null]);
    response.writeHead(302, { Location: `http://localhost:${cdn.address().port}/lfs/x.gguf` }).end();
  });
  const hfEndpoint = `http://127.0.0.1:${hub.address().port}`;
  const { url } = resolveModel('hf:o/r/x.gguf', { hfEndpoint });
  const response = await fetch(url, { headers: hubHeaders(url, { hfEndpoint, hfToken: 'hf_secret' }) });
  assert.equal(await response.text(), 'GGUF');
  assert.deepEqual(seen, [
    ['hub', 'Bearer hf_secret'],
    ['cdn', null],
  ]);
});
