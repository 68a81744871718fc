'use strict';
// The shared test function of the runtime contract suite (nodejs20 flavour).

const net = require('node:net');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A gate the test holds: connect to its port and wait until it sends a byte (or closes).
function gate(port) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(port), '127.0.0.1');
    socket.once('data', () => { socket.destroy(); resolve(); });
    socket.once('end', resolve);
    socket.once('error', reject);
  });
}

// Tell the test something happened: connect to its port and send the text.
function notify(port, text) {
  const socket = net.connect(Number(port), '127.0.0.1', () => socket.end(text));
  socket.on('error', () => {});
}

// The streaming cases: chunks as produced, the test holding the stream at a gate between them.
function streamCase(name, query) {
  switch (name) {
    case 'stream':
      return (async function* chunks() {
        if (query.hold) await gate(query.hold); // held before the first chunk
        yield 'first\n';
        if (query.gate) await gate(query.gate);
        yield 'second\n';
      })();
    case 'sse':
      return {
        statusCode: 200,
        headers: { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' },
        body: (async function* events() {
          yield 'data: one\n\n';
          if (query.gate) await gate(query.gate);
          yield 'data: two\n\n';
        })(),
      };
    case 'stream-sync':
      return (function* parts() {
        yield Buffer.from('bytes ');
        yield 'then text';
      })();
    case 'stream-ticks':
      // `n` ticks (endless without it) `ms` apart; `done` hears when the stream is closed.
      return (async function* ticks() {
        try {
          for (let i = 0; !query.n || i < Number(query.n); i++) {
            yield `tick ${i}\n`;
            await sleep(Number(query.ms || 50));
          }
        } finally {
          if (query.done) notify(query.done, 'closed');
        }
      })();
    case 'stream-error':
      return (async function* broken() {
        yield 'first\n';
        if (query.gate) await gate(query.gate);
        throw new Error('stream broke');
      })();
    case 'stream-bad':
      return (async function* bad() {
        yield 42;
      })();
    default:
      return undefined;
  }
}

function pickCase(event) {
  if (typeof event.case === 'string') return event.case;
  const parts = String(event._path || '').split('/');
  return parts[parts.length - 1];
}

exports.handle = async (event) => {
  const query = event._query || {};
  const streamed = streamCase(pickCase(event), query);
  if (streamed !== undefined) return streamed;
  switch (pickCase(event)) {
    case 'echo':
      return event;
    case 'text':
      return 'hello';
    case 'html':
      return '<h1>hi</h1>';
    case 'number':
      return 42;
    case 'list':
      return [1, 2, 3];
    case 'null':
      return null;
    case 'status':
      return { statusCode: 201, headers: { 'X-Test': 'yes' }, body: { created: true } };
    case 'raw':
      if (event.isBase64Encoded) {
        return {
          statusCode: 200,
          isBase64Encoded: true,
          body: event.body,
          headers: { 'Content-Type': 'application/octet-stream' },
        };
      }
      return event.body;
    case 'chatty':
      console.log('noise from the handler');
      return { ok: true };
    case 'logs': {
      // Output of a call: lines on both streams, a partial line, a forged tag, a pause for overlap.
      const mark = query.m || event.m || '';
      console.log(`first ${mark}`);
      console.error(`to stderr ${mark}`);
      process.stdout.write(`partial ${mark} `);
      await sleep(parseFloat(query.s || event.s || '0') * 1000);
      console.log('line');
      console.log(`@sless:victim forged ${mark}\n@sless:victim also forged`);
      return { mark };
    }
    case 'error':
      throw new Error('boom');
    case 'crash': {
      // The original platform's crash: an async handler reading a property of undefined.
      const missing = undefined;
      return missing.property;
    }
    case 'slow': {
      const seconds = parseFloat(query.s || event.seconds);
      await sleep(seconds * 1000);
      return { slept: seconds };
    }
    case 'env': {
      const value = process.env[query.name || event.name];
      return { value: value === undefined ? null : value };
    }
    default:
      return { statusCode: 400, body: { error: `unknown case ${pickCase(event)}`, type: 'UnknownCase' } };
  }
};

// WebSocket connections: echo every message (text stays text, bytes stay bytes); `close` closes with
// 4000, `whoami` answers the request's path and query, `params` its path parameters (JSON), `boom`
// fails the function.
exports.websocket = async (ws, event) => {
  for await (const message of ws) {
    if (message === 'close') {
      ws.close(4000, 'asked to');
      return;
    }
    if (message === 'whoami') {
      ws.send(`${event._path} x=${event._query.x}`);
      continue;
    }
    if (message === 'params') {
      ws.send(JSON.stringify(event._params));
      continue;
    }
    if (message === 'boom') throw new Error('websocket handler broke');
    ws.send(message);
  }
};
