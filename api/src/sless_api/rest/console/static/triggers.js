// Triggers of the selected function: each with its on/off switch (PATCH {"enabled"}) and a delete button that
// asks first (DELETE .../triggers/{name}), and a form that adds one (POST .../triggers): http (auth public or
// token, a path pattern, the methods that reach the function, CORS), cron (schedule) or event (queue, delivery at
// most once or at least once). Optional fields left empty are not sent: the API's defaults apply, and the API judges what is sent.
"use strict";
import { $, api, el, nsPath, say, seg } from "./api.js";
import { clearFieldErrors, showFieldError } from "./fields.js";

const METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];
const CORS_TEXT = ["trigger-cors-origins", "trigger-cors-headers", "trigger-cors-max_age"];
let target = null;
let onChanged = async () => {};

/** One checkbox per HTTP method in fieldset ID (ids `<ID>-<METHOD>`), after its legend. */
function methodBoxes(id) {
  $(id).querySelector("legend").after(...METHODS.map((m) =>
    el("label", {}, el("input", { type: "checkbox", id: `${id}-${m}`, value: m }), ` ${m}`)));
}

/** The methods checked in fieldset ID, in the API's order. */
const checkedMethods = (id) => METHODS.filter((m) => $(`${id}-${m}`).checked);

/** A comma (or space) separated list typed in field ID. */
const listOf = (id) => $(id).value.split(/[\s,]+/).filter(Boolean);

/** The `cors` of the form, or null when none of its fields is filled. Origins are sent whenever another CORS field
 * is filled, even empty: the API then says they are needed. */
function corsOf() {
  const cors = {};
  const methods = checkedMethods("trigger-cors-methods");
  const headers = listOf("trigger-cors-headers");
  const maxAge = $("trigger-cors-max_age");
  if (methods.length) cors.methods = methods;
  if (headers.length) cors.headers = headers;
  if ($("trigger-cors-credentials").checked) cors.credentials = true;
  if (maxAge.validity.badInput) cors.max_age = null;  // not a number: the API's refusal says what it must be
  else if (maxAge.value.trim() !== "") cors.max_age = Number(maxAge.value);
  const origins = listOf("trigger-cors-origins");
  if (!origins.length && !Object.keys(cors).length) return null;
  return { origins, ...cors };
}

function clearHttpFields() {
  for (const id of CORS_TEXT) $(id).value = "";
  $("trigger-cors-credentials").checked = false;
  for (const box of document.querySelectorAll("#trigger-methods input, #trigger-cors-methods input")) {
    box.checked = false;
  }
}

/** What the list says of a trigger after its type. */
function describe(t) {
  return `${t.schedule ? ` (${t.schedule})` : ""}${t.auth === "token" ? " (token)" : ""}` +
    `${t.path ? ` (path ${t.path})` : ""}` +
    `${t.methods ? ` (methods ${t.methods.join(", ")})` : ""}${t.cors ? ` (CORS ${t.cors.origins.join(", ")})` : ""}` +
    `${t.queue ? ` (queue ${t.queue}${t.delivery === "at_least_once" ? ", at least once" : ""})` : ""}`;
}

/** A trigger just added: its switch takes the focus as soon as a render of the list shows it, without waiting for
 * the rest of the page's refresh (calls, source, versions, charts) to end. */
let focusOnRender = null;

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
    list.append(el("li", { "data-trigger-item": t.name }, el("label", {}, box, ` ${t.name}: ${t.type}${describe(t)}`),
      " ",
      el("button", { type: "button", class: "trigger-delete", "aria-label": `Delete trigger ${t.name}`,
        onclick: () => remove(t) }, "Delete")));
  }
  if (!triggers.length) list.append(el("li", {}, "(no triggers)"));
  if (focusOnRender && triggers.some((t) => t.name === focusOnRender)) {
    focusTrigger(focusOnRender);
    focusOnRender = null;
  }
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
  for (const part of document.querySelectorAll("#trigger-form [data-for-type]")) {
    part.hidden = part.dataset.forType !== type;
  }
}

async function create() {
  if (!target) return;
  const status = $("trigger-status");
  clearFieldErrors("trigger");
  const type = $("trigger-type").value;
  const body = { name: $("trigger-name").value.trim() || target.name, type, function: target.name };
  if (type === "http") {
    body.auth = $("trigger-auth").value;
    const path = $("trigger-path").value.trim();
    if (path) body.path = path;
    const methods = checkedMethods("trigger-methods");
    if (methods.length) body.methods = methods;
    const cors = corsOf();
    if (cors) body.cors = cors;
  }
  if (type === "cron") body.schedule = $("trigger-schedule").value.trim();
  if (type === "event") {
    body.queue = $("trigger-queue").value.trim();
    body.delivery = $("trigger-delivery").value;
  }
  try {
    const t = await api("POST", nsPath("/triggers"), body);
    for (const id of ["trigger-name", "trigger-schedule", "trigger-queue", "trigger-path"]) $(id).value = "";
    clearHttpFields();
    say(status, `trigger ${t.name} added`);
    focusOnRender = t.name;
    await onChanged();
    if (focusOnRender === t.name) {  // the list was not shown again (its refresh failed): focus what there is
      focusOnRender = null;
      focusTrigger(t.name);
    }
  } catch (e) {
    showFieldError("trigger", e, status);
  }
}

methodBoxes("trigger-methods");
methodBoxes("trigger-cors-methods");
$("trigger-type").addEventListener("change", showTypeFields);
$("trigger-form").addEventListener("submit", (ev) => { ev.preventDefault(); create(); });
showTypeFields();
