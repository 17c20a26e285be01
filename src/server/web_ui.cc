// The page of GET /. It posts to /v1/completions or /v1/chat/completions with stream and stream_canvas,
// reads the server-sent events with fetch(), and redraws the canvas after every step.
#include "server/web_ui.h"

namespace dc::server {
namespace {

constexpr std::string_view kPage = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>diffucoder.cpp</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em; max-width: 70em; }
textarea { width: 100%; height: 7em; font-family: monospace; }
fieldset { margin: .8em 0; }
label { margin-right: 1em; }
input[type=number] { width: 5em; }
#canvas { font-family: monospace; white-space: pre-wrap; border: 1px solid #999; padding: .6em; min-height: 6em; background: #fafafa; }
#canvas .mask { color: #bbb; }
#canvas .new { background: #ffe58a; }
#status { margin: .6em 0; color: #333; }
#error { color: #b00; }
</style>
</head>
<body>
<h1>diffucoder.cpp</h1>
<textarea id="prompt" placeholder="Write a Python function that checks whether a number is prime.">Write a Python function that checks whether a number is prime.</textarea>
<fieldset><legend>Settings</legend>
<label><input type="checkbox" id="chat" checked> chat</label>
<label>max_tokens <input type="number" id="max_tokens" value="64" min="1"></label>
<label>steps <input type="number" id="steps" value="64" min="1"></label>
<label>alg <select id="alg"><option>entropy</option><option>maskgit_plus</option><option>topk_margin</option><option>origin</option></select></label>
<label>temperature <input type="number" id="temperature" value="0" step="0.1" min="0"></label>
<label>top_p <input type="number" id="top_p" value="1" step="0.05" min="0.01" max="1"></label>
<label>seed <input type="number" id="seed" value="0"></label>
</fieldset>
<button id="go">Generate</button>
<div id="status"></div>
<div id="error"></div>
<div id="canvas"></div>
<h3>Completion</h3>
<pre id="text"></pre>
<script>
const $ = (id) => document.getElementById(id);
function esc(s) { return s.replace(/[&<>]/g, (c) => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'}[c])); }
let previous = [];
function draw(ev) {
  const row = ev.rows[0];
  let html = '';
  row.forEach((p, i) => {
    if (p === null) html += '<span class="mask">\u2591</span>';
    else html += '<span class="' + (previous[i] === null ? 'new' : '') + '">' + esc(p) + '</span>';
  });
  previous = row;
  $('canvas').innerHTML = html;
}
async function generate() {
  $('error').textContent = ''; $('text').textContent = ''; $('canvas').textContent = ''; previous = [];
  const chat = $('chat').checked;
  const body = {
    max_tokens: +$('max_tokens').value, steps: +$('steps').value, alg: $('alg').value,
    temperature: +$('temperature').value, top_p: +$('top_p').value, seed: +$('seed').value,
    stream: true, stream_canvas: true,
  };
  if (chat) body.messages = [{role: 'user', content: $('prompt').value}]; else body.prompt = $('prompt').value;
  const t0 = performance.now();
  let steps = 0, text = '';
  const res = await fetch(chat ? '/v1/chat/completions' : '/v1/completions', {
    method: 'POST', headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)});
  if (!res.ok) { const e = await res.json(); $('error').textContent = res.status + ': ' + e.error.message; return; }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buf += decoder.decode(value, {stream: true});
    let at;
    while ((at = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, at); buf = buf.slice(at + 2);
      let event = '', data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('event: ')) event = line.slice(7);
        else if (line.startsWith('data: ')) data += line.slice(6);
      }
      if (!data) continue;
      if (data === '[DONE]') { $('status').textContent += ' \u2014 done'; document.body.dataset.done = '1'; continue; }
      const ev = JSON.parse(data);
      if (ev.error) { $('error').textContent = ev.error.message; continue; }
      if (event === 'canvas') {
        steps = ev.step; draw(ev);
        const ms = performance.now() - t0;
        $('status').textContent = 'step ' + ev.step + ' / ' + ev.n_steps + ' \u2014 ' + ms.toFixed(0) + ' ms (' + (ms / ev.step).toFixed(1) + ' ms/step)';
        // Show every step as a frame of its own, even when several arrive in one network read.
        await new Promise((resolve) => requestAnimationFrame(() => resolve()));
      } else if (ev.choices && ev.choices.length) {
        const c = ev.choices[0];
        text += chat ? (c.delta.content || '') : (c.text || '');
        $('text').textContent = text;
      }
    }
  }
}
// One generation at a time: a second click would start a second stream into the same canvas.
$('go').addEventListener('click', () => {
  if ($('go').disabled) return;
  $('go').disabled = true; document.body.dataset.done = '';
  generate().catch((e) => { $('error').textContent = String(e); }).finally(() => { $('go').disabled = false; });
});
</script>
</body>
</html>
)HTML";

}  // namespace

std::string_view web_page() { return kPage; }

}  // namespace dc::server
