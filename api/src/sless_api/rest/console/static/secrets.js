// Secrets: the tenant's secret names with their keys and versions (values are write-only and never come back),
// a form that sets one: every key it should hold (saving replaces the secret; its functions restart), and a
// delete button per secret that asks first (the API refuses while a function still uses it).
"use strict";
import { $, api, el, listAll, nsPath, say, seg } from "./api.js";

export async function loadSecrets() {
  const secrets = await listAll(nsPath("/secrets"));
  const rows = $("secret-rows");
  rows.replaceChildren();
  for (const s of secrets) {
    rows.append(el("tr", { "data-secret": s.name }, el("td", {}, s.name), el("td", {}, s.keys.join(", ")),
      el("td", {}, String(s.version)), el("td", {}, s.updated_at || ""),
      el("td", {}, el("button", { type: "button", class: "secret-delete", "aria-label": `Delete secret ${s.name}`,
        onclick: () => remove(s) }, "Delete"))));
  }
  $("secrets-empty").hidden = secrets.length > 0;
  return secrets;
}

async function remove(secret) {
  const status = $("secret-status");
  if (!window.confirm(`Delete secret ${secret.name}? Its values are gone for good.`)) {
    say(status, "delete cancelled");
    return;
  }
  try {
    await api("DELETE", nsPath(`/secrets/${seg(secret.name)}`));
    say(status, `secret ${secret.name} deleted`);
    await loadSecrets();
  } catch (e) { say(status, e.message, true); }
  $("secrets-title").focus();
}

function addPair() {
  const index = $("secret-pairs").children.length + 1;
  $("secret-pairs").append(el("div", { class: "pair" },
    el("label", {}, "Key ", el("input", { class: "secret-key", required: "", maxlength: "63", autocomplete: "off",
      "aria-label": `key ${index}` })),
    el("label", {}, "Value ", el("input", { class: "secret-value", type: "password", autocomplete: "off",
      "aria-label": `value ${index}` }))));
}

function resetPairs() {
  $("secret-pairs").replaceChildren();
  addPair();
}

async function saveSecret() {
  const status = $("secret-status");
  const name = $("secret-name").value.trim();
  const data = {};
  for (const pair of $("secret-pairs").querySelectorAll(".pair")) {
    data[pair.querySelector(".secret-key").value.trim()] = pair.querySelector(".secret-value").value;
  }
  try {
    const exists = (await loadSecrets()).some((s) => s.name === name);
    const saved = exists ? await api("PUT", nsPath(`/secrets/${seg(name)}`), { data })
      : await api("POST", nsPath("/secrets"), { name, data });
    resetPairs();
    say(status, `${saved.name}: version ${saved.version}`);
    await loadSecrets();
  } catch (e) { say(status, e.message, true); }
}

$("secret-form").addEventListener("submit", (ev) => { ev.preventDefault(); saveSecret(); });
$("secret-add-key").addEventListener("click", addPair);
$("secrets-refresh").addEventListener("click", () => loadSecrets().catch((e) => say($("secret-status"), e.message, true)));
resetPairs();
