// The invoke panel: call the selected function through its http trigger and show the answer as text.
// A function's answer is hostile: its body and headers only ever become text nodes, redirects are not
// followed (a redirect to the API would otherwise carry the console's token along), and the call's log
// lines come from the API, not from the function.
"use strict";
import { $, api, authHeader, el, nsPath, say, seg, session, sleep } from "./api.js";
import { callLogNodes } from "./calllogs.js";

const MAX_SHOWN_CHARS = 64 * 1024;
const LOG_WAIT_MS = 10000;
let target = null;
let calls = 0;  // the latest call's number: an older call's logs, arriving late, are not shown over it

/** A request id of our own, sent with the call, so the call's record and logs can be found even when
 * the answer is a redirect whose headers the browser hides. */
function newRequestId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return `console-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** Point the panel at a function; `reset` clears the last answer (false when only its triggers changed). */
export function setInvokeTarget(fn, triggers, reset = true) {
  const http = triggers.find((t) => t.type === "http" && t.enabled) || null;
  target = { fn, http };
  $("invoke-send").disabled = !http;
  const status = $("invoke-status");
  if (!http) {
    say(status, "No enabled http trigger: enable or add one to call this function.", true);
    status.dataset.noTrigger = "1";
  } else if (reset || status.dataset.noTrigger) {
    say(status, "");
    delete status.dataset.noTrigger;
  }
  if (!reset) return;
  calls++;  // another function: the last call's late logs belong to the old one
  for (const id of ["invoke-request-id", "invoke-headers", "invoke-body"]) $(id).textContent = "";
  $("invoke-logs").replaceChildren();
  $("invoke-result").hidden = true;
}

async function send() {
  if (!target || !target.http) return;
  const { fn, http } = target;
  const method = $("invoke-method").value;
  let sub = $("invoke-path").value.trim();
  if (sub && !sub.startsWith("/")) sub = `/${sub}`;
  const body = $("invoke-payload").value;
  if (body && (method === "GET" || method === "HEAD")) {
    say($("invoke-status"), `${method} carries no body: choose POST, PUT or PATCH, or empty the body.`, true);
    return;
  }
  const requestId = newRequestId();
  const headers = { "X-Request-Id": requestId };
  if (body) headers["Content-Type"] = $("invoke-type").value.trim() || "application/json";
  if (http.auth === "token") Object.assign(headers, authHeader());  // the proxy checks it and removes it
  const mine = ++calls;
  say($("invoke-status"), "calling…");
  for (const id of ["invoke-request-id", "invoke-headers", "invoke-body"]) $(id).textContent = "";
  $("invoke-logs").replaceChildren();
  $("invoke-send").disabled = true;
  try {
    const resp = await fetch(`/fn/${seg(session.namespace)}/${seg(fn.name)}${sub}`,
      { method, headers, body: body || undefined, redirect: "manual", cache: "no-store", credentials: "omit" });
    await showAnswer(resp, requestId);
  } catch (e) {
    say($("invoke-status"), `the call failed: ${e.message}`, true);
    return;
  } finally {
    $("invoke-send").disabled = !target.http;
  }
  try {
    await showLogs(fn.name, $("invoke-request-id").textContent, mine);
  } catch (e) {
    if (mine === calls) say($("invoke-logs"), `the call's record: ${e.message}`, true);
  }
}

async function showAnswer(resp, requestId) {
  $("invoke-result").hidden = false;
  if (resp.type === "opaqueredirect") {
    say($("invoke-status"), "The function answered a redirect; the console does not follow it.");
    $("invoke-request-id").textContent = requestId;
    $("invoke-headers").textContent = "";
    $("invoke-body").textContent = "";
    return;
  }
  const text = await resp.text();  // the whole answer first: the status line says the call is complete
  $("invoke-request-id").textContent = resp.headers.get("X-Request-Id") || requestId;
  $("invoke-headers").textContent = [...resp.headers].map(([k, v]) => `${k}: ${v}`).join("\n");
  $("invoke-body").textContent = text.length > MAX_SHOWN_CHARS
    ? `${text.slice(0, MAX_SHOWN_CHARS)}\n… (${text.length - MAX_SHOWN_CHARS} more characters not shown)` : text;
  say($("invoke-status"), `${resp.status} ${resp.statusText}`.trim(), !resp.ok);
}

async function findRecord(name, requestId) {
  const page = await api("GET", nsPath(`/functions/${seg(name)}/invocations?limit=50`));
  return page.items.find((i) => i.request_id === requestId) || null;
}

/** The call's record (found by its request id; it is written just after the answer, so it is polled for a
 * few seconds), then its log lines from `.../invocations/{record id}/logs`. Where the API keeps no per-call
 * logs (404/501), the record alone. */
async function showLogs(name, requestId, mine) {
  const box = $("invoke-logs");
  box.replaceChildren(el("p", {}, "waiting for the call's record and logs…"));
  const deadline = Date.now() + LOG_WAIT_MS;
  let record = await findRecord(name, requestId);
  while (!record && Date.now() < deadline && mine === calls) {
    await sleep(300);
    record = await findRecord(name, requestId);
  }
  if (mine !== calls) return;
  if (!record) {
    box.replaceChildren(el("p", { class: "note" }, "No invocation record for this call yet: see Recent invocations."));
    return;
  }
  const nodes = await callLogNodes(name, record, "invoke");
  if (mine === calls) box.replaceChildren(...nodes);
}

$("invoke-form").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
