// Triggers of the selected function: each with its on/off switch (PATCH {"enabled"}) and a delete button that
// asks first (DELETE .../triggers/{name}), and a form that adds one (POST .../triggers): http (auth public or
// token), cron (schedule) or event (queue, delivery at most once or at least once).
"use strict";
import { $, api, el, nsPath, say, seg } from "./api.js";
import { clearFieldErrors, showFieldError } from "./fields.js";

let target = null;
let onChanged = async () => {};

/** Focus the switch of trigger NAME once the list shows it (after a re-render), else the list's title. */
function focusTrigger(name) {
  const box = document.querySelector(`input[data-trigger="${CSS.escape(name)}"]`);
  if (box) box.focus();
  else { $("triggers-title").setAttribute("tabindex", "-1"); $("triggers-title").focus(); }
}

export function renderTriggers(fn, triggers, changed) {
  target = fn;
  onChanged = changed;
  const list = $("trigger-list");
  list.replaceChildren();
  for (const t of triggers) {
    const box = el("input", { type: "checkbox", "data-trigger": t.name });
    box.checked = t.enabled;
    box.addEventListener("change", async () => {
      try {
        await api("PATCH", nsPath(`/triggers/${seg(t.name)}`), { enabled: box.checked });
        say($("detail-status"), `${t.name} ${box.checked ? "enabled" : "disabled"}`);
        await onChanged();
      } catch (e) {
        box.checked = !box.checked;
        say($("detail-status"), e.message, true);
      }
    });
    const what = `${t.type}${t.schedule ? ` (${t.schedule})` : ""}${t.auth === "token" ? " (token)" : ""}` +
      `${t.queue ? ` (queue ${t.queue}${t.delivery === "at_least_once" ? ", at least once" : ""})` : ""}`;
    list.append(el("li", { "data-trigger-item": t.name }, el("label", {}, box, ` ${t.name}: ${what}`), " ",
      el("button", { type: "button", class: "trigger-delete", "aria-label": `Delete trigger ${t.name}`,
        onclick: () => remove(t) }, "Delete")));
  }
  if (!triggers.length) list.append(el("li", {}, "(no triggers)"));
}

/** A fresh form for a newly opened function. */
export function resetTriggerForm(fn) {
  clearFieldErrors("trigger");
  say($("trigger-status"), "");
  $("trigger-name").value = "";
  $("trigger-name").placeholder = fn.name;
}

async function remove(t) {
  const status = $("trigger-status");
  if (!window.confirm(`Delete trigger ${t.name} (${t.type})?`)) {
    say(status, "delete cancelled");
    return;
  }
  try {
    await api("DELETE", nsPath(`/triggers/${seg(t.name)}`));
    say(status, `trigger ${t.name} deleted`);
    await onChanged();
    $("trigger-name").focus();
  } catch (e) {
    say(status, e.message, true);
  }
}

function showTypeFields() {
  const type = $("trigger-type").value;
  for (const label of document.querySelectorAll("#trigger-form [data-for-type]")) {
    label.hidden = label.dataset.forType !== type;
  }
}

async function create() {
  if (!target) return;
  const status = $("trigger-status");
  clearFieldErrors("trigger");
  const type = $("trigger-type").value;
  const body = { name: $("trigger-name").value.trim() || target.name, type, function: target.name };
  if (type === "http") body.auth = $("trigger-auth").value;
  if (type === "cron") body.schedule = $("trigger-schedule").value.trim();
  if (type === "event") {
    body.queue = $("trigger-queue").value.trim();
    body.delivery = $("trigger-delivery").value;
  }
  try {
    const t = await api("POST", nsPath("/triggers"), body);
    for (const id of ["trigger-name", "trigger-schedule", "trigger-queue"]) $(id).value = "";
    say(status, `trigger ${t.name} added`);
    await onChanged();
    focusTrigger(t.name);
  } catch (e) {
    showFieldError("trigger", e, status);
  }
}

$("trigger-type").addEventListener("change", showTypeFields);
$("trigger-form").addEventListener("submit", (ev) => { ev.preventDefault(); create(); });
showTypeFields();
