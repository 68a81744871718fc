// The sless console: sign in with a tenant token, list functions, jobs and secrets, create a function, and open a
// function's detail (delete it, settings, triggers and their dead letters, scaling, invoke, upload, versions and
// traffic split, run as a job, charts of its recent calls, recent invocations, source). Everything it shows comes
// from the REST API and is rendered as text.
"use strict";
import { $, api, el, listAll, nsPath, say, seg, session } from "./api.js";
import { callLogNodes } from "./calllogs.js";
import { setChartsTarget } from "./charts.js";
import { setDeadLetterTarget } from "./deadletters.js";
import { setDeleteTarget, setFunctionHandlers } from "./functions.js";
import { highlight } from "./highlight.js";
import { setInvokeTarget } from "./invoke.js";
import { loadJobs, setJobFunction } from "./jobs.js";
import { loadSecrets } from "./secrets.js";
import { setUploadTarget } from "./upload.js";
import { scaleShort, setScaleTarget } from "./scale.js";
import { setSettingsTarget } from "./settings.js";
import { renderTriggers, resetTriggerForm } from "./triggers.js";
import { loadVersions, setVersionsTarget } from "./versions.js";

let current = null;

async function loadFunctions() {
  const [fns, trigs] = await Promise.all([listAll(nsPath("/functions")), listAll(nsPath("/triggers"))]);
  const byFn = {};
  for (const t of trigs) (byFn[t.function] ||= []).push(t);
  const active = (f) => (f.phase === "Ready" && (byFn[f.name] || []).some((t) => t.enabled)) ? 0 : 1;
  fns.sort((a, b) => active(a) - active(b) || a.name.localeCompare(b.name));
  const rows = $("function-rows");
  rows.replaceChildren();
  for (const f of fns) {
    const ts = byFn[f.name] || [];
    const http = ts.find((t) => t.type === "http" && t.enabled);
    rows.append(el("tr", { class: "fn", "data-function": f.name },
      el("td", {}, el("button", { type: "button", class: "link", onclick: () => showDetail(f, ts) }, f.name)),
      el("td", { class: `phase-${f.phase}` }, f.phase), el("td", {}, f.runtime), el("td", {}, scaleShort(f.scale)),
      el("td", {}, ts.map((t) => `${t.type}${t.enabled ? "" : " (off)"}`).join(", ") || "-"),
      el("td", {}, http ? http.url : "-"), el("td", {}, f.created_at || ""), el("td", {}, f.last_built_at || "-"),
      el("td", { class: "message" }, f.message)));
  }
  return { fns, byFn };
}

/** Re-read the lists and the open function (after a toggle, an upload or a refresh). */
async function reload() {
  const { fns, byFn } = await loadFunctions();
  if (current) {
    const fn = fns.find((f) => f.name === current.name);
    if (fn) await showDetail(fn, byFn[fn.name] || [], false);
  }
}

async function renderInvocations(fn) {
  const inv = await api("GET", nsPath(`/functions/${seg(fn.name)}/invocations?limit=50`));
  const rows = $("invocation-rows");
  rows.replaceChildren();
  for (const i of inv.items) {
    rows.append(el("tr", { "data-invocation": String(i.id) },
      el("td", {}, new Date(i.started_at * 1000).toISOString()), el("td", {}, i.method),
      el("td", {}, i.path), el("td", {}, String(i.status)), el("td", {}, Number(i.duration_ms).toFixed(1)),
      el("td", {}, i.cold == null ? "" : i.cold ? "cold" : "warm"),  // null: a job, cron or event run, a 404
      el("td", {}, i.trigger), el("td", {}, i.request_id || ""), el("td", { class: "message" }, i.error || ""),
      el("td", {}, el("button", { type: "button", class: "call-logs", "aria-label": `Logs of call ${i.id}`,
        onclick: () => showCallLogs(fn, i) }, "Logs"))));
  }
}

async function showCallLogs(fn, record) {
  const box = $("invocation-logs");
  box.replaceChildren(el("h4", {}, `Call ${record.id} (${record.request_id || "no request id"})`));
  try {
    box.append(...await callLogNodes(fn.name, record, "call"));
  } catch (e) {
    say(box, e.message, true);
  }
  box.focus();
}

async function renderSource(fn) {
  const src = await api("GET", nsPath(`/functions/${seg(fn.name)}/source`));
  const box = $("source");
  box.replaceChildren();
  for (const file of src.files) {
    box.append(el("h4", {}, file.name), file.binary ? el("p", {}, "(binary file)") : highlight(file.content));
  }
  if (!src.files.length) box.append(el("p", {}, "(no code uploaded)"));
}

async function showDetail(fn, triggers, fresh = true) {
  const opened = !current || current.name !== fn.name || fresh;
  current = fn;
  const reloaded = () => reload().catch((e) => say($("detail-status"), e.message, true));
  $("detail").hidden = false;
  $("detail-title").textContent = `${fn.name} (${fn.runtime}, ${fn.phase})`;
  renderTriggers(fn, triggers, reloaded);
  setDeleteTarget(fn);
  setDeadLetterTarget(fn, triggers, opened);
  if (opened) {
    say($("detail-status"), "");
    $("invocation-logs").replaceChildren();
    setInvokeTarget(fn, triggers);
    setUploadTarget(fn, () => reload().catch((e) => say($("detail-status"), e.message, true)));
    setJobFunction(fn);
    setVersionsTarget(fn, () => reload().catch((e) => say($("detail-status"), e.message, true)));
    setScaleTarget(fn, reloaded);
    setSettingsTarget(fn, reloaded);
    resetTriggerForm(fn);
    $("detail-title").focus();
  } else {
    setInvokeTarget(fn, triggers, false);
    setScaleTarget(fn, reloaded, false);
    setSettingsTarget(fn, reloaded, false);
  }
  try {
    await Promise.all([renderInvocations(fn), renderSource(fn), loadVersions(), setChartsTarget(fn, opened)]);
  } catch (e) {
    say($("detail-status"), e.message, true);
  }
}

async function start() {
  let who;
  try {
    who = await api("GET", "/v1/whoami");
  } catch (e) {  // the token is refused: say why and forget it
    say($("login-error"), e.message, true);
    sessionStorage.removeItem("sless-token");
    return;
  }
  session.namespace = who.namespace;
  $("who").textContent = `${who.sub} · ${who.namespace}`;
  $("login").hidden = true;
  for (const id of ["functions", "jobs", "secrets", "logout"]) $(id).hidden = false;
  // A list that fails to load says so in its own section; the others still show.
  loadFunctions().catch((e) => say($("functions-status"), e.message, true));
  loadJobs().catch((e) => say($("jobs-status"), e.message, true));
  loadSecrets().catch((e) => say($("secret-status"), e.message, true));
}

setFunctionHandlers(async (fn) => {
  const { byFn } = await loadFunctions();
  await showDetail(fn, byFn[fn.name] || []);
}, async (name) => {
  current = null;
  $("detail").hidden = true;
  await loadFunctions().catch((e) => say($("functions-status"), e.message, true));
  say($("functions-status"), `function ${name} deleted`);
  $("functions-title").focus();
});

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  session.token = $("token").value.trim();
  sessionStorage.setItem("sless-token", session.token);
  start();
});
$("logout").addEventListener("click", () => { sessionStorage.removeItem("sless-token"); location.reload(); });
$("refresh").addEventListener("click", () => reload().catch((e) => say($("functions-status"), e.message, true)));
$("login-form").querySelector("button[type=submit]").disabled = false;
if (session.token) start();
