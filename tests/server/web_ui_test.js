// The page at / in headless Chromium (Debian's `chromium`, driven by playwright-core): generate with the
// live canvas and check that masks were drawn and then all resolved, step by step. Exits 77 (ctest SKIP)
// only when chromium is not installed.
'use strict';
const fs = require('fs');
const path = require('path');
const { arg, startServer, check } = require('./serve_util');

const chromiumPath = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));
if (!chromiumPath) {
  console.log('SKIP: chromium is not installed (apt-get install chromium)');
  process.exit(77);
}
const { chromium } = require(path.resolve(arg('--npm'), 'playwright-core'));

(async () => {
  const server = await startServer(arg('--binary'), arg('--model'));
  let browser;
  try {
    browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
    const page = await browser.newPage();
    const notFound = [];  // issue 23: no 404 on load (the browser's favicon request)
    page.on('response', (r) => { if (r.status() === 404) notFound.push(r.url()); });
    await page.goto(`http://127.0.0.1:${server.port}/`);
    await page.fill('#max_tokens', '8');
    await page.fill('#steps', '4');
    await page.evaluate(() => {  // record how many masks each redraw shows
      window.maskCounts = [];
      new MutationObserver(() => window.maskCounts.push(document.querySelectorAll('#canvas .mask').length))
        .observe(document.getElementById('canvas'), { childList: true });
      window.goDisabled = [];  // the Generate button while a generation streams
      new MutationObserver(() => window.goDisabled.push(document.getElementById('go').disabled))
        .observe(document.getElementById('go'), { attributes: true });
    });
    await page.click('#go');
    await page.waitForSelector('body[data-done="1"]', { timeout: 60000 });
    await page.waitForSelector('#go:not([disabled])', { timeout: 10000 });
    const goDisabled = await page.evaluate(() => window.goDisabled);
    check(goDisabled[0] === true && goDisabled[goDisabled.length - 1] === false,
      'Generate disabled while streaming, then enabled, got ' + JSON.stringify(goDisabled));
    check(notFound.length === 0, 'no 404 while loading the page, got ' + JSON.stringify(notFound));
    const counts = await page.evaluate(() => window.maskCounts);
    const status = await page.textContent('#status');
    const error = await page.textContent('#error');
    const cells = await page.evaluate(() => document.querySelectorAll('#canvas span').length);
    check(error === '', 'no error shown, got: ' + error);
    check(cells === 8, '8 canvas cells, got ' + cells);
    check(counts.some((c) => c > 0), 'a redraw with masks, got ' + JSON.stringify(counts));
    check(counts[counts.length - 1] === 0, 'no mask at the end, got ' + JSON.stringify(counts));
    check(/step 4 \/ 4/.test(status), 'status shows step 4 / 4, got: ' + status);
    // The finished completion wraps inside the window (issue 20: it ran off it as one line), also a
    // completion that is one long word.
    await page.setViewportSize({ width: 1280, height: 800 });
    const fits = () => page.evaluate(() => {
      const t = document.getElementById('text');
      return t.scrollWidth <= t.clientWidth && t.getBoundingClientRect().right <= window.innerWidth;
    });
    check(await fits(), 'the completion fits the window');
    await page.evaluate(() => { document.getElementById('text').textContent = 'x = 1; '.repeat(300) + 'y'.repeat(3000); });
    check(await fits(), 'a long completion wraps inside the window');
    console.log('web UI ok: mask counts per redraw ' + JSON.stringify(counts) + '; ' + status);
  } finally {
    if (browser) await browser.close();
    server.stop();
  }
  // With an API key the page asks for it: a generation without it shows the 401, with it completes.
  const keyed = await startServer(arg('--binary'), arg('--model'), ['--api-key', 'sk-page']);
  try {
    browser = await chromium.launch({ executablePath: chromiumPath, args: ['--no-sandbox'] });
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${keyed.port}/`);
    check(await page.isVisible('#key'), 'the key field is shown');
    await page.fill('#max_tokens', '4');
    await page.fill('#steps', '2');
    await page.click('#go');
    await page.waitForSelector('#go:not([disabled])', { timeout: 10000 });
    const denied = await page.textContent('#error');
    check(/^401: .*API key/.test(denied), 'without the key: the 401 and what to do, got: ' + denied);
    await page.fill('#key', 'sk-page');
    await page.click('#go');
    await page.waitForSelector('body[data-done="1"]', { timeout: 60000 });
    check(await page.textContent('#error') === '', 'with the key: no error');
    console.log('web UI with a key ok: ' + denied);
  } finally {
    if (browser) await browser.close();
    keyed.stop();
  }
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
