// @ts-check
'use strict';
/**
 * Shared core of the sless nodejs20 runtime: configuration, handler loading, the
 * event built from an HTTP request, the invocation with its timeout, and the
 * mapping of a handler's result to an HTTP response.
 *
 * server.js (HTTP wrapper) and runner.js (one-shot job runner) both use it, so
 * the two modes load and call user code in exactly the same way.
 * Node 20 standard library only: user images must not need an `npm install`
 * for the wrapper itself.
 */

const path = require('node:path');
const Module = require('node:module');
const { isUtf8 } = require('node:buffer');
const { pathToFileURL } = require('node:url');

/**
 * @typedef {object} Config
 * @property {number} port
 * @property {string} host
 * @property {string} codeDir
 * @property {string} entrypoint
 * @property {string | undefined} depsDir
 * @property {number} timeoutSec
 * @property {number} maxBodyBytes
 * @property {number} drainSec
 * @property {number} drainListenSec how long after SIGTERM new connections are still accepted (a pod's address
 *   stays in the nodes' Service rules a while after it was told to stop)
 */

/**
 * Read a positive number from the environment; a bad value is a deployment
 * error, so it fails start-up loudly instead of silently using the default.
 * @param {NodeJS.ProcessEnv} env
 * @param {string} name
 * @param {number} fallback
 * @param {boolean} integer
 * @returns {number}
 */
function numberFromEnv(env, name, fallback, integer) {
  const raw = env[name];
  if (raw === undefined || raw.trim() === '') return fallback;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0 || (integer && !Number.isInteger(value))) {
    throw new ConfigError(`${name} must be a non-negative ${integer ? 'integer' : 'number'}, got ${JSON.stringify(raw)}`);
  }
  return value;
}

/** A start-up configuration problem (reported on stderr, process exits non-zero). */
class ConfigError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'ConfigError';
  }
}

/**
 * The one typed view of the runtime's environment (see runtimes/README.md).
 * @param {NodeJS.ProcessEnv} [env]
 * @returns {Config}
 */
function loadConfig(env = process.env) {
  const port = numberFromEnv(env, 'PORT', 8080, true);
  if (port > 65535) throw new ConfigError(`PORT out of range: ${port}`);
  return {
    port,
    host: env.SLESS_HOST || '0.0.0.0',
    codeDir: path.resolve(env.SLESS_CODE_DIR || '/app/function'),
    entrypoint: env.SLESS_ENTRYPOINT || 'handler.handle',
    depsDir: env.SLESS_DEPS_DIR ? path.resolve(env.SLESS_DEPS_DIR) : undefined,
    timeoutSec: numberFromEnv(env, 'SLESS_TIMEOUT_SEC', 30, false),
    maxBodyBytes: numberFromEnv(env, 'SLESS_MAX_BODY_BYTES', 6291456, true),
    drainSec: numberFromEnv(env, 'SLESS_DRAIN_SEC', 25, false),
    drainListenSec: numberFromEnv(env, 'SLESS_DRAIN_LISTEN_SEC', 0, false),
  };
}

/**
 * Make `require('pkg')` from user code find packages in the dependency dir.
 *
 * The dir may be a `node_modules` folder itself or an install prefix that holds
 * one (`npm install --prefix DIR`), so both DIR and DIR/node_modules become
 * global lookup paths. Node reads NODE_PATH once at start-up; re-running
 * Module._initPaths() is the documented-by-practice way to apply it later, and
 * the packages' own nested node_modules keep resolving normally.
 * @param {string | undefined} depsDir
 */
function addDependencyDir(depsDir) {
  if (!depsDir) return;
  const extra = [path.join(depsDir, 'node_modules'), depsDir];
  const current = (process.env.NODE_PATH || '').split(path.delimiter).filter(Boolean);
  process.env.NODE_PATH = [...extra, ...current].join(path.delimiter);
  // @ts-ignore -- internal but stable since Node 0.x; the only way to re-read NODE_PATH.
  Module._initPaths();
}

/**
 * Split `module.func` at its last dot: `lib/api.handle` -> (`lib/api`, `handle`).
 * @param {string} entrypoint
 * @returns {{ moduleName: string, funcName: string }}
 */
function parseEntrypoint(entrypoint) {
  const dot = entrypoint.lastIndexOf('.');
  if (dot <= 0 || dot === entrypoint.length - 1) {
    throw new ConfigError(`SLESS_ENTRYPOINT must look like "module.func", got ${JSON.stringify(entrypoint)}`);
  }
  return { moduleName: entrypoint.slice(0, dot), funcName: entrypoint.slice(dot + 1) };
}

/**
 * Load the user's handler once. CommonJS is the documented form
 * (`exports.handle = async (event) => ...`); an ES module (`.mjs`, or `.js` under
 * `"type": "module"`) is imported instead when require() refuses it.
 * Any failure propagates: the caller exits non-zero so the platform sees a crash.
 * @param {Config} config
 * @returns {Promise<(event: object, context: object) => unknown>}
 */
async function loadHandler(config) {
  logFolders = config;
  addDependencyDir(config.depsDir);
  const { moduleName, funcName } = parseEntrypoint(config.entrypoint);
  const modulePath = path.join(config.codeDir, moduleName);
  /** @type {any} */
  let mod;
  try {
    mod = require(modulePath);
  } catch (err) {
    if (/** @type {NodeJS.ErrnoException} */ (err).code !== 'ERR_REQUIRE_ESM') throw err;
    mod = await import(pathToFileURL(require.resolve(modulePath)).href);
  }
  let func = mod == null ? undefined : mod[funcName];
  if (func === undefined && mod && mod.default && typeof mod.default === 'object') {
    func = mod.default[funcName]; // `export default { handle }` or a transpiled module
  }
  if (typeof func !== 'function') {
    const found = func === undefined ? 'it is not exported' : `it is a ${typeof func}`;
    throw new ConfigError(`${config.entrypoint}: ${modulePath} has no function "${funcName}" (${found})`);
  }
  const owner = func === mod[funcName] ? mod : mod.default;
  return func.bind(owner);
}

/**
 * The function's `websocket` export (runtimes/README.md, "WebSocket"), from the entrypoint's module
 * (loaded already by loadHandler: this takes it from the module cache); undefined when it has none.
 * @param {Config} config
 * @returns {Promise<((ws: any, event: object) => unknown) | undefined>}
 */
async function loadWebSocketHandler(config) {
  const { moduleName } = parseEntrypoint(config.entrypoint);
  const modulePath = path.join(config.codeDir, moduleName);
  /** @type {any} */
  let mod;
  try {
    mod = require(modulePath);
  } catch (err) {
    if (/** @type {NodeJS.ErrnoException} */ (err).code !== 'ERR_REQUIRE_ESM') throw err;
    mod = await import(pathToFileURL(require.resolve(modulePath)).href);
  }
  let owner = mod;
  let found = mod == null ? undefined : mod.websocket;
  if (found === undefined && mod && mod.default && typeof mod.default === 'object') {
    owner = mod.default;
    found = owner.websocket;
  }
  return typeof found === 'function' ? found.bind(owner) : undefined;
}

/**
 * @param {unknown} err
 * @returns {{ error: string, type: string }}
 */
function describeError(err) {
  if (err instanceof Error || (err !== null && typeof err === 'object' && 'message' in err)) {
    const e = /** @type {Error} */ (err);
    let type = typeof e.name === 'string' && e.name ? e.name : 'Error';
    // `class NotFound extends Error {}` keeps name "Error"; its class name says more.
    if (type === 'Error' && e.constructor && e.constructor.name && e.constructor.name !== 'Object') {
      type = e.constructor.name;
    }
    return { error: String(e.message), type };
  }
  return { error: String(err), type: err === null ? 'null' : typeof err };
}

/**
 * A handler result that cannot be sent: a statusCode outside 200..599, bad
 * headers, a value JSON cannot encode (BigInt, a cycle).
 */
class InvalidResponse extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'InvalidResponse';
  }
}

/** The handler did not settle within SLESS_TIMEOUT_SEC. */
class TimeoutError extends Error {
  /** @param {number} timeoutSec */
  constructor(timeoutSec) {
    super(`function timed out after ${timeoutSec}s`);
    this.name = 'Timeout';
  }
}

/**
 * The second handler argument. `signal` aborts when the invocation times out,
 * so async work can stop itself; it is created on first use only, because
 * most handlers never look at it and the hot path should not pay for it.
 */
class InvocationContext {
  /** @param {number} deadlineMs */
  constructor(deadlineMs) {
    /** Epoch milliseconds after which the caller has already been answered 504. */
    this.deadlineMs = deadlineMs;
    /** @type {AbortController | undefined} */
    this._controller = undefined;
  }

  /** @returns {AbortSignal} */
  get signal() {
    if (!this._controller) this._controller = new AbortController();
    return this._controller.signal;
  }

  /** @returns {number} milliseconds left before the timeout */
  remainingMs() {
    return Math.max(0, this.deadlineMs - Date.now());
  }

  /** @param {Error} reason */
  _abort(reason) {
    if (this._controller) this._controller.abort(reason);
  }
}

/**
 * Call the handler once with a timeout. A synchronous result settles at once
 * (no timer is armed: nothing could interrupt a synchronous call anyway); a
 * promise races a timer. After a timeout the handler's promise keeps running;
 * its eventual rejection is logged and otherwise ignored.
 * @param {(event: object, context: object) => unknown} handler
 * @param {object} event
 * @param {number} timeoutSec
 * @param {InvocationContext} [context] the handler's second argument (the server keeps it for a stream)
 * @returns {Promise<unknown>} rejects with the handler's error or a TimeoutError
 */
function invoke(handler, event, timeoutSec, context = new InvocationContext(Date.now() + timeoutSec * 1000)) {
  const timeoutMs = timeoutSec * 1000;
  /** @type {unknown} */
  let result;
  try {
    result = handler(event, context);
  } catch (err) {
    return Promise.reject(err);
  }
  if (!isThenable(result)) return Promise.resolve(result);
  const pending = Promise.resolve(result);
  return new Promise((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      const err = new TimeoutError(timeoutSec);
      context._abort(err);
      pending.catch((late) => logError('handler failed after its timeout', late));
      reject(err);
    }, timeoutMs);
    pending.then(
      (value) => {
        if (settled) return;
        clearTimeout(timer);
        resolve(value);
      },
      (err) => {
        if (settled) return;
        clearTimeout(timer);
        reject(err);
      },
    );
  });
}

/**
 * @param {unknown} value
 * @returns {value is PromiseLike<unknown>}
 */
function isThenable(value) {
  return value !== null && (typeof value === 'object' || typeof value === 'function')
    && typeof (/** @type {any} */ (value).then) === 'function';
}

/**
 * Log to stderr with the stack (never to the HTTP client).
 * @param {string} what
 * @param {unknown} err
 */
function logError(what, err) {
  const detail = err instanceof Error && err.stack ? err.stack : String(err);
  process.stderr.write(`sless-runtime: ${scrubFolders(`${what}: ${detail}`, logFolders)}\n`);
}

/**
 * The loaded function's folders, once loadHandler knows them: the function's log is read by its
 * tenant (`sless logs`, a job's message), so every stack the runtime logs names `./handler.js`,
 * never where the platform keeps it (scrubFolders). Before that, only this runtime's folder is known.
 * @type {Config | undefined}
 */
let logFolders;

/**
 * Build the event from the raw request parts (the contract's "Event" section).
 * @param {string} method
 * @param {string} url request target as received (`/a/b?x=1`)
 * @param {string[]} rawHeaders alternating names and values, as node:http gives them
 * @param {Buffer} body
 * @returns {Record<string, unknown>}
 */
function buildEvent(method, url, rawHeaders, body) {
  /** @type {Record<string, unknown>} */
  let event = {};
  if (body.length > 0) {
    if (!isUtf8(body)) {
      event = { body: body.toString('base64'), isBase64Encoded: true };
    } else {
      const text = body.toString('utf8');
      const parsed = looksLikeJsonObject(text) ? tryParseJson(text) : undefined;
      if (parsed !== null && typeof parsed === 'object' && !Array.isArray(parsed)) {
        event = /** @type {Record<string, unknown>} */ (parsed);
      } else {
        event = { body: text };
      }
    }
  }
  const { path: reqPath, query } = splitTarget(url);
  const headerMap = headerValues(rawHeaders);
  // X-Sless-Params: the platform's (the matched http trigger's path parameters), so never in _headers
  const params = headerMap.get('x-sless-params');
  if (params !== undefined) headerMap.delete('x-sless-params');
  const headers = Object.fromEntries(headerMap);
  event._method = method.toUpperCase();
  event._path = reqPath;
  event._query = query;
  event._params = params === undefined ? {} : pathParams(params);
  event._headers = headers;
  event._accept = typeof headers.accept === 'string' ? headers.accept : '';
  return event;
}

/** @param {string} text */
function looksLikeJsonObject(text) {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x7b) return true; // '{'
    if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) return false;
  }
  return false;
}

/** @param {string} text */
function tryParseJson(text) {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/**
 * Path without the query, and the query as a plain object (a repeated key keeps
 * its last value). Object.fromEntries defines own properties, so a key such as
 * `__proto__` is data, never a prototype change.
 * @param {string} url
 * @returns {{ path: string, query: Record<string, string> }}
 */
function splitTarget(url) {
  let target = url;
  if (!target.startsWith('/') && target !== '*') {
    try {
      const parsed = new URL(target); // absolute-form request target
      target = parsed.pathname + parsed.search;
    } catch {
      // leave it as received
    }
  }
  const q = target.indexOf('?');
  if (q === -1) return { path: target, query: {} };
  return {
    path: target.slice(0, q),
    query: Object.fromEntries(new URLSearchParams(target.slice(q + 1))),
  };
}

/**
 * Lower-case names; a repeated header's values joined with ", " (node:http's own
 * req.headers drops duplicates of some headers and joins cookies with "; ").
 * @param {string[]} rawHeaders
 * @returns {Map<string, string>}
 */
function headerValues(rawHeaders) {
  /** @type {Map<string, string>} */
  const map = new Map();
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i].toLowerCase();
    const previous = map.get(name);
    map.set(name, previous === undefined ? rawHeaders[i + 1] : `${previous}, ${rawHeaders[i + 1]}`);
  }
  return map;
}

/**
 * The X-Sless-Params header's object of strings (the matched http trigger's path
 * parameters); {} when it is anything else. node:http reads header values as
 * Latin-1: a non-ASCII one is UTF-8 JSON, parsed from its bytes. JSON.parse makes
 * a `__proto__` key an own property, never a prototype change.
 * @param {string} value
 * @returns {Record<string, string>}
 */
function pathParams(value) {
  let text = value;
  if (!isAscii(text)) {
    const bytes = Buffer.from(text, 'latin1');
    if (!isUtf8(bytes)) return {};
    text = bytes.toString('utf8');
  }
  const params = tryParseJson(text);
  if (params === null || typeof params !== 'object' || Array.isArray(params)) return {};
  for (const key in params) {
    if (typeof params[key] !== 'string') return {};
  }
  return params;
}

/** @param {string} text */
function isAscii(text) {
  for (let i = 0; i < text.length; i++) {
    if (text.charCodeAt(i) > 0x7f) return false;
  }
  return true;
}

/**
 * @typedef {object} HttpResult
 * @property {number} status
 * @property {Record<string, string | string[]>} headers
 * @property {Buffer} body
 * @property {Stream} [stream] a streamed body: sent chunk by chunk instead of `body`
 */

/**
 * A streamed body: an async iterable (an async generator, a `Readable`) or a
 * synchronous iterator (a generator object). Arrays, strings and Buffers are
 * iterable too but are values, not streams: an iterator must have `next()`.
 * @typedef {AsyncIterable<unknown> | Iterator<unknown>} Stream
 */

/**
 * @param {unknown} value
 * @returns {value is Stream}
 */
function isStream(value) {
  if (value === null || typeof value !== 'object') return false;
  const v = /** @type {any} */ (value);
  if (typeof v[Symbol.asyncIterator] === 'function') return true;
  return typeof v[Symbol.iterator] === 'function' && typeof v.next === 'function';
}

/**
 * One chunk of a stream as bytes: a string (UTF-8) or bytes (Buffer, any
 * Uint8Array); anything else cannot be sent.
 * @param {unknown} chunk
 * @returns {Buffer}
 */
function chunkBytes(chunk) {
  if (typeof chunk === 'string') return Buffer.from(chunk);
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  throw new InvalidResponse(`a stream chunk must be a string or bytes, got ${chunk === null ? 'null' : typeof chunk}`);
}

/**
 * A result with its streams read to the end (the one-shot runner's result is
 * one value): a stream becomes the text of its chunks joined (bytes read as
 * UTF-8), in a bare result as in a response description's `body`.
 * @param {unknown} result
 * @returns {Promise<unknown>}
 */
async function collectStreams(result) {
  const join = async (/** @type {Stream} */ stream) => {
    /** @type {Buffer[]} */
    const parts = [];
    const source = /** @type {any} */ (stream);
    if (typeof source[Symbol.asyncIterator] === 'function') {
      for await (const chunk of source) parts.push(chunkBytes(chunk));
    } else {
      for (let step = source.next(); !step.done; step = source.next()) parts.push(chunkBytes(step.value));
    }
    return Buffer.concat(parts).toString('utf8');
  };
  if (isStream(result)) return join(result);
  const desc = /** @type {any} */ (result);
  if (desc !== null && typeof desc === 'object' && Number.isInteger(desc.statusCode) && isStream(desc.body)) {
    return { ...desc, body: await join(desc.body) };
  }
  return result;
}

/**
 * The Content-Type a stream gets when the handler set none: its first chunk decides.
 * @param {unknown} first the first chunk, or undefined for an empty stream
 * @returns {string}
 */
function streamContentType(first) {
  return first instanceof Uint8Array ? 'application/octet-stream' : TEXT;
}

const TEXT = 'text/plain; charset=utf-8';
const HTML = 'text/html; charset=utf-8';
const JSON_TYPE = 'application/json';

/**
 * Map a handler's return value to a response (the contract's "Result mapping").
 * Throws InvalidResponse for values that cannot be sent; the server answers 500.
 * @param {unknown} result
 * @returns {HttpResult}
 */
function toHttpResult(result) {
  try {
    return mapResult(result);
  } catch (err) {
    if (err instanceof InvalidResponse) throw err;
    throw new InvalidResponse(describeError(err).error); // JSON.stringify's TypeError
  }
}

/**
 * @param {unknown} result
 * @returns {HttpResult}
 */
function mapResult(result) {
  if (isStream(result)) return { status: 200, headers: {}, body: Buffer.alloc(0), stream: result };
  if (typeof result === 'string') {
    return { status: 200, headers: { 'content-type': startsWithTag(result) ? HTML : TEXT }, body: Buffer.from(result) };
  }
  if (result !== null && typeof result === 'object' && !Array.isArray(result)
      && Number.isInteger(/** @type {any} */ (result).statusCode)) {
    return fromResponseDescription(/** @type {Record<string, unknown>} */ (result));
  }
  return { status: 200, headers: { 'content-type': JSON_TYPE }, body: Buffer.from(jsonText(result)) };
}

/** @param {string} s */
function startsWithTag(s) {
  return s.trimStart().startsWith('<');
}

/**
 * JSON for any result; `undefined` (a handler that returns nothing) is null.
 * @param {unknown} value
 * @returns {string}
 */
function jsonText(value) {
  const text = JSON.stringify(value === undefined ? null : value);
  if (text === undefined) throw new InvalidResponse(`cannot encode a ${typeof value} as JSON`);
  return text;
}

/**
 * @param {Record<string, unknown>} desc
 * @returns {HttpResult}
 */
function fromResponseDescription(desc) {
  const status = /** @type {number} */ (desc.statusCode);
  if (status < 200 || status > 599) throw new InvalidResponse(`statusCode ${status} is out of range 200-599`);
  /** @type {Record<string, string | string[]>} */
  const headers = {};
  if (desc.headers !== undefined && desc.headers !== null) {
    if (typeof desc.headers !== 'object' || Array.isArray(desc.headers)) {
      throw new InvalidResponse('headers must be an object of strings');
    }
    for (const [name, value] of Object.entries(desc.headers)) {
      const key = name.toLowerCase();
      if (key === 'content-length' || key === 'transfer-encoding' || key === 'connection') continue; // ours
      headers[key] = Array.isArray(value) ? value.map(String) : String(value);
    }
  }
  const raw = desc.body;
  let body;
  if (isStream(raw)) return { status, headers, body: Buffer.alloc(0), stream: raw };
  if (raw === undefined || raw === null) {
    body = Buffer.alloc(0);
  } else if (typeof raw === 'string') {
    body = desc.isBase64Encoded === true ? Buffer.from(raw, 'base64') : Buffer.from(raw);
    if (!('content-type' in headers)) headers['content-type'] = TEXT;
  } else {
    body = Buffer.from(jsonText(raw));
    if (!('content-type' in headers)) headers['content-type'] = JSON_TYPE;
  }
  return { status, headers, body };
}

/**
 * A message as a caller may see it. Where the platform keeps the code, the
 * dependencies and this runtime says nothing to a caller and much to an
 * attacker: those folders become ".", "<deps>" and "<runtime>", and the
 * "Require stack:" list node appends to module-not-found errors (file paths,
 * one per line) is dropped. The full error stays in the log.
 * @param {string} message
 * @param {Config | undefined} config
 * @returns {string}
 */
function publicMessage(message, config) {
  let text = String(message);
  const cut = text.indexOf('\nRequire stack:');
  if (cut >= 0) text = text.slice(0, cut);
  return scrubFolders(text, config);
}

/**
 * TEXT with the code, dependency and runtime folders told as ".", "<deps>" and "<runtime>".
 * @param {string} text
 * @param {Config | undefined} config
 * @returns {string}
 */
function scrubFolders(text, config) {
  /** @type {[string | undefined | null, string][]} */
  const folders = [[config && config.codeDir, '.'], [config && config.depsDir, '<deps>'], [__dirname, '<runtime>']];
  for (const [folder, label] of folders) {
    if (!folder || folder.length < 2) continue;
    const bare = folder.replace(/\/+$/, '');
    text = text.split(`${bare}/`).join(`${label}/`).split(bare).join(label);
  }
  return text;
}

/**
 * The one line a caller may see about a handler that cannot load.
 * @param {unknown} err
 * @param {Config | undefined} config
 * @returns {string}
 */
function loadFailureMessage(err, config) {
  const { error, type } = describeError(err);
  return `the function failed to load: ${type}: ${publicMessage(error, config)}`;
}

/**
 * The full story on stderr (the function's log: message and stack), then the
 * short, path-free reason as the last line.
 * @param {unknown} err
 * @param {Config | undefined} config
 */
function logLoadFailure(err, config) {
  if (config) logFolders = config;
  logError('cannot load the function', err);
  process.stderr.write(`sless-runtime: ${loadFailureMessage(err, config).replace(/\n/g, ' ')}\n`);
}

/**
 * The JSON error body every failure uses: {"error": ..., "type": ...}.
 * @param {number} status
 * @param {string} message
 * @param {string} type
 * @returns {HttpResult}
 */
function errorResult(status, message, type) {
  return {
    status,
    headers: { 'content-type': JSON_TYPE },
    body: Buffer.from(JSON.stringify({ error: message, type })),
  };
}

/**
 * Keep the process alive when user code leaves a stray rejection or throws from
 * a callback: one bad invocation must not take down the others. The request
 * that caused it, if still waiting, ends by its own timeout.
 */
function installProcessGuards() {
  process.on('unhandledRejection', (reason) => logError('unhandled promise rejection', reason));
  process.on('uncaughtException', (err) => logError('uncaught exception', err));
}

// ------------------------------------------------------------------ per-call output tagging
//
// Every line a handler writes to process.stdout or process.stderr (console.* included) while
// serving a call is written as `@sless:<request id> <text>` (runtimes/README.md, "Output of a
// call"). The call travels with its async context (AsyncLocalStorage), so concurrent calls
// never borrow each other's id. A line written outside any call that starts with the tag marker
// is re-tagged `@sless:- ` ("no call"): printed text never passes for another call's line.
//
// The lines a call writes before its answer's head goes out are also kept with the call and sent
// back in `X-Sless-Output`, so the platform keeps them with the call's record after the process is gone.

const { AsyncLocalStorage } = require('node:async_hooks');

const TAG = '@sless:';
const NO_CALL = '-';
/** The request ids the platform sends; anything else tags nothing. */
const REQUEST_ID = /^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,127}$/;
/** A partial line longer than this is written as a line of its own. */
const MAX_PARTIAL_CHARS = 65536;
/** The response header that carries the handler's run time to the platform (which removes it). */
const HANDLER_MS_HEADER = 'x-sless-handler-ms';
/** The response header that carries the lines a call wrote before its answer (the platform removes it). */
const OUTPUT_HEADER = 'x-sless-output';
/** Bytes of text (UTF-8) a call's X-Sless-Output holds at most (the contract's cap). */
const MAX_OUTPUT_BYTES = 16384;
/**
 * Lines it holds at most (the contract's cap): empty lines cost no text, so their number is bounded on its own;
 * it also bounds what a call keeps in memory.
 */
const MAX_OUTPUT_LINES = 1024;

/**
 * The lines one call wrote, up to MAX_OUTPUT_BYTES of text and MAX_OUTPUT_LINES: the first line that
 * does not fit ends the keeping (`truncated`).
 * @typedef {object} CallOutput
 * @property {Array<{ stream: string, text: string, ts: number }>} lines
 * @property {number} bytes
 * @property {boolean} truncated
 */

/**
 * One call as the output streams see it: the request id its lines are tagged with and, from its first
 * line until its answer's head goes out (`capturing`), the lines it wrote.
 */
class Call {
  /**
   * @param {string | null} id
   * @param {boolean} capturing whether its answer carries X-Sless-Output (a WebSocket's does not)
   */
  constructor(id, capturing) {
    this.id = id;
    this.capturing = capturing;
    /** @type {CallOutput | null} nothing until its first line: a call that writes nothing costs nothing */
    this.output = null;
  }
}

/** @type {AsyncLocalStorage<Call>} */
const calls = new AsyncLocalStorage();
/** @type {Array<(call: Call) => void>} */
const callEnders = [];

/**
 * @param {string | string[] | undefined} value the request's X-Request-Id
 * @returns {string | null}
 */
function callIdFrom(value) {
  return typeof value === 'string' && REQUEST_ID.test(value) ? value : null;
}

/**
 * @param {string | null} id
 * @param {string} line
 */
function tagLine(id, line) {
  if (id !== null) return `${TAG}${id} ${line}`;
  if (line.startsWith(TAG)) return `${TAG}${NO_CALL} ${line}`;
  return line;
}

/**
 * Keep complete lines `call` wrote to `stream` ("stdout" or "stderr") for its X-Sless-Output.
 * @param {Call} call
 * @param {string} stream
 * @param {string[]} texts
 */
function keepLines(call, stream, texts) {
  let output = call.output;
  if (output === null) output = call.output = { lines: [], bytes: 0, truncated: false };
  if (output.truncated) return;
  const ts = Date.now() / 1000;
  for (const text of texts) {
    const bytes = output.bytes + Buffer.byteLength(text, 'utf8');
    if (bytes > MAX_OUTPUT_BYTES || output.lines.length >= MAX_OUTPUT_LINES) {
      output.truncated = true;
      return;
    }
    output.bytes = bytes;
    output.lines.push({ stream, text, ts });
  }
}

/**
 * The X-Sless-Output value of what `call` wrote so far (padded base64 of UTF-8 JSON), undefined when it
 * wrote nothing; once: the call's answer is being made, and its later lines go to the streams only.
 * @param {Call} call
 * @returns {string | undefined}
 */
function takeOutput(call) {
  call.capturing = false;
  const output = call.output;
  if (output === null) return undefined;
  call.output = null;
  return Buffer.from(JSON.stringify({ lines: output.lines, truncated: output.truncated })).toString('base64');
}

/**
 * Put a tagging write() in front of one stream; partial lines wait per call.
 * @param {NodeJS.WriteStream} stream
 * @param {string} name "stdout" or "stderr", as X-Sless-Output names the stream
 */
function tagStream(stream, name) {
  const write = stream.write.bind(stream);
  /** @type {Map<Call | null, string>} the pending partial line of each call (null: outside any call) */
  const partial = new Map();
  /** @type {any} */ (stream).write = function tagged(/** @type {any} */ chunk, /** @type {any} */ encoding, /** @type {any} */ cb) {
    if (typeof encoding === 'function') {
      cb = encoding;
      encoding = undefined;
    }
    const call = calls.getStore() ?? null;
    let text = typeof chunk === 'string'
      ? (encoding && encoding !== 'utf8' && encoding !== 'utf-8' ? Buffer.from(chunk, encoding).toString() : chunk)
      : Buffer.from(chunk).toString();
    const before = partial.get(call);
    if (before !== undefined) {
      partial.delete(call);
      text = before + text;
    }
    const lines = text.split('\n');
    let rest = /** @type {string} */ (lines.pop());
    if (rest.length > MAX_PARTIAL_CHARS) {
      lines.push(rest);
      rest = '';
    }
    if (rest) partial.set(call, rest);
    if (lines.length === 0) {
      if (cb) process.nextTick(cb);
      return true;
    }
    const id = call === null ? null : call.id;
    let out = '';
    for (const line of lines) out += `${tagLine(id, line)}\n`;
    if (call !== null && call.capturing) keepLines(call, name, lines);
    return write(out, cb);
  };
  callEnders.push((call) => {
    const rest = partial.get(call);
    if (rest === undefined) return;
    partial.delete(call);
    if (call.capturing) keepLines(call, name, [rest]);
    write(`${tagLine(call.id, rest)}\n`);
  });
}

/** Tag process.stdout and process.stderr (the HTTP server does; the runner does not). */
function installCallTagging() {
  tagStream(process.stdout, 'stdout');
  tagStream(process.stderr, 'stderr');
}

/**
 * Run `fn` as `call`: what it and its async continuations write is tagged with the call's id.
 * @template T
 * @param {Call} call
 * @param {() => T} fn
 * @returns {T}
 */
function runAsCall(call, fn) {
  return calls.run(call, fn);
}

/**
 * Write what a finished call left without a newline (a line of its own, kept like the others).
 * @param {Call} call
 */
function endCall(call) {
  for (const end of callEnders) end(call);
}

module.exports = {
  HANDLER_MS_HEADER,
  OUTPUT_HEADER,
  Call,
  takeOutput,
  callIdFrom,
  tagLine,
  installCallTagging,
  runAsCall,
  endCall,
  ConfigError,
  TimeoutError,
  InvalidResponse,
  InvocationContext,
  loadConfig,
  loadHandler,
  loadWebSocketHandler,
  parseEntrypoint,
  addDependencyDir,
  invoke,
  buildEvent,
  toHttpResult,
  errorResult,
  describeError,
  publicMessage,
  loadFailureMessage,
  logLoadFailure,
  logError,
  installProcessGuards,
  jsonText,
  isStream,
  chunkBytes,
  collectStreams,
  streamContentType,
};
