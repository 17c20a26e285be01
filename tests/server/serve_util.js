// Shared by the node tests of tests/server: starts `diffucoder serve` on a free loopback port and stops it.
'use strict';
const { spawn } = require('child_process');

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

// Resolves { port, stop() } once the server prints its address; rejects when it exits first.
function startServer(binary, model, extra = []) {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, ['serve', '--model', model, '--port', '0', '--threads', '2', ...extra],
                        { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    child.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/on http:\/\/[^:]+:(\d+)/);
      if (m) resolve({ port: Number(m[1]), stop: () => { child.removeAllListeners('exit'); child.kill('SIGTERM'); } });
    });
    child.on('exit', (code) => reject(new Error('server exited (' + code + '): ' + log)));
  });
}

function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
}

module.exports = { arg, startServer, check };
