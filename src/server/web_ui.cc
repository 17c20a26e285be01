// The page of GET /. It posts to /v1/completions or /v1/chat/completions with stream and stream_canvas
// "changes", reads the server-sent events with fetch(), applies each step's changes to the canvas (the first
// event holds it whole) and redraws it.
#include "server/web_ui.h"

#include <string_view>

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
#text { white-space: pre-wrap; overflow-wrap: anywhere; border: 1px solid #ddd; padding: .6em; }
#keyrow { display: none; margin: .6em 0; }
body[data-needs-key="1"] #keyrow { display: block; }
</style>
</head>
<body data-needs-key="@NEEDS_KEY@">
<h1>diffucoder.cpp</h1>
<div id="keyrow"><label>API key <input type="password" id="key" size="40" autocomplete="off"></label>
(this server needs one; it is kept in this tab only)</div>
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
let previous = [], rows = [];
function draw(ev) {
  previous = rows.length ? rows[0].slice() : [];
  if (ev.rows) rows = ev.rows;
  else for (const [r, i, p] of ev.changes) rows[r][i] = p;
  const row = rows[0];
  let html = '';
  row.forEach((p, i) => {
    if (p === null) html += '<span class="mask">\u2591</span>';
    else html += '<span class="' + (previous[i] === null ? 'new' : '') + '">' + esc(p) + '</span>';
  });
  $('canvas').innerHTML = html;
}
async function generate() {
  $('error').textContent = ''; $('text').textContent = ''; $('canvas').textContent = ''; previous = []; rows = [];
  const chat = $('chat').checked;
  const body = {
    max_tokens: +$('max_tokens').value, steps: +$('steps').value, alg: $('alg').value,
    temperature: +$('temperature').value, top_p: +$('top_p').value, seed: +$('seed').value,
    stream: true, stream_canvas: 'changes',
  };
  if (chat) body.messages = [{role: 'user', content: $('prompt').value}]; else body.prompt = $('prompt').value;
  const headers = {'Content-Type': 'application/json'};
  const key = $('key').value.trim();
  if (key) { headers.Authorization = 'Bearer ' + key; sessionStorage.setItem('dc_key', key); }
  const t0 = performance.now();
  let steps = 0, text = '';
  const res = await fetch(chat ? '/v1/chat/completions' : '/v1/completions', {
    method: 'POST', headers, body: JSON.stringify(body)});
  if (!res.ok) {
    const e = await res.json();
    $('error').textContent = res.status + ': ' + e.error.message + (res.status === 401 ? ' Enter the API key above.' : '');
    if (res.status === 401) { $('keyrow').style.display = 'block'; $('key').focus(); }
    return;
  }
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
$('key').value = sessionStorage.getItem('dc_key') || '';
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

std::string web_page(bool needs_key) {
  static constexpr std::string_view kMark = "@NEEDS_KEY@";
  const size_t at = kPage.find(kMark);
  std::string page(kPage.substr(0, at));
  page += needs_key ? '1' : '0';
  page += kPage.substr(at + kMark.size());
  return page;
}

}  // namespace dc::server
