// The sless console: reads the REST API with the tenant's token (kept in sessionStorage only).
"use strict";
const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("sless-token") || "";
let namespace = "";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

async function api(method, path, body) {
  const resp = await fetch(path, {
    method, headers: { Authorization: `Bearer ${token}`, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = resp.status === 204 ? null : await resp.json();
  if (!resp.ok) throw new Error(data && data.error ? data.error : `HTTP ${resp.status}`);
  return data;
}

const KEYWORDS = new Set(("def return if elif else for while in import from as class try except finally raise with " +
  "async await lambda None True False pass break continue yield not and or is function const let var new this " +
  "throw catch typeof exports require module package func go defer chan map struct interface type range nil " +
  "switch case default select").split(" "));

function highlight(code) {
  const pre = el("pre", { class: "code" });
  const re = /(#[^\n]*|\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)|(\b\d+(?:\.\d+)?\b)|([A-Za-z_]\w*)/g;
  let last = 0;
  for (const m of code.matchAll(re)) {
    pre.append(code.slice(last, m.index));
    const [text, com, str, num, word] = m;
    if (com) pre.append(el("span", { class: "tok-com" }, text));
    else if (str) pre.append(el("span", { class: "tok-str" }, text));
    else if (num) pre.append(el("span", { class: "tok-num" }, text));
    else if (word && KEYWORDS.has(word)) pre.append(el("span", { class: "tok-kw" }, text));
    else pre.append(text);
    last = m.index + text.length;
  }
  pre.append(code.slice(last));
  return pre;
}

async function loadFunctions() {
  const base = `/v1/namespaces/${namespace}`;
  const [fns, trigs] = await Promise.all([api("GET", `${base}/functions?limit=1000`), api("GET", `${base}/triggers?limit=1000`)]);
  const byFn = {};
  for (const t of trigs.items) (byFn[t.function] ||= []).push(t);
  const active = (f) => (f.phase === "Ready" && (byFn[f.name] || []).some((t) => t.enabled)) ? 0 : 1;
  fns.items.sort((a, b) => active(a) - active(b) || a.name.localeCompare(b.name));
  const rows = $("function-rows");
  rows.replaceChildren();
  for (const f of fns.items) {
    const ts = byFn[f.name] || [];
    const http = ts.find((t) => t.type === "http" && t.enabled);
    rows.append(el("tr", { class: "fn", onclick: () => showDetail(f, ts) },
      el("td", {}, f.name), el("td", { class: `phase-${f.phase}` }, f.phase), el("td", {}, f.runtime),
      el("td", {}, ts.map((t) => `${t.type}${t.enabled ? "" : " (off)"}`).join(", ") || "-"),
      el("td", {}, http ? http.url : "-"), el("td", {}, f.created_at || ""), el("td", {}, f.last_built_at || "-"),
      el("td", { class: "message" }, f.message)));
  }
}

async function showDetail(f, triggers) {
  const base = `/v1/namespaces/${namespace}`;
  $("detail").hidden = false;
  $("detail-title").textContent = `${f.name} (${f.runtime}, ${f.phase})`;
  const list = $("trigger-list");
  list.replaceChildren();
  for (const t of triggers) {
    const box = el("input", { type: "checkbox" });
    box.checked = t.enabled;
    box.addEventListener("change", async () => {
      try { await api("PATCH", `${base}/triggers/${t.name}`, { enabled: box.checked }); await loadFunctions(); }
      catch (e) { box.checked = !box.checked; alert(e.message); }
    });
    list.append(el("li", {}, el("label", {}, box, ` ${t.name}: ${t.type}${t.schedule ? ` (${t.schedule})` : ""}`)));
  }
  const inv = await api("GET", `${base}/functions/${f.name}/invocations?limit=50`);
  const rows = $("invocation-rows");
  rows.replaceChildren();
  for (const i of inv.items) {
    rows.append(el("tr", {}, el("td", {}, new Date(i.started_at * 1000).toISOString()), el("td", {}, i.method),
      el("td", {}, i.path), el("td", {}, String(i.status)), el("td", {}, i.duration_ms.toFixed(1)),
      el("td", {}, i.trigger), el("td", { class: "message" }, i.error || "")));
  }
  const src = await api("GET", `${base}/functions/${f.name}/source`);
  const box = $("source");
  box.replaceChildren();
  for (const file of src.files) {
    box.append(el("h4", {}, file.name), file.binary ? el("p", {}, "(binary file)") : highlight(file.content));
  }
}

async function start() {
  try {
    const who = await api("GET", "/v1/whoami");
    namespace = who.namespace;
    $("who").textContent = `${who.sub} · ${who.namespace}`;
    $("login").hidden = true; $("functions").hidden = false; $("logout").hidden = false;
    await loadFunctions();
  } catch (e) {
    $("login-error").textContent = e.message;
    sessionStorage.removeItem("sless-token");
  }
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  token = $("token").value.trim();
  sessionStorage.setItem("sless-token", token);
  start();
});
$("logout").addEventListener("click", () => { sessionStorage.removeItem("sless-token"); location.reload(); });
$("refresh").addEventListener("click", () => loadFunctions().catch((e) => alert(e.message)));
if (token) start();
