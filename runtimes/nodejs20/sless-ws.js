// @ts-check
'use strict';
/**
 * WebSocket connections of the nodejs20 runtime (runtimes/README.md, "WebSocket").
 *
 * A function accepts WebSocket connections by exporting `websocket(ws, event)` next to its
 * handler; without it, an upgrade request is refused with 400 `WebSocketNotAccepted` (deny by
 * default):
 *
 *   exports.websocket = async (ws, event) => {
 *     for await (const message of ws) ws.send(message); // string: text frame, Buffer: binary frame
 *   };
 *
 * RFC 6455, server side, standard library only: the handshake, masked client frames, fragmented
 * messages, ping/pong and the closing handshake. A message above SLESS_MAX_BODY_BYTES closes with
 * 1009; no traffic for SLESS_TIMEOUT_SEC closes with 1001 (an idle timeout).
 */

const crypto = require('node:crypto');

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
const CONT = 0x0;
const TEXT = 0x1;
const BINARY = 0x2;
const CLOSE = 0x8;
const PING = 0x9;
const PONG = 0xa;

const NOT_ACCEPTED = 'this function does not accept WebSocket connections (it exports no websocket handler)';

/**
 * @param {number} status
 * @param {string} message
 * @param {string} type
 * @returns {string} a complete HTTP answer that closes the connection
 */
function refusal(status, message, type) {
  const body = JSON.stringify({ error: message, type });
  const reason = status === 400 ? 'Bad Request' : 'Error';
  return `HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json\r\n`
    + `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`;
}

/** One accepted connection, as the function's `websocket(ws, event)` sees it. */
class WebSocket {
  /**
   * @param {import('node:net').Socket} socket
   * @param {number} maxBytes
   */
  constructor(socket, maxBytes) {
    this.socket = socket;
    this.maxBytes = maxBytes;
    this.closed = false;
    /** @type {number | null} the code the client closed with (or the one the runtime closed with) */
    this.closeCode = null;
    /** @type {Buffer} */
    this.buffer = Buffer.alloc(0);
    /** @type {Buffer[]} */
    this.parts = [];
    this.partsSize = 0;
    /** @type {number | null} */
    this.kind = null;
    /** @type {(string | Buffer)[]} */
    this.queue = [];
    /** @type {((message: string | Buffer | null) => void)[]} */
    this.waiting = [];
    this.decoder = new TextDecoder('utf-8', { fatal: true });
  }

  /**
   * The next message (a string for a text frame, a Buffer for a binary one), or null once closed.
   * @returns {Promise<string | Buffer | null>}
   */
  receive() {
    if (this.queue.length > 0) return Promise.resolve(/** @type {string | Buffer} */ (this.queue.shift()));
    if (this.closed) return Promise.resolve(null);
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  async* [Symbol.asyncIterator]() {
    for (;;) {
      const message = await this.receive();
      if (message === null) return;
      yield message;
    }
  }

  /**
   * Send one message: a string as a text frame, bytes as a binary one.
   * @param {string | Uint8Array} message
   */
  send(message) {
    if (this.closed) throw new Error('the WebSocket is closed');
    if (typeof message === 'string') this.frame(TEXT, Buffer.from(message));
    else if (message instanceof Uint8Array) this.frame(BINARY, Buffer.from(message));
    else throw new TypeError(`a WebSocket message is a string or bytes, not ${typeof message}`);
  }

  /**
   * Start the closing handshake (idempotent).
   * @param {number} [code]
   * @param {string} [reason]
   */
  close(code = 1000, reason = '') {
    if (this.closed) return;
    this.closed = true;
    this.closeCode = code;
    const payload = Buffer.alloc(2);
    payload.writeUInt16BE(code);
    this.frame(CLOSE, Buffer.concat([payload, Buffer.from(reason).subarray(0, 123)]));
    this.socket.end();
    this.flushWaiting();
  }

  /** @private */
  flushWaiting() {
    for (const resolve of this.waiting.splice(0)) resolve(null);
  }

  /**
   * @private
   * @param {number} opcode
   * @param {Buffer} payload
   */
  frame(opcode, payload) {
    if (this.socket.destroyed || !this.socket.writable) return;
    let head;
    if (payload.length < 126) {
      head = Buffer.from([0x80 | opcode, payload.length]);
    } else if (payload.length < 65536) {
      head = Buffer.alloc(4);
      head[0] = 0x80 | opcode;
      head[1] = 126;
      head.writeUInt16BE(payload.length, 2);
    } else {
      head = Buffer.alloc(10);
      head[0] = 0x80 | opcode;
      head[1] = 127;
      head.writeBigUInt64BE(BigInt(payload.length), 2);
    }
    this.socket.write(Buffer.concat([head, payload]));
  }

  /**
   * @private
   * @param {number} code
   * @param {string} reason
   */
  fail(code, reason) {
    this.close(code, reason);
    this.buffer = Buffer.alloc(0);
  }

  /**
   * Bytes from the client: parse every complete frame in them.
   * @param {Buffer} data
   */
  feed(data) {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, data]) : data;
    while (!this.closed) {
      const buf = this.buffer;
      if (buf.length < 2) return;
      const fin = buf[0] & 0x80;
      const opcode = buf[0] & 0x0f;
      const masked = buf[1] & 0x80;
      let length = buf[1] & 0x7f;
      let offset = 2;
      if (buf[0] & 0x70 || !masked) {
        this.fail(1002, 'protocol error'); // reserved bits, or an unmasked client frame
        return;
      }
      if (length === 126) {
        if (buf.length < 4) return;
        length = buf.readUInt16BE(2);
        offset = 4;
      } else if (length === 127) {
        if (buf.length < 10) return;
        const big = buf.readBigUInt64BE(2);
        if (big > BigInt(this.maxBytes)) {
          this.fail(1009, 'message too big');
          return;
        }
        length = Number(big);
        offset = 10;
      }
      if (opcode >= CLOSE && (length > 125 || !fin)) {
        this.fail(1002, 'protocol error');
        return;
      }
      if (this.partsSize + length > this.maxBytes) {
        this.fail(1009, 'message too big');
        return;
      }
      if (buf.length < offset + 4 + length) return;
      const mask = buf.subarray(offset, offset + 4);
      const payload = Buffer.from(buf.subarray(offset + 4, offset + 4 + length));
      for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
      this.buffer = buf.subarray(offset + 4 + length);
      this.onFrame(Boolean(fin), opcode, payload);
    }
  }

  /**
   * @private
   * @param {boolean} fin
   * @param {number} opcode
   * @param {Buffer} payload
   */
  onFrame(fin, opcode, payload) {
    if (opcode === PING) {
      this.frame(PONG, payload);
      return;
    }
    if (opcode === PONG) return;
    if (opcode === CLOSE) {
      const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
      this.close(code === 1005 ? 1000 : code);
      this.closeCode = code;
      return;
    }
    if (opcode === CONT) {
      if (this.kind === null) {
        this.fail(1002, 'protocol error');
        return;
      }
    } else if (opcode === TEXT || opcode === BINARY) {
      if (this.kind !== null) {
        this.fail(1002, 'protocol error');
        return;
      }
      this.kind = opcode;
    } else {
      this.fail(1002, 'protocol error');
      return;
    }
    this.parts.push(payload);
    this.partsSize += payload.length;
    if (!fin) return;
    const data = this.parts.length === 1 ? this.parts[0] : Buffer.concat(this.parts);
    const kind = this.kind;
    this.parts = [];
    this.partsSize = 0;
    this.kind = null;
    /** @type {string | Buffer} */
    let message = data;
    if (kind === TEXT) {
      try {
        message = this.decoder.decode(data);
      } catch {
        this.fail(1007, 'invalid UTF-8');
        return;
      }
    }
    const resolve = this.waiting.shift();
    if (resolve) resolve(message);
    else this.queue.push(message);
  }

  /** The socket is gone: whoever waits for a message gets null. */
  gone() {
    this.closed = true;
    this.flushWaiting();
  }
}

/**
 * Answer an upgrade request and run the function's websocket handler until the connection ends.
 * @param {import('node:http').IncomingMessage} req
 * @param {import('node:net').Socket} socket
 * @param {Buffer} head bytes after the request's head
 * @param {((ws: WebSocket, event: object) => unknown) | undefined} handler
 * @param {object} event
 * @param {{ maxBodyBytes: number, timeoutSec: number }} config
 * @param {(what: string, err: unknown) => void} logError
 * @returns {Promise<void>} settles when the connection is over
 */
async function serve(req, socket, head, handler, event, config, logError) {
  const key = String(req.headers['sec-websocket-key'] || '').trim();
  if (typeof handler !== 'function') {
    socket.end(refusal(400, NOT_ACCEPTED, 'WebSocketNotAccepted'));
    return;
  }
  if (String(req.headers['sec-websocket-version'] || '').trim() !== '13' || key.length !== 24) {
    socket.end(refusal(400, 'not a WebSocket version 13 handshake', 'BadRequest'));
    return;
  }
  const accept = crypto.createHash('sha1').update(key + GUID).digest('base64');
  socket.setNoDelay(true);
  socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n`
    + `Sec-WebSocket-Accept: ${accept}\r\n\r\n`);
  const ws = new WebSocket(socket, config.maxBodyBytes);
  socket.setTimeout(Math.min(config.timeoutSec * 1000, 2_147_483_647), () => ws.fail(1001, 'idle timeout'));
  socket.on('data', (data) => ws.feed(data));
  socket.on('close', () => ws.gone());
  socket.on('error', () => ws.gone());
  if (head.length > 0) ws.feed(head);
  try {
    await handler(ws, event);
    ws.close(1000);
  } catch (err) {
    logError(`websocket handler failed (${req.url})`, err);
    ws.close(1011, 'the function failed');
  }
}

module.exports = { serve, refusal, NOT_ACCEPTED, WebSocket };
