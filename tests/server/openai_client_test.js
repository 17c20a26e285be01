// The official `openai` npm client, unchanged, against `diffucoder serve --api-key-file`: models,
// completions, chat, streaming chat (same text as non-streaming), an error surfacing as APIError with status
// and param, and a wrong key as AuthenticationError (401).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { arg, startServer, check } = require('./serve_util');

const OpenAI = require(path.resolve(arg('--npm'), 'openai'));

(async () => {
  const keyFile = path.join(os.tmpdir(), `dc_openai_keys_${process.pid}`);
  fs.writeFileSync(keyFile, '# keys of this test\nsk-test-one\nsk-test-two\n', { mode: 0o600 });
  const server = await startServer(arg('--binary'), arg('--model'), ['--model-name', 'tiny', '--api-key-file', keyFile]);
  try {
    const baseURL = `http://127.0.0.1:${server.port}/v1`;
    let denied;
    try {
      await new OpenAI({ baseURL, apiKey: 'sk-wrong', maxRetries: 0 }).models.list();
    } catch (e) {
      denied = e;
    }
    check(denied instanceof OpenAI.AuthenticationError && denied.status === 401 && denied.code === 'invalid_api_key',
          'a wrong key is AuthenticationError 401 invalid_api_key, got ' + denied);
    const client = new OpenAI({ baseURL, apiKey: 'sk-test-two', maxRetries: 0 });
    const models = await client.models.list();
    check(models.data.some((m) => m.id === 'tiny'), 'models.list has tiny');
    const c = await client.completions.create({ model: 'tiny', prompt: 'def f(x):', max_tokens: 8 });
    check(typeof c.choices[0].text === 'string' && c.usage.completion_tokens >= 0, 'completion');
    const params = { model: 'tiny', messages: [{ role: 'user', content: 'hello' }], max_tokens: 8, seed: 4 };
    const chat = await client.chat.completions.create(params);
    const want = chat.choices[0].message.content;
    check(typeof want === 'string' && chat.choices[0].message.role === 'assistant', 'chat completion');
    const stream = await client.chat.completions.create({ ...params, stream: true });
    let got = '';
    for await (const chunk of stream) got += chunk.choices[0]?.delta?.content || '';
    check(got === want, `streamed text ${JSON.stringify(got)} equals ${JSON.stringify(want)}`);
    let error;
    try {
      await client.completions.create({ model: 'tiny', prompt: 'x', temperature: 7 });
    } catch (e) {
      error = e;
    }
    check(error instanceof OpenAI.APIError && error.status === 400 && error.param === 'temperature',
          'APIError 400 param temperature, got ' + error);
    console.log('openai client ok: ' + JSON.stringify(want));
  } finally {
    server.stop();
    fs.unlinkSync(keyFile);
  }
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
