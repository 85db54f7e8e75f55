// The express-rate-limit sites of the real-limiter benchmark, in one Node process.
//
// Usage: node benchmarks/real_limiters_express.js plan.json
//
// plan.json lists "sites", each {"port", "log", "window_ms", "limit"}: an
// express app whose only middleware is rateLimit({windowMs, limit}) with
// express-rate-limit's defaults otherwise (its MemoryStore: a fixed window
// per client that opens at its first request and counts refused requests
// too; X-RateLimit-Limit, -Remaining and -Reset, the window's end rounded up
// to a whole epoch second, on every response; Retry-After, the seconds left
// rounded up, on refusals only; refusals are 429s), then a 200 "ok". Each
// request appends one line to its site's log, written at once: arrival and
// answer (epoch seconds), status and the Retry-After sent (0 if none). The
// process serves until it is terminated.
'use strict';

const fs = require('node:fs');
const express = require('express');
const { rateLimit } = require('express-rate-limit');

const epoch = () => (performance.timeOrigin + performance.now()) / 1000;

function site({ port, log, window_ms: windowMs, limit }) {
  const fd = fs.openSync(log, 'a');
  const app = express();
  app.use((request, response, next) => {
    const arrived = epoch();
    response.on('finish', () => {
      const wait = response.getHeader('Retry-After') ?? 0;
      fs.writeSync(fd, `${arrived.toFixed(6)} ${epoch().toFixed(6)} ${response.statusCode} ${wait}\n`);
    });
    next();
  });
  app.use(rateLimit({ windowMs, limit }));
  app.use((request, response) => response.send('ok'));
  app.listen(port, '127.0.0.1');
}

const plan = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
plan.sites.forEach(site);
