// Ceiling for the nodejs20 runtime: a bare http.createServer answering a fixed short text.
// Usage: node raw_node.js PORT   (listens on 127.0.0.1; Node's own keep-alive handling).
'use strict';
const http = require('node:http');

const BODY = Buffer.from('ok');
const HEADERS = { 'content-type': 'text/plain; charset=utf-8', 'content-length': String(BODY.length) };

http.createServer((req, res) => {
  req.resume(); // drain any request body
  res.writeHead(200, HEADERS);
  res.end(BODY);
}).listen(Number(process.argv[2]), '127.0.0.1');
