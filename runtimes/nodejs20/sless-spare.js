// @ts-check
'use strict';
/**
 * Warm-spare mode of the nodejs20 server (SLESS_SPARE=1; `sless up` only, see
 * api/src/sless_api/backends/standalone/host/spares.py and runtimes/README.md).
 *
 * Most of a Node function's cold start is node itself (the VM, its bootstrap,
 * the runtime's modules) and the sandbox around it. A spare has done that
 * ahead of time: it listens on PORT, writes one byte to SLESS_READY_FD, and
 * then blocks on stdin, a pipe only the supervisor holds, until the claim
 * (JSON: `env`, the function's complete environment, `cwd`, and `files`, its
 * secrets referenced as files, with `secrets_dir`) arrives. Only then does the
 * process take the function's environment and load its code, so no tenant
 * code and no secret exists in a spare before its claim. Stdin closed without
 * a claim: exit 0 (the spare is not wanted); a bad claim: exit 1.
 *
 * The read is synchronous on purpose: nothing runs in the event loop before
 * the claim, so connections wait in the kernel's backlog exactly as they do
 * before a fresh server listens. Requests that arrive while the handler loads
 * after the claim (an ES module is imported asynchronously) are held and
 * replayed once the real listeners are in place.
 */

const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const Module = require('node:module');

/** The events a server answers requests on; held between listening and the claim's handler. */
const HELD_EVENTS = /** @type {const} */ (['request', 'upgrade', 'checkContinue']);
/** A secret file's content: hex digits, two per byte. */
const HEX = /^(?:[0-9a-fA-F]{2})*$/;
/** Pause before reading a non-blocking stdin again (it should never be one: the supervisor's pipe blocks). */
const RETRY_MS = 1;

/** A claim that cannot be taken (reported as `bad claim:` or `cannot take the claim:`, exit 1). */
class ClaimError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'ClaimError';
  }
}

/**
 * One byte on the readiness descriptor; a supervisor that stopped listening is no reason to fail.
 * @param {number} fd
 */
function signalReady(fd) {
  try {
    fs.writeSync(fd, 'r');
  } catch {
    // nobody reads it any more
  }
}

/**
 * Everything on stdin up to EOF, blocking (see the module comment).
 * @returns {Buffer}
 */
function readStdin() {
  /** @type {Buffer[]} */
  const chunks = [];
  const buffer = Buffer.alloc(65536);
  for (;;) {
    let got;
    try {
      got = fs.readSync(0, buffer, 0, buffer.length, null);
    } catch (err) {
      if (/** @type {NodeJS.ErrnoException} */ (err).code !== 'EAGAIN') throw err;
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, RETRY_MS);
      continue;
    }
    if (got === 0) return Buffer.concat(chunks);
    chunks.push(Buffer.from(buffer.subarray(0, got)));
  }
}

/**
 * The claim as a JSON object; undefined when stdin closed without one.
 * @param {Buffer} data
 * @returns {{ env?: unknown, cwd?: unknown, files?: unknown, secrets_dir?: unknown } | undefined}
 */
function parseClaim(data) {
  if (data.length === 0) return undefined;
  let claim;
  try {
    claim = JSON.parse(data.toString('utf8'));
  } catch (err) {
    throw new ClaimError(`not JSON: ${/** @type {Error} */ (err).message}`);
  }
  if (claim === null || typeof claim !== 'object' || Array.isArray(claim)) {
    throw new ClaimError('the claim is not a JSON object');
  }
  return claim;
}

/**
 * The secret files of a claim, checked before anything is written: `[name, hex content]` pairs whose name
 * is one path component.
 * @param {unknown} files
 * @returns {Array<[string, Buffer]>}
 */
function secretFiles(files) {
  if (files === undefined || files === null) return [];
  if (!Array.isArray(files)) throw new ClaimError('files is not a list');
  return files.map((entry) => {
    if (!Array.isArray(entry) || entry.length !== 2 || typeof entry[0] !== 'string' || typeof entry[1] !== 'string') {
      throw new ClaimError('a secret file is not a [name, hex] pair');
    }
    const [name, hex] = entry;
    if (!name || name.includes('/') || name.includes('\0') || name === '.' || name === '..') {
      throw new ClaimError(`bad secret file name ${JSON.stringify(name)}`);
    }
    if (!HEX.test(hex)) throw new ClaimError(`secret file ${JSON.stringify(name)} is not hex`);
    return [name, Buffer.from(hex, 'hex')];
  });
}

/**
 * The function's secrets referenced as files, into FOLDER of the private /tmp: a folder of this uid alone
 * (0500 once written), each file 0400, created fresh (never through a link or over an existing file).
 * @param {string} folder
 * @param {Array<[string, Buffer]>} files
 */
function writeSecretFiles(folder, files) {
  if (files.length === 0) return;
  if (!path.isAbsolute(folder)) throw new ClaimError(`secrets_dir must be absolute, got ${JSON.stringify(folder)}`);
  fs.mkdirSync(folder, { mode: 0o700 });
  fs.chmodSync(folder, 0o700); // whatever the umask
  const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
  for (const [name, content] of files) {
    const fd = fs.openSync(path.join(folder, name), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o400);
    try {
      fs.fchmodSync(fd, 0o400);
      let done = 0;
      while (done < content.length) done += fs.writeSync(fd, content, done);
    } finally {
      fs.closeSync(fd);
    }
  }
  fs.chmodSync(folder, 0o500);
}

/**
 * Replace this process's environment with the claim's, completely: nothing of the spare's start-time
 * environment stays unless the claim repeats it (the supervisor sends the function's whole environment).
 * Node read NODE_PATH and HOME into its module search paths at start: they are read again, as a fresh
 * start of this environment would have them.
 * @param {unknown} env
 */
function takeEnvironment(env) {
  if (env === null || typeof env !== 'object' || Array.isArray(env)) throw new ClaimError('env is not an object');
  for (const key of Object.keys(process.env)) delete process.env[key];
  for (const [key, value] of Object.entries(env)) {
    if (key === '' || key.includes('=') || key.includes('\0') || String(value).includes('\0')) {
      throw new ClaimError(`bad variable ${JSON.stringify(key)}`);
    }
    process.env[key] = String(value);
  }
  delete process.env.SLESS_READY_FD;
  delete process.env.SLESS_SPARE;
  // @ts-ignore -- internal but stable since Node 0.x (sless-runtime.js uses it too): re-reads NODE_PATH and HOME.
  Module._initPaths();
}

/**
 * Exit 1 with why the claim could not be taken (never its content: it holds secrets).
 * @param {string} what
 * @param {unknown} err
 * @returns {never}
 */
function fail(what, err) {
  const message = err instanceof Error ? err.message : String(err);
  process.stderr.write(`sless-runtime: ${what}: ${message}\n`);
  process.exit(1);
}

/**
 * Listen on PORT (SLESS_HOST) before the claim, as a spare must (its port is its own from its start).
 * Returns once listening; exits 1 when it cannot.
 * @returns {Promise<http.Server>}
 */
function listenEarly() {
  const server = http.createServer({ noDelay: true });
  const port = Number(process.env.PORT || '8080');
  const host = process.env.SLESS_HOST || '0.0.0.0';
  return new Promise((resolve) => {
    server.once('error', (err) => fail(`cannot listen on ${host}:${port}`, err));
    server.listen(port, host, () => resolve(server));
  });
}

/**
 * A spare's whole life before its claim: listen, warm up (`warmUp`: the server's own, run before anything of
 * a tenant exists here), say so on `readyFd`, read the claim, take its environment, secret files and working
 * directory. What comes back hands the listening server over to the function's listeners (`release`) and
 * then replays what was held meanwhile (`replay`).
 * @param {number | undefined} readyFd
 * @param {() => Promise<void>} [warmUp]
 * @returns {Promise<{ release: () => http.Server, replay: () => void }>}
 */
async function waitForClaim(readyFd, warmUp) {
  const server = await listenEarly();
  if (warmUp) await warmUp();
  /** @type {Array<[string, unknown[]]>} */
  const held = [];
  /** @type {Array<[string, (...args: unknown[]) => void]>} */
  const holders = HELD_EVENTS.map((name) => [name, (...args) => { held.push([name, args]); }]);
  for (const [name, hold] of holders) server.on(name, hold);
  if (readyFd !== undefined) signalReady(readyFd);
  let claim;
  try {
    claim = parseClaim(readStdin());
  } catch (err) {
    fail('bad claim', err);
  }
  if (claim === undefined) process.exit(0);
  try {
    const files = secretFiles(claim.files);
    takeEnvironment(claim.env ?? {});
    writeSecretFiles(String(claim.secrets_dir ?? ''), files);
    process.chdir(typeof claim.cwd === 'string' && claim.cwd ? claim.cwd : '/');
  } catch (err) {
    fail('cannot take the claim', err);
  }
  return {
    release() {
      for (const [name, hold] of holders) server.removeListener(name, hold);
      server.removeAllListeners('error');
      return server;
    },
    replay() {
      for (const [name, args] of held.splice(0)) server.emit(name, ...args);
    },
  };
}

module.exports = { waitForClaim, signalReady, ClaimError, secretFiles, parseClaim };
