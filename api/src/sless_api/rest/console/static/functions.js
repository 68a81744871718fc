// Create and delete functions: the "New function" form (name, runtime, memory, timeout; POST .../functions), then
// the new function is opened; "Delete function" on a function's page asks first (DELETE .../functions/{name}).
"use strict";
import { $, api, nsPath, say, seg } from "./api.js";
import { clearFieldErrors, showFieldError } from "./fields.js";

const NUMBERS = ["memory_mb", "timeout_sec"];
let target = null;
let onCreated = async () => {};
let onDeleted = async () => {};

/** CREATED(fn) opens the new function; DELETED(name) closes its page and re-reads the list. */
export function setFunctionHandlers(created, deleted) {
  onCreated = created;
  onDeleted = deleted;
}

export function setDeleteTarget(fn) { target = fn; }

async function create() {
  const status = $("create-status");
  clearFieldErrors("create");
  const body = { name: $("create-name").value.trim(), runtime: $("create-runtime").value };
  for (const key of NUMBERS) {
    const text = $(`create-${key}`).value.trim();
    if (text !== "") body[key] = Number(text);
  }
  say(status, `creating ${body.name}…`);
  try {
    const fn = await api("POST", nsPath("/functions"), body);
    for (const key of ["name", ...NUMBERS]) $(`create-${key}`).value = "";
    say(status, `function ${fn.name} created`);
    await onCreated(fn);
  } catch (e) {
    showFieldError("create", e, status);
  }
}

async function remove() {
  const fn = target;
  if (!fn) return;
  const status = $("detail-status");
  if (!window.confirm(`Delete function ${fn.name}? Its code and versions are deleted; this cannot be undone.`)) {
    say(status, "delete cancelled");
    return;
  }
  try {
    await api("DELETE", nsPath(`/functions/${seg(fn.name)}`));
    target = null;
    await onDeleted(fn.name);
  } catch (e) {
    say(status, e.message, true);
  }
}

$("create-form").addEventListener("submit", (ev) => { ev.preventDefault(); create(); });
$("fn-delete").addEventListener("click", remove);
