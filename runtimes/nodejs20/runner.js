// @ts-check
'use strict';
/**
 * sless nodejs20 one-shot runner (FunctionJob and cron runs): the event comes
 * from SLESS_EVENT, the handler is called once, its result is printed as JSON.
 *
 * Exit codes: 0 success (JSON + newline in SLESS_RESULT_FILE, else on stdout), 1 handler error or load
 * failure (details on stderr), 2 SLESS_EVENT is not a JSON object, 3 the code could not be fetched (sless-fetch.js),
 * 124 timeout (like coreutils `timeout`).
 * The process exits explicitly, so timers or sockets the handler left open
 * (a database pool, say) never keep a finished job alive.
 */

const fs = require('node:fs');
const rt = require('./sless-runtime.js');

const EXIT_ERROR = 1;
const EXIT_BAD_EVENT = 2;
const EXIT_TIMEOUT = 124;

/**
 * Write, then exit once the data is flushed (stdout may be a pipe).
 * @param {NodeJS.WriteStream} stream
 * @param {string} text
 * @param {number} code
 */
function writeAndExit(stream, text, code) {
  stream.write(text, () => process.exit(code));
}

/**
 * @param {string | undefined} raw
 * @returns {object | undefined} undefined when it is unusable (the exit is already under way)
 */
function parseEvent(raw) {
  if (raw === undefined || raw.trim() === '') return {};
  let event;
  try {
    event = JSON.parse(raw);
  } catch (err) {
    writeAndExit(process.stderr, `sless-runner: SLESS_EVENT is not valid JSON: ${rt.describeError(err).error}\n`, EXIT_BAD_EVENT);
    return undefined;
  }
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    writeAndExit(process.stderr, 'sless-runner: SLESS_EVENT must be a JSON object\n', EXIT_BAD_EVENT);
    return undefined;
  }
  return event;
}

/**
 * A cron firing on Kubernetes: the tick it was scheduled for, as `scheduled_at` (what `sless up` sends).
 * A CronJob names each Job `<cronjob>-<minutes since the epoch of its tick>`; the pod reads that name
 * into SLESS_CRON_JOB (downward API), as its event cannot hold a per-run value.
 * @param {object} event
 * @param {string | undefined} jobName
 */
function addCronTick(event, jobName) {
  const match = /(?:^|-)(\d+)$/.exec(jobName || '');
  if (match && event.type === 'cron' && !('scheduled_at' in event)) {
    event.scheduled_at = new Date(Number(match[1]) * 60000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  }
  return event;
}

async function main() {
  rt.installProcessGuards();
  // on Kubernetes the code is fetched first (exit 3 when it cannot be); loaded only then
  if (process.env.SLESS_CODE_URL !== undefined) await require('./sless-fetch.js').fetchFromEnv();
  const event = parseEvent(process.env.SLESS_EVENT);
  if (event === undefined) return;
  addCronTick(event, process.env.SLESS_CRON_JOB);
  let config;
  let handler;
  try {
    config = rt.loadConfig();
    handler = await rt.loadHandler(config);
  } catch (err) {
    rt.logLoadFailure(err, config);
    process.exit(EXIT_ERROR);
  }
  // The build's check: the entrypoint loads; the handler is not called.
  if (process.env.SLESS_CHECK_ONLY) process.exit(0);
  let result;
  try {
    // A stream is read to its end within the same time limit: a job's result is one value.
    const collecting = async (/** @type {object} */ ev, /** @type {object} */ ctx) => rt.collectStreams(await handler(ev, ctx));
    result = await rt.invoke(collecting, event, Math.min(config.timeoutSec, 2_147_483));
  } catch (err) {
    if (err instanceof rt.TimeoutError) {
      writeAndExit(process.stderr, `${err.message}\n`, EXIT_TIMEOUT);
      return;
    }
    rt.logError('handler failed', err);
    process.exit(EXIT_ERROR);
  }
  let text;
  try {
    text = rt.jsonText(result);
  } catch (err) {
    rt.logError('cannot encode the result as JSON', err);
    process.exit(EXIT_ERROR);
  }
  const resultFile = process.env.SLESS_RESULT_FILE;
  if (resultFile) {
    // The platform's own channel: what the handler printed on stdout stays out of the result.
    try {
      // /dev/fd/N is the inherited descriptor itself: a sandboxed user could not reopen the pipe by path.
      const inherited = /^\/dev\/fd\/(\d+)$/.exec(resultFile);
      fs.writeFileSync(inherited ? Number(inherited[1]) : resultFile, `${text}\n`);
    } catch (err) {
      writeAndExit(process.stderr, `sless-runner: cannot write the result to SLESS_RESULT_FILE: ${err.message}\n`, EXIT_ERROR);
      return;
    }
    process.exit(0);
  }
  writeAndExit(process.stdout, `${text}\n`, 0);
}

main();
