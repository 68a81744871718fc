// Settings of the selected function: memory, timeout, max concurrency and its environment variables (one
// name/value row each), saved with PATCH .../functions/{name} (the fields sent replace the stored ones; the
// variables as a whole). A refusal is shown next to the field it names, and the form keeps what was typed.
"use strict";
import { $, api, el, nsPath, say, seg } from "./api.js";
import { clearFieldErrors, showFieldError } from "./fields.js";

const NUMBERS = ["memory_mb", "timeout_sec", "max_concurrency"];
let target = null;
let onSaved = async () => {};
let rowCount = 0;

function addRow(name = "", value = "") {
  rowCount += 1;
  const n = rowCount;
  const row = el("div", { class: "pair env-row" },
    el("label", {}, "Name ", el("input", { class: "env-name", autocomplete: "off", spellcheck: "false",
      "aria-label": `variable ${n} name` })),
    el("label", {}, "Value ", el("input", { class: "env-value", autocomplete: "off", spellcheck: "false",
      "aria-label": `variable ${n} value` })));
  row.querySelector(".env-name").value = name;
  row.querySelector(".env-value").value = value;
  row.append(el("button", { type: "button", class: "env-remove", "aria-label": `Remove variable ${n}`,
    onclick: () => removeRow(row) }, "Remove"));
  $("settings-env-rows").append(row);
  return row;
}

function removeRow(row) {
  const next = row.nextElementSibling || row.previousElementSibling;
  row.remove();
  (next ? next.querySelector(".env-name") : $("settings-env-add")).focus();
}

function fill(fn) {
  for (const key of NUMBERS) $(`settings-${key}`).value = String(fn[key] ?? "");
  $("settings-env-rows").replaceChildren();
  rowCount = 0;
  for (const [name, value] of Object.entries(fn.env_vars || {})) addRow(name, value);
}

export function setSettingsTarget(fn, saved, fresh = true) {
  target = fn;
  onSaved = saved;
  if (!fresh) return;
  clearFieldErrors("settings");
  say($("settings-status"), "");
  fill(fn);
}

async function save() {
  if (!target) return;
  const status = $("settings-status");
  clearFieldErrors("settings");
  const patch = {};
  for (const key of NUMBERS) {
    const text = $(`settings-${key}`).value.trim();
    if (text !== "") patch[key] = Number(text);
  }
  const env = {};
  for (const row of $("settings-env-rows").querySelectorAll(".env-row")) {
    const name = row.querySelector(".env-name").value.trim();
    const value = row.querySelector(".env-value").value;
    if (name === "" && value === "") continue;  // an empty row is not a variable
    env[name] = value;
  }
  patch.env_vars = env;
  say(status, "saving…");
  try {
    const fn = await api("PATCH", nsPath(`/functions/${seg(target.name)}`), patch);
    target = fn;
    fill(fn);
    say(status, `saved: ${fn.memory_mb} MB, ${fn.timeout_sec}s timeout, max concurrency ${fn.max_concurrency}, ` +
      `${Object.keys(fn.env_vars || {}).length} environment variable(s)`);
    await onSaved(fn);
  } catch (e) {
    showFieldError("settings", e, status);
  }
}

$("settings-form").addEventListener("submit", (ev) => { ev.preventDefault(); save(); });
$("settings-env-add").addEventListener("click", () => addRow().querySelector(".env-name").focus());
