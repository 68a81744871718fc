'use strict';
/**
 * sless Node.js runtime: the function's code, fetched by the runtime itself before the handler loads.
 *
 * On Kubernetes a function without dependencies runs on this image with its code fetched at pod start. The
 * runtime container does that itself rather than an init container of the platform image: a container start
 * less on every cold start. server.js and runner.js await fetchFromEnv() first (loading this module only when
 * SLESS_CODE_URL is set), so the server listens (and the pod turns Ready) only once the code is there.
 *
 * The operator sets SLESS_CODE_URL, a URL signed for exactly the code archive (from the function's Secret,
 * so renewing it restarts nothing; removed from process.env here, before the handler loads),
 * SLESS_CODE_KEY (its name in messages), SLESS_CODE_SHA256, SLESS_CODE_MAX_BYTES and
 * SLESS_CODE_REPORT_FILE (the termination log). Without SLESS_CODE_URL nothing is fetched.
 *
 * The archive is untrusted input, checked as the Python runtime's sless_fetch.py and the platform's
 * contextfetch check it, with the same messages (the operator shows them in the Function's status): only
 * http(s), the SHA-256 checked before anything is unpacked, regular files and directories only (a small
 * ustar reader: pax and GNU long names are read, every other entry type refused), no absolute paths, '..',
 * backslashes, NULs or duplicates, at most SLESS_CODE_MAX_ENTRIES entries and SLESS_CODE_MAX_BYTES bytes, the
 * download bounded in time. A refusal goes to SLESS_CODE_REPORT_FILE and stderr, and the process exits
 * EXIT_FETCH (3), which the operator reads as "the code could not be fetched".
 *
 * The code directory is a writable emptyDir: the files are made read-only (0444, 0555 when executable,
 * directories 0555), but they belong to the function's user, so a function could still change its own
 * code, in its own pod only, until the pod's next start fetches it again.
 */

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const zlib = require('node:zlib');

const EXIT_FETCH = 3;
const WHAT = 'code archive';
const DEFAULT_MAX_BYTES = 256 * 1024 * 1024;
const DEFAULT_MAX_ENTRIES = 20000;
const SOCKET_TIMEOUT_MS = 30000;
const DOWNLOAD_TIMEOUT_MS = 300000;
const MESSAGE_TAIL = 4000;
// a pax or GNU long-name header holds a path or two, not megabytes
const MAX_EXTENSION_BYTES = 1024 * 1024;
const BLOCK = 512;

class FetchError extends Error {}

/** NAME as Python's repr() writes a string: the messages match the other fetchers' word for word. */
function pyRepr(name) {
  const quote = name.includes("'") && !name.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of name) {
    const code = ch.codePointAt(0);
    if (ch === '\\' || ch === quote) out += `\\${ch}`;
    else if (ch === '\n') out += '\\n';
    else if (ch === '\r') out += '\\r';
    else if (ch === '\t') out += '\\t';
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, '0')}`;
    else out += ch;
  }
  return out + quote;
}

function httpReason(key, status, message) {
  const why = { 403: 'access denied or the URL expired', 404: 'no such object' }[status] || message;
  return `cannot read ${key}: HTTP ${status} (${why})`;
}

/** Stream URL into the file descriptor FD; resolves to its SHA-256, which must equal SHA256. No redirect. */
function download(url, key, fd, sha256, maxBytes) {
  let client;
  if (/^https:\/\//.test(url)) client = require('node:https');
  else if (/^http:\/\//.test(url)) client = require('node:http');
  else return Promise.reject(new FetchError(`cannot read ${key}: the download URL is not http(s)`));
  return new Promise((resolve, reject) => {
    let settled = false;
    const fail = (err) => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      request.destroy();
      reject(err instanceof FetchError ? err : new FetchError(`cannot read ${key}: ${err.message}`));
    };
    const deadline = setTimeout(
      () => fail(new FetchError(`cannot read ${key}: not downloaded within ${DOWNLOAD_TIMEOUT_MS / 1000}s`)),
      DOWNLOAD_TIMEOUT_MS,
    );
    const request = client.get(url, { timeout: SOCKET_TIMEOUT_MS, agent: false }, (response) => {
      if (response.statusCode !== 200) {
        response.resume();
        fail(new FetchError(httpReason(key, response.statusCode, response.statusMessage)));
        return;
      }
      const digest = crypto.createHash('sha256');
      let size = 0;
      response.on('data', (chunk) => {
        if (settled) return;
        size += chunk.length;
        if (size > maxBytes) {
          fail(new FetchError(`${WHAT} ${key} is larger than ${maxBytes} bytes`));
          return;
        }
        digest.update(chunk);
        try {
          for (let off = 0; off < chunk.length; ) off += fs.writeSync(fd, chunk, off);
        } catch (err) {
          fail(err);
        }
      });
      response.on('error', fail);
      response.on('aborted', () => fail(new Error('the connection was closed during the download')));
      response.on('end', () => {
        if (settled) return;
        if (!response.complete) {
          fail(new Error('the connection was closed during the download'));
          return;
        }
        settled = true;
        clearTimeout(deadline);
        const found = digest.digest('hex');
        if (found !== sha256.toLowerCase()) {
          reject(new FetchError(`${WHAT} ${key} has SHA-256 ${found}, expected ${sha256.toLowerCase()}`));
        } else resolve(found);
      });
    });
    request.on('timeout', () => fail(new Error(`no answer within ${SOCKET_TIMEOUT_MS / 1000}s`)));
    request.on('error', fail);
  });
}

/** The member's relative path parts, or FetchError when it could land outside the destination. */
function memberPath(name) {
  if (!name || name.includes('\\') || name.includes('\0') || name.startsWith('/')) {
    throw new FetchError(`unsafe path in ${WHAT}: ${pyRepr(name)}`);
  }
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.length === 0 || parts.includes('..')) throw new FetchError(`unsafe path in ${WHAT}: ${pyRepr(name)}`);
  return parts;
}

function cString(buf, start, length) {
  const field = buf.subarray(start, start + length);
  const end = field.indexOf(0);
  return field.subarray(0, end === -1 ? field.length : end).toString('utf8');
}

function octal(buf, start, length, what) {
  const text = buf.subarray(start, start + length).toString('latin1').replace(/[\0 ]+$/, '').replace(/^ +/, '');
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw new FetchError(`${WHAT} is not a readable tar.gz: invalid ${what} field`);
  return parseInt(text, 8);
}

/** The ustar header's checksum: the sum of its bytes with the checksum field taken as spaces. */
function checksumOk(header) {
  const stored = octal(header, 148, 8, 'checksum');
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const byte = i >= 148 && i < 156 ? 0x20 : header[i];
    unsigned += byte;
    signed += byte > 127 ? byte - 256 : byte;
  }
  return stored === unsigned || stored === signed;
}

/** The records of a pax extended header ("<length> <key>=<value>\n"). */
function paxRecords(data) {
  const records = {};
  let off = 0;
  while (off < data.length) {
    const space = data.indexOf(0x20, off);
    const length = space === -1 ? NaN : Number(data.subarray(off, space).toString('latin1'));
    if (!Number.isInteger(length) || length <= 0 || off + length > data.length) {
      throw new FetchError(`${WHAT} is not a readable tar.gz: invalid pax header`);
    }
    const record = data.subarray(space + 1, off + length - 1).toString('utf8');
    const eq = record.indexOf('=');
    if (eq > 0) records[record.slice(0, eq)] = record.slice(eq + 1);
    off += length;
  }
  return records;
}

/**
 * A push parser of a tar stream that writes its regular files and directories below DEST, checking each
 * entry as sless_fetch.py's unpack does, in the same order. made collects [path, mode] to make read-only.
 */
class TarWriter {
  constructor(dest, maxBytes, maxEntries) {
    Object.assign(this, { dest, maxBytes, maxEntries });
    this.header = [];
    this.headerLength = 0;
    this.entry = null; // {remaining, pad, fd?, data?: Buffer[], kind}
    this.extension = {}; // what pax or GNU long-name headers say of the next entry
    this.count = 0;
    this.extensions = 0;
    this.total = 0;
    this.seen = new Set();
    this.made = [];
    this.ended = false;
  }

  push(chunk) {
    let off = 0;
    while (off < chunk.length && !this.ended) {
      const entry = this.entry;
      if (entry) {
        const n = Math.min(entry.remaining, chunk.length - off);
        if (n > 0) {
          const part = chunk.subarray(off, off + n);
          if (entry.fd !== undefined) {
            for (let w = 0; w < part.length; ) w += fs.writeSync(entry.fd, part, w);
          } else if (entry.data) entry.data.push(Buffer.from(part));
          entry.remaining -= n;
          off += n;
        }
        const p = Math.min(entry.pad, chunk.length - off);
        entry.pad -= p;
        off += p;
        if (entry.remaining === 0 && entry.pad === 0) this.finishEntry();
        continue;
      }
      const n = Math.min(BLOCK - this.headerLength, chunk.length - off);
      this.header.push(chunk.subarray(off, off + n));
      this.headerLength += n;
      off += n;
      if (this.headerLength === BLOCK) {
        const header = Buffer.concat(this.header);
        this.header = [];
        this.headerLength = 0;
        this.readHeader(header);
      }
    }
  }

  finishEntry() {
    const entry = this.entry;
    this.entry = null;
    if (entry.fd !== undefined) fs.closeSync(entry.fd);
    if (entry.kind === 'x') {
      const records = paxRecords(Buffer.concat(entry.data));
      if (records.path !== undefined) this.extension.path = records.path;
      if (records.size !== undefined) {
        if (!/^[0-9]+$/.test(records.size)) throw new FetchError(`${WHAT} is not a readable tar.gz: invalid pax size`);
        this.extension.size = Number(records.size);
      }
    } else if (entry.kind === 'L') {
      this.extension.path = cString(Buffer.concat(entry.data), 0, entry.size);
    }
  }

  readHeader(header) {
    if (header.every((b) => b === 0)) {
      this.ended = true; // the end-of-archive block: what follows is not read
      return;
    }
    if (!checksumOk(header)) throw new FetchError(`${WHAT} is not a readable tar.gz: bad checksum`);
    const type = String.fromCharCode(header[156]);
    let size = octal(header, 124, 12, 'size');
    if (type === 'x' || type === 'g' || type === 'L' || type === 'K') {
      this.extensions += 1;
      if (this.extensions > this.maxEntries || size > MAX_EXTENSION_BYTES) {
        throw new FetchError(`${WHAT} has more than ${this.maxEntries} entries`);
      }
      // global pax headers and GNU long link names say nothing a file or directory uses: read and dropped
      const keep = type === 'x' || type === 'L';
      this.startEntry({ kind: type, size, data: keep ? [] : undefined });
      return;
    }
    let name = cString(header, 0, 100);
    const magic = header.subarray(257, 263).toString('latin1');
    const prefix = magic === 'ustar\0' ? cString(header, 345, 155) : '';
    if (prefix) name = `${prefix}/${name}`;
    const extension = this.extension;
    this.extension = {};
    // as Python's tarfile reads them (the fetchers agree on every name): an old-style regular entry named
    // 'x/' is a folder, a folder's name and a pax path lose their trailing slashes
    let kind = type;
    if (type === '\0' && name.endsWith('/')) kind = '5';
    if (kind === '5') name = name.replace(/\/+$/, '');
    if (extension.path !== undefined) name = extension.path.replace(/\/+$/, '');
    if (extension.size !== undefined) size = extension.size;
    const mode = octal(header, 100, 8, 'mode');

    this.count += 1;
    if (this.count > this.maxEntries) throw new FetchError(`${WHAT} has more than ${this.maxEntries} entries`);
    const parts = memberPath(name);
    const rel = parts.join('/');
    if (this.seen.has(rel)) throw new FetchError(`duplicate entry in ${WHAT}: ${pyRepr(name)}`);
    this.seen.add(rel);
    const target = path.join(this.dest, ...parts);
    if (kind === '5') {
      this.fsStep(() => fs.mkdirSync(target, { recursive: true }));
      this.made.push([target, 0o555]);
      this.startEntry({ kind, size });
      return;
    }
    if (!(kind === '0' || kind === '\0' || kind === '7')) {
      throw new FetchError(`${WHAT} entry ${pyRepr(name)} is not a regular file or directory`);
    }
    if (size > this.maxBytes - this.total) throw new FetchError(`${WHAT} unpacks to more than ${this.maxBytes} bytes`);
    this.fsStep(() => fs.mkdirSync(path.dirname(target), { recursive: true }));
    const existing = this.fsStep(() => fs.lstatSync(target, { throwIfNoEntry: false }));
    if (existing && (existing.isSymbolicLink() || existing.isDirectory())) {
      throw new FetchError(`${WHAT} entry ${pyRepr(name)} clashes with another entry`);
    }
    const fd = this.fsStep(() => fs.openSync(target, 'wx', 0o600));
    this.total += size;
    this.made.push([target, mode & 0o111 ? 0o555 : 0o444]);
    this.startEntry({ kind, size, fd });
  }

  startEntry(entry) {
    entry.remaining = entry.size;
    entry.pad = (BLOCK - (entry.size % BLOCK)) % BLOCK;
    this.entry = entry;
    if (entry.remaining === 0 && entry.pad === 0) this.finishEntry();
  }

  /** A file-system step: its failure reads as the other fetchers' OSError does. */
  fsStep(step) {
    try {
      return step();
    } catch (err) {
      throw new FetchError(`${WHAT} is not a readable tar.gz: ${err.message}`);
    }
  }

  /** At the end of the stream: an entry cut short is an error, a missing end block is not. */
  close() {
    if (this.entry && this.entry.fd !== undefined) fs.closeSync(this.entry.fd);
    if (this.entry || this.headerLength > 0) {
      throw new FetchError(`${WHAT} is not a readable tar.gz: unexpected end of data`);
    }
    if (this.count === 0 && !this.ended && this.extensions === 0) {
      throw new FetchError(`${WHAT} is not a readable tar.gz: empty file`);
    }
  }
}

/**
 * Unpack the tar.gz in the file descriptor FD (read from its start, then closed) into DEST; resolves to
 * [path, mode] once FD is closed: a read still under way on it must not meet the number reused.
 */
function unpack(fd, dest, maxBytes, maxEntries) {
  return new Promise((resolve, reject) => {
    const writer = new TarWriter(dest, maxBytes, maxEntries);
    const source = fs.createReadStream(null, { fd, start: 0, autoClose: true });
    const gunzip = zlib.createGunzip();
    let done = false;
    const finish = (err) => {
      if (done) return;
      done = true;
      gunzip.destroy();
      source.destroy();
      if (source.closed) settle(err);
      else source.once('close', () => settle(err));
    };
    const settle = (err) => {
      if (err) {
        if (writer.entry && writer.entry.fd !== undefined) {
          try {
            fs.closeSync(writer.entry.fd);
          } catch {
            // closed already
          }
        }
        reject(err instanceof FetchError ? err : new FetchError(`${WHAT} is not a readable tar.gz: ${err.message}`));
        return;
      }
      try {
        writer.close();
        resolve(writer.made);
      } catch (closeErr) {
        reject(closeErr);
      }
    };
    gunzip.on('data', (chunk) => {
      if (done) return;
      try {
        writer.push(chunk);
        if (writer.ended) finish(null);
      } catch (err) {
        finish(err);
      }
    });
    gunzip.on('end', () => finish(null));
    gunzip.on('error', finish);
    source.on('error', finish);
    source.pipe(gunzip);
  });
}

/** Empty DEST (a container restarted in the same pod finds the last start's read-only code there). */
function clear(dest) {
  const writable = (dir) => {
    for (const item of fs.readdirSync(dir, { withFileTypes: true })) {
      if (item.isDirectory()) {
        const sub = path.join(dir, item.name);
        fs.chmodSync(sub, 0o700);
        writable(sub);
      }
    }
  };
  writable(dest);
  for (const name of fs.readdirSync(dest)) fs.rmSync(path.join(dest, name), { recursive: true, force: true });
}

/** Download, check and unpack the code into DEST, then make it read-only; resolves to its SHA-256. The
 * archive lies unlinked in DEST while it is read (no other writable place is large enough for it). */
async function fetchCode(url, key, sha256, dest, maxBytes, maxEntries) {
  if (!/^[0-9a-fA-F]{64}$/.test(sha256)) {
    throw new FetchError(`SLESS_CODE_SHA256 must be 64 hex digits, got ${pyRepr(sha256)}`);
  }
  let fd; // the unlinked archive: unpack() closes it
  try {
    fs.mkdirSync(dest, { recursive: true });
    clear(dest);
    const archive = path.join(dest, '.sless-code.tar.gz');
    fd = fs.openSync(archive, 'wx+', 0o600);
    fs.unlinkSync(archive);
  } catch (err) {
    throw new FetchError(`cannot write the code into ${dest}: ${err.message}`);
  }
  try {
    let found;
    try {
      found = await download(url, key, fd, sha256, maxBytes);
    } catch (err) {
      fs.closeSync(fd);
      throw err;
    }
    const made = await unpack(fd, dest, maxBytes, maxEntries);
    for (const [target, mode] of made.reverse()) fs.chmodSync(target, mode); // files before their folders
    return found;
  } catch (err) {
    try {
      clear(dest); // nothing half-unpacked is ever loaded
    } catch {
      // the report says what went wrong first
    }
    if (err instanceof FetchError) throw err;
    throw new FetchError(`cannot write the code into ${dest}: ${err.message}`);
  }
}

/** MESSAGE on stderr and, in a pod, as the container's termination message. */
function report(message) {
  process.stderr.write(`${message}\n`);
  const file = process.env.SLESS_CODE_REPORT_FILE;
  if (file) {
    try {
      fs.writeFileSync(file, message.slice(-MESSAGE_TAIL));
    } catch {
      // not in a pod
    }
  }
}

function intFromEnv(name, fallback) {
  const raw = process.env[name] || '';
  if (raw === '') return fallback;
  if (!/^[0-9]+$/.test(raw)) throw new FetchError(`${name} must be an integer, got ${pyRepr(raw)}`);
  return Number(raw);
}

/**
 * Fetch the code when SLESS_CODE_URL says where it is; on failure report why and exit EXIT_FETCH. The URL
 * leaves process.env either way: the handler never sees it.
 */
async function fetchFromEnv() {
  const url = process.env.SLESS_CODE_URL || '';
  delete process.env.SLESS_CODE_URL;
  if (!url) return;
  const key = process.env.SLESS_CODE_KEY || 'code';
  const dest = path.resolve(process.env.SLESS_CODE_DIR || '/app/function');
  const started = process.hrtime.bigint();
  let found;
  try {
    const maxBytes = intFromEnv('SLESS_CODE_MAX_BYTES', DEFAULT_MAX_BYTES);
    const maxEntries = intFromEnv('SLESS_CODE_MAX_ENTRIES', DEFAULT_MAX_ENTRIES);
    found = await fetchCode(url, key, process.env.SLESS_CODE_SHA256 || '', dest, maxBytes, maxEntries);
  } catch (err) {
    report(`${WHAT}: ${err instanceof FetchError ? err.message : err.stack || err}`);
    process.exit(EXIT_FETCH);
  }
  const took = Number(process.hrtime.bigint() - started) / 1e6;
  // tagged as no call's (runtimes/README.md): the runtime's own line, never part of a run's or a call's output
  process.stderr.write(`@sless:- ${WHAT} ${key} (sha256 ${found}) unpacked into ${dest} in ${took.toFixed(0)} ms\n`);
}

module.exports = { EXIT_FETCH, FetchError, fetchCode, fetchFromEnv, pyRepr };
