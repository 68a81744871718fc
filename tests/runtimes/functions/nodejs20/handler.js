'use strict';
// The shared test function of the runtime contract suite (nodejs20 flavour).

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function pickCase(event) {
  if (typeof event.case === 'string') return event.case;
  const parts = String(event._path || '').split('/');
  return parts[parts.length - 1];
}

exports.handle = async (event) => {
  const query = event._query || {};
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
