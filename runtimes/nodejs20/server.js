// @ts-check
'use strict';
/**
 * sless nodejs20 HTTP wrapper: loads the user's handler once, then calls it once
 * per request (see runtimes/README.md and the runtime contract).
 *
 * One event loop serves every connection, so async handlers run concurrently;
 * a synchronous handler that never returns blocks the whole process (documented).
 */

const fs = require('node:fs');
const http = require('node:http');
const net = require('node:net');
const rt = require('./sless-runtime.js');
const ws = require('./sless-ws.js');

/**
 * Idle keep-alive connections live longer than any upstream pool keeps them
 * (the invoke proxy, ingress controllers, load balancers use <= 60 s), so the
 * client side always closes first and never sends into a connection this side
 * is closing at the same moment (that race shows up as sporadic 502s).
 */
const KEEP_ALIVE_TIMEOUT_MS = 65_000;

/** setTimeout's limit; longer timeouts would fire at once. */
const MAX_TIMER_MS = 2_147_483_647;

const EMPTY = Buffer.alloc(0);
const HEALTH_OK = rt.toHttpResult({ status: 'ok' });
/** Response headers only the runtime sets: a handler's own of these names are dropped. */
const RUNTIME_HEADERS = [rt.HANDLER_MS_HEADER, rt.OUTPUT_HEADER];

/**
 * Drop the handler's own X-Sless-Handler-Ms and X-Sless-Output (any case).
 * @param {Record<string, string | string[]>} headers
 */
function dropRuntimeHeaders(headers) {
  for (const name of Object.keys(headers)) {
    if (RUNTIME_HEADERS.includes(name.toLowerCase())) delete headers[name];
  }
}

/**
 * The answer carries the lines its call wrote until now in X-Sless-Output (none: no header).
 * @param {Record<string, string | string[]>} headers
 * @param {import('./sless-runtime.js').Call} call
 */
function addOutput(headers, call) {
  const output = rt.takeOutput(call);
  if (output !== undefined) headers[rt.OUTPUT_HEADER] = output;
}

/**
 * @param {import('./sless-runtime.js').Config} config
 * @param {(event: object, context: object) => unknown} handler
 * @param {((socket: import('./sless-ws.js').WebSocket, event: object) => unknown) | undefined} [wsHandler]
 *   the function's `websocket` export, when it has one
 * @param {http.Server} [server] a server that listens already (a warm spare's): it gets the listeners
 */
function createServer(config, handler, wsHandler, server = http.createServer({ noDelay: true })) {
  const timeoutSec = Math.min(config.timeoutSec, MAX_TIMER_MS / 1000);
  let inFlight = 0;
  let draining = false;
  /** @type {(() => void) | undefined} */
  let onIdle;

  /**
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   * @param {import('./sless-runtime.js').HttpResult} result
   */
  function send(req, res, result) {
    if (res.headersSent || res.destroyed) return;
    const { status } = result;
    const headers = result.headers;
    const bodyless = status === 204 || status === 304;
    if (!bodyless) headers['content-length'] = String(result.body.length);
    if (draining) headers.connection = 'close';
    try {
      res.writeHead(status, headers);
    } catch (err) {
      // An invalid header name/value from the handler: nothing has been written yet.
      rt.logError('invalid response from handler', err);
      const fallback = rt.errorResult(500, `invalid response: ${rt.describeError(err).error}`, 'InvalidResponse');
      for (const name of RUNTIME_HEADERS) {
        if (headers[name] !== undefined) fallback.headers[name] = headers[name]; // the call's, not the handler's
      }
      fallback.headers['content-length'] = String(fallback.body.length);
      if (draining) fallback.headers.connection = 'close';
      res.writeHead(500, fallback.headers);
      res.end(fallback.body);
      return;
    }
    res.end(bodyless ? undefined : result.body);
  }

  /**
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   */
  function tooLarge(req, res) {
    const result = rt.errorResult(413, `request body exceeds ${config.maxBodyBytes} bytes`, 'PayloadTooLarge');
    result.headers.connection = 'close';
    send(req, res, result);
  }

  /**
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   * @param {string} url
   */
  function reserved(req, res, url) {
    const q = url.indexOf('?');
    const p = q === -1 ? url : url.slice(0, q);
    if (p === '/_/health') {
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        const result = rt.errorResult(405, `method ${req.method} not allowed on ${p}`, 'MethodNotAllowed');
        result.headers.allow = 'GET, HEAD';
        send(req, res, result);
      } else {
        send(req, res, { ...HEALTH_OK, headers: { ...HEALTH_OK.headers } });
      }
      return;
    }
    send(req, res, rt.errorResult(404, `no such path: ${p}`, 'NotFound'));
  }

  /**
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   * @param {Buffer} body
   */
  function dispatch(req, res, body) {
    const url = req.url || '/';
    if (url.startsWith('/_/')) {
      reserved(req, res, url);
      return;
    }
    const event = rt.buildEvent(req.method || 'GET', url, req.rawHeaders, body);
    const call = new rt.Call(rt.callIdFrom(req.headers['x-request-id']), true);
    rt.runAsCall(call, () => invokeAndAnswer(req, res, url, event, call));
  }

  /**
   * Run the handler as `call` and answer with its result, run time and output.
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   * @param {string} url
   * @param {object} event
   * @param {import('./sless-runtime.js').Call} call
   */
  function invokeAndAnswer(req, res, url, event, call) {
    const began = process.hrtime.bigint();
    /** @param {import('./sless-runtime.js').HttpResult} result */
    const answer = (result) => {
      rt.endCall(call);
      dropRuntimeHeaders(result.headers);
      result.headers[rt.HANDLER_MS_HEADER] = (Number(process.hrtime.bigint() - began) / 1e6).toFixed(3);
      addOutput(result.headers, call);
      send(req, res, result);
    };
    const context = new rt.InvocationContext(Date.now() + timeoutSec * 1000);
    rt.invoke(handler, event, timeoutSec, context).then(
      (value) => {
        let result;
        try {
          result = rt.toHttpResult(value);
        } catch (err) {
          rt.logError(`cannot send the result of ${req.method} ${url}`, err);
          result = rt.errorResult(500, rt.describeError(err).error, 'InvalidResponse');
        }
        if (result.stream) {
          streamAnswer(req, res, url, result, context, began, call);
          return;
        }
        answer(result);
      },
      (err) => {
        if (err instanceof rt.TimeoutError) {
          process.stderr.write(`sless-runtime: ${req.method} ${url}: ${err.message}\n`);
          answer(rt.errorResult(504, err.message, 'Timeout'));
          return;
        }
        rt.logError(`handler failed on ${req.method} ${url}`, err);
        const { error, type } = rt.describeError(err);
        answer(rt.errorResult(500, rt.publicMessage(error, config), type));
      },
    );
  }

  /**
   * Send a streamed result chunk by chunk as it is produced (chunked transfer
   * encoding, each chunk written at once). The head goes out with the first
   * chunk, so a stream that fails or stalls before it still gets a proper error
   * status. SLESS_TIMEOUT_SEC is the longest wait for each chunk (an idle
   * timeout, not a limit on the whole stream). A stream that fails or stalls
   * after its head is cut: the connection closes without the final chunk, so
   * the client sees an incomplete response, never a clean end. A client that
   * goes away aborts `context.signal` and ends the iterator (`return()`).
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   * @param {string} url
   * @param {import('./sless-runtime.js').HttpResult} result
   * @param {import('./sless-runtime.js').InvocationContext} context
   * @param {bigint} began
   * @param {import('./sless-runtime.js').Call} call its head carries the lines written until it goes out;
   *   the call ends with the stream
   */
  async function streamAnswer(req, res, url, result, context, began, call) {
    const source = /** @type {any} */ (result.stream);
    /** @type {any} */
    const iterator = typeof source[Symbol.asyncIterator] === 'function' ? source[Symbol.asyncIterator]() : source;
    const idleMs = timeoutSec * 1000;
    const bodyless = req.method === 'HEAD' || result.status === 204 || result.status === 304;
    const GONE = Symbol('gone');
    const IDLE = Symbol('idle');
    /** @type {Promise<typeof GONE>} */
    const gone = new Promise((resolve) => res.once('close', () => resolve(GONE)));
    let headSent = false;
    let finished = false;
    /** @type {Error} */
    let reason = new Error('the client went away');
    /** @type {string | undefined} the X-Sless-Output of the head (kept for the error answer if the head fails) */
    let headOutput;
    const writeHead = (/** @type {unknown} */ first) => {
      const headers = result.headers;
      dropRuntimeHeaders(headers);
      if (!('content-type' in headers)) headers['content-type'] = rt.streamContentType(first);
      headers[rt.HANDLER_MS_HEADER] = (Number(process.hrtime.bigint() - began) / 1e6).toFixed(3);
      headOutput = rt.takeOutput(call);
      if (headOutput !== undefined) headers[rt.OUTPUT_HEADER] = headOutput;
      if (draining) headers.connection = 'close';
      try {
        res.writeHead(result.status, headers);
      } catch (err) {
        // An invalid header name/value from the handler: nothing has been written yet.
        throw new rt.InvalidResponse(`invalid response: ${rt.describeError(err).error}`);
      }
      headSent = true;
    };
    try {
      for (;;) {
        context.deadlineMs = Date.now() + idleMs;
        /** @type {NodeJS.Timeout | undefined} */
        let timer;
        const idle = new Promise((resolve) => { timer = setTimeout(() => resolve(IDLE), idleMs); });
        let step;
        try {
          step = await Promise.race([Promise.resolve().then(() => iterator.next()), gone, idle]);
        } finally {
          clearTimeout(timer);
        }
        if (step === GONE) return;
        if (step === IDLE) throw new rt.TimeoutError(timeoutSec);
        if (step.done) {
          finished = true; // exhausted: nothing to end early
          break;
        }
        const bytes = rt.chunkBytes(step.value);
        if (!headSent) writeHead(step.value);
        if (bodyless) {
          reason = new Error('the response has no body (HEAD, 204, 304): the stream is not read');
          break;
        }
        if (bytes.length > 0 && !res.write(bytes)) {
          // The client reads slower than the stream produces: wait for it (not the handler's idle time).
          if (await Promise.race([new Promise((resolve) => res.once('drain', resolve)), gone]) === GONE) return;
        }
      }
      if (!headSent) writeHead(undefined);
      res.end();
    } catch (err) {
      reason = err instanceof Error ? err : new Error(String(err));
      const timedOut = err instanceof rt.TimeoutError;
      if (timedOut) {
        process.stderr.write(`sless-runtime: ${req.method} ${url}: stream ${headSent ? 'idle: ' : ''}${reason.message}\n`);
      } else {
        rt.logError(`stream failed on ${req.method} ${url}`, err);
      }
      if (headSent) {
        // No final chunk: the client sees the stream was cut. After this turn, so that the chunks
        // written before (node:http sends them on the next tick) still go out first.
        setImmediate(() => res.destroy());
      } else {
        rt.endCall(call); // the call is over: what it left without a newline goes with the error
        const output = headOutput ?? rt.takeOutput(call);
        const { error, type } = rt.describeError(err);
        const failure = timedOut
          ? rt.errorResult(504, reason.message, 'Timeout')
          : rt.errorResult(500, rt.publicMessage(error, config), type);
        if (output !== undefined) failure.headers[rt.OUTPUT_HEADER] = output;
        sendTimed(req, res, failure, began);
      }
    } finally {
      rt.endCall(call);
      if (!finished) {
        context._abort(reason);
        if (typeof iterator.return === 'function') {
          Promise.resolve().then(() => iterator.return()).catch(
            (/** @type {unknown} */ late) => rt.logError('stream failed while closing', late),
          );
        }
      }
    }
  }

  /**
   * Send a complete result with the handler's run time so far.
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   * @param {import('./sless-runtime.js').HttpResult} result
   * @param {bigint} began
   */
  function sendTimed(req, res, result, began) {
    result.headers[rt.HANDLER_MS_HEADER] = (Number(process.hrtime.bigint() - began) / 1e6).toFixed(3);
    send(req, res, result);
  }

  /**
   * Count a request as in flight until its response is sent or aborted.
   * @param {http.ServerResponse} res
   */
  function track(res) {
    inFlight++;
    res.once('close', () => {
      inFlight--;
      if (inFlight === 0 && onIdle) onIdle();
    });
  }

  /**
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   */
  function onRequest(req, res) {
    track(res);
    const headers = req.headers;
    const length = headers['content-length'];
    if (length === undefined && headers['transfer-encoding'] === undefined) {
      dispatch(req, res, EMPTY); // the common GET: no body, no extra event-loop turn
      return;
    }
    if (length !== undefined && Number(length) > config.maxBodyBytes) {
      tooLarge(req, res);
      return;
    }
    /** @type {Buffer[]} */
    const chunks = [];
    let size = 0;
    let rejected = false;
    req.on('data', (/** @type {Buffer} */ chunk) => {
      if (rejected) return;
      size += chunk.length;
      if (size > config.maxBodyBytes) {
        rejected = true; // counted while reading chunked: stop keeping it, answer now
        chunks.length = 0;
        tooLarge(req, res);
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (!rejected) dispatch(req, res, chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size));
    });
    req.on('error', () => {
      // The client went away mid-body; 'close' on res does the bookkeeping.
    });
  }

  server.on('request', onRequest);
  server.keepAliveTimeout = KEEP_ALIVE_TIMEOUT_MS;

  // WebSocket upgrades: the function's websocket handler runs for the connection's life; without one
  // the upgrade is refused (deny by default).
  server.on('upgrade', (req, socket, head) => {
    const url = req.url || '/';
    if (url.startsWith('/_/')) {
      socket.end(ws.refusal(404, `no such path: ${url}`, 'NotFound'));
      return;
    }
    socket.on('error', () => {}); // a client that vanishes ends only its own connection
    const event = rt.buildEvent(req.method || 'GET', url, req.rawHeaders, EMPTY);
    // tagged, not kept: a WebSocket's answer carries no X-Sless-Output
    const call = new rt.Call(rt.callIdFrom(req.headers['x-request-id']), false);
    rt.runAsCall(call, () => ws.serve(req, socket, head, wsHandler, event, config, rt.logError))
      .finally(() => rt.endCall(call));
  });

  // Bodies larger than the limit are refused before the client sends them.
  server.on('checkContinue', (req, res) => {
    const length = req.headers['content-length'];
    if (length !== undefined && Number(length) > config.maxBodyBytes) {
      track(res);
      tooLarge(req, res);
      return;
    }
    res.writeContinue();
    onRequest(req, res);
  });

  // Malformed requests get the same JSON error shape as everything else.
  server.on('clientError', (err, socket) => {
    const code = /** @type {NodeJS.ErrnoException} */ (err).code;
    if (code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    let status = 400;
    let type = 'BadRequest';
    if (code === 'HPE_HEADER_OVERFLOW') {
      status = 431;
      type = 'HeadersTooLarge';
    } else if (code === 'ERR_HTTP_REQUEST_TIMEOUT') {
      status = 408;
      type = 'RequestTimeout';
    }
    const body = JSON.stringify({ error: `bad request: ${err.message}`, type });
    socket.end(
      `HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nContent-Type: application/json\r\n`
      + `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  });

  /**
   * SIGTERM: close idle keep-alive connections, keep accepting new ones for
   * SLESS_DRAIN_LISTEN_SEC (a pod sets it: the nodes' Service rules still send
   * it connections a while after it was told to stop, and a closed listener
   * would refuse them), then stop accepting; every answer from now on says
   * `Connection: close`; exit 0 once in-flight requests finished, at the latest
   * after SLESS_DRAIN_SEC (from the signal).
   * @param {string} signal
   */
  function drain(signal) {
    if (draining) return;
    draining = true;
    process.stderr.write(`sless-runtime: ${signal}: draining ${inFlight} in-flight request(s)\n`);
    const deadline = setTimeout(() => {
      process.stderr.write(`sless-runtime: drain deadline reached, ${inFlight} request(s) abandoned\n`);
      process.exit(0);
    }, Math.min(config.drainSec * 1000, MAX_TIMER_MS));
    const finish = () => {
      clearTimeout(deadline);
      process.exit(0);
    };
    server.closeIdleConnections();
    const stopListening = () => {
      // Exit once every connection is closed; in-flight ones close after their response.
      server.close(finish);
      server.closeIdleConnections();
      onIdle = () => server.closeIdleConnections();
      if (inFlight === 0) onIdle();
    };
    const listenMs = Math.min(config.drainListenSec, config.drainSec) * 1000;
    if (listenMs > 0) setTimeout(stopListening, Math.min(listenMs, MAX_TIMER_MS));
    else stopListening();
  }

  return { server, drain };
}

/**
 * The descriptor named by SLESS_READY_FD, removed from the environment before any user code loads (the
 * handler has no use for it); undefined when there is none.
 * @returns {number | undefined}
 */
function takeReadyFd() {
  const raw = (process.env.SLESS_READY_FD || '').trim();
  delete process.env.SLESS_READY_FD;
  return /^\d+$/.test(raw) ? Number(raw) : undefined;
}

/**
 * Say "accepting connections" with one byte, then close the descriptor, so the handler cannot write
 * there; a supervisor that stopped listening is no reason to fail.
 * @param {number | undefined} fd
 */
function signalServing(fd) {
  if (fd === undefined) return;
  try {
    fs.writeSync(fd, 'r');
    fs.closeSync(fd);
  } catch {
    // a supervisor that stopped listening is no reason to fail
  }
}

/** What a spare's warm-up sends its throwaway server: a health probe, then a call with a JSON body. */
const WARM_UP_BODY = '{"warm":true}';
const WARM_UP_REQUESTS = 'GET /_/health HTTP/1.1\r\nHost: warm-up\r\n\r\n'
  + 'POST /warm-up?x=1 HTTP/1.1\r\nHost: warm-up\r\nContent-Type: application/json\r\n'
  + `Content-Length: ${WARM_UP_BODY.length}\r\nConnection: close\r\n\r\n${WARM_UP_BODY}`;
/** The longest a warm-up may take; it is only a head start, never a reason to fail. */
const WARM_UP_MS = 2000;

/**
 * A warm spare's head start (before its claim, so before any tenant code): two requests through a throwaway
 * server on an ephemeral loopback port with a platform handler. Node compiles functions when they first run;
 * this has the runtime's request path (parsing, the event, the invocation, the answer) compiled, so the claimed
 * function's health probe and first call do not pay for it. Best effort: any failure only ends the warm-up.
 * @returns {Promise<void>}
 */
function warmUp() {
  const config = { ...rt.loadConfig({}), port: 0, host: '127.0.0.1' };
  const { server } = createServer(config, async (/** @type {any} */ event) => ({ echo: event.warm }));
  return new Promise((resolve) => {
    const socket = new net.Socket();
    const done = () => {
      clearTimeout(timer);
      socket.destroy();
      server.close(() => resolve());
      server.closeAllConnections();
    };
    const timer = setTimeout(done, WARM_UP_MS);
    server.on('error', done);
    socket.on('error', done);
    socket.on('close', done);
    socket.resume();
    server.listen(0, '127.0.0.1', () => {
      const address = /** @type {import('node:net').AddressInfo} */ (server.address());
      socket.connect(address.port, '127.0.0.1', () => socket.end(WARM_UP_REQUESTS));
    });
  });
}

async function main() {
  rt.installProcessGuards();
  const readyFd = takeReadyFd();
  // A warm spare (SLESS_SPARE=1, sless up only): listen and say so, then wait for the claim that names the
  // function; nothing of the function (code, environment, secrets) exists in this process before it.
  const claimed = process.env.SLESS_SPARE === '1'
    ? await require('./sless-spare.js').waitForClaim(readyFd, warmUp)
    : undefined;
  // the code first: nothing listens (the pod is not Ready) until it is there; loaded only then
  if (process.env.SLESS_CODE_URL !== undefined) await require('./sless-fetch.js').fetchFromEnv();
  rt.installCallTagging(); // before the handler loads: loggers it makes then write through it
  let config;
  let handler;
  let wsHandler;
  try {
    config = rt.loadConfig();
    handler = await rt.loadHandler(config);
    wsHandler = await rt.loadWebSocketHandler(config);
  } catch (err) {
    rt.logLoadFailure(err, config);
    process.exit(1);
  }
  const { server, drain } = createServer(config, handler, wsHandler, claimed && claimed.release());
  const announce = () => {
    process.stderr.write(
      `sless-runtime nodejs20: ${config.entrypoint} on http://${config.host}:${config.port}\n`,
    );
    signalServing(readyFd);
  };
  server.on('error', (err) => {
    rt.logError('cannot listen', err);
    process.exit(1);
  });
  if (claimed) {
    claimed.replay(); // requests that came while the handler loaded
    announce();
  } else {
    server.listen(config.port, config.host, announce);
  }
  // `on`, not `once`: a repeated signal must not fall back to the default
  // action (death by signal, a non-zero exit) in the middle of a drain.
  process.on('SIGTERM', () => drain('SIGTERM'));
  process.on('SIGINT', () => drain('SIGINT'));
}

if (require.main === module) {
  main();
}

module.exports = { createServer };
