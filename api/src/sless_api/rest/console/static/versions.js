// Versions of the selected function: the deployed ones (the current one marked), a rollback to an earlier one
// (after a confirmation, then followed until it is the current version), and the traffic split with a form that
// sets one or two versions' weights or clears it. The API judges every change; its error text is shown as is.
"use strict";
import { $, api, el, nsPath, say, seg, sleep } from "./api.js";

const ROLLBACK_WAIT_MS = 15 * 60 * 1000;
const HASH_SHOWN = 12;
// What a version is besides its code and configuration: left out when asking "is this the same deploy?".
const NOT_CONFIG = new Set(["version", "deployed_at", "current"]);
let target = null;
let onSettled = () => {};
let busy = false;

const fnPath = (name, rest) => nsPath(`/functions/${seg(name)}${rest}`);

export function setVersionsTarget(fn, settled) {
  target = fn;
  onSettled = settled;
  for (const id of ["versions-status", "traffic-status"]) say($(id), "");
  $("versions-status").dataset.phase = "";
}

/** Read the versions and the split of the selected function and show them. */
export async function loadVersions() {
  const fn = target;
  if (!fn) return;
  const [listing, traffic] = await Promise.all([api("GET", fnPath(fn.name, "/versions")),
    api("GET", fnPath(fn.name, "/traffic"))]);
  if (fn !== target) return;  // another function was opened meanwhile
  render(fn, listing.items, traffic.split);
}

function describe(split, current) {
  if (!split) return `No split: every call goes to the current version${current ? ` (v${current})` : ""}.`;
  return split.map((e) => `v${e.version} ${e.weight}%${e.version === current ? " (current)" : ""}`).join(", ");
}

function render(fn, items, split) {
  const weights = new Map((split || []).map((e) => [e.version, e.weight]));
  const current = items.find((v) => v.current);
  const rows = $("version-rows");
  rows.replaceChildren();
  for (const v of items) {
    const action = v.current ? el("strong", {}, "current")
      : el("button", { type: "button", class: "rollback", "aria-label": `Roll back to version ${v.version}`,
        onclick: () => rollback(fn, v) }, "Roll back");
    rows.append(el("tr", { "data-version": String(v.version), class: v.current ? "current-version" : "" },
      el("td", {}, `v${v.version}`), el("td", { title: v.code_hash || "" }, (v.code_hash || "-").slice(0, HASH_SHOWN)),
      el("td", {}, v.deployed_at || ""), el("td", {}, v.runtime || ""),
      el("td", { "data-field": "traffic" }, weights.has(v.version) ? `${weights.get(v.version)}%` : "-"),
      el("td", {}, action)));
  }
  $("versions-empty").hidden = items.length > 0;
  $("traffic-form").hidden = items.length === 0;
  $("traffic-current").textContent = describe(split, current && current.version);
  fillForm(items, split, current);
}

/** The form starts from the split in place, else from the current version and the one before it. */
function fillForm(items, split, current) {
  const entries = split || [current && { version: current.version, weight: 100 },
    items[1] && { version: items[1].version, weight: 0 }].filter(Boolean);
  for (const [i, key] of ["a", "b"].entries()) {
    const select = $(`traffic-version-${key}`);
    select.replaceChildren(...(key === "b" ? [el("option", { value: "" }, "(none)")] : []),
      ...items.map((v) => el("option", { value: String(v.version) }, `v${v.version}${v.current ? " (current)" : ""}`)));
    select.value = entries[i] ? String(entries[i].version) : "";
    $(`traffic-weight-${key}`).value = entries[i] ? String(entries[i].weight) : "";
  }
}

function sameDeploy(a, b) {
  const config = (v) => JSON.stringify(Object.keys(v).filter((k) => !NOT_CONFIG.has(k)).sort().map((k) => [k, v[k]]));
  return config(a) === config(b);
}

function setBusy(value) {
  busy = value;
  for (const button of document.querySelectorAll("#version-rows button.rollback")) button.disabled = value;
}

async function rollback(fn, version) {
  if (busy) return;
  const status = $("versions-status");
  if (!window.confirm(`Roll ${fn.name} back to version ${version.version}? Its code and configuration are ` +
      "deployed again as a new version, and a traffic split is dropped.")) {
    say(status, "rollback cancelled");
    return;
  }
  status.dataset.phase = "";
  setBusy(true);
  try {
    const started = await api("POST", fnPath(fn.name, "/rollback"), { version: version.version });
    say(status, started.message);
    await follow(fn.name, version);
  } catch (e) {
    say(status, e.message, true);
  } finally {
    setBusy(false);
  }
}

/** Poll until VERSION's code and configuration are the current version (Ready), or the deploy failed. */
async function follow(name, version) {
  const status = $("versions-status");
  const deadline = Date.now() + ROLLBACK_WAIT_MS;
  while (Date.now() < deadline) {
    const [fn, listing] = await Promise.all([api("GET", fnPath(name, "")), api("GET", fnPath(name, "/versions"))]);
    const newest = listing.items[0];
    if (fn.phase === "Failed" && fn.code_hash === version.code_hash) {
      say(status, `the rollback failed: ${fn.message}`, true);
      status.dataset.phase = "Failed";
      onSettled();
      return;
    }
    if (fn.phase === "Ready" && newest && sameDeploy(newest, version)) {
      say(status, `version ${newest.version} is current (the code and configuration of version ${version.version})`);
      status.dataset.phase = "Ready";
      onSettled();
      return;
    }
    say(status, `${fn.phase}${fn.message ? `: ${fn.message.split("\n")[0]}` : ""}`);
    await sleep(500);
  }
  say(status, "the rollback is still running; refresh later", true);
}

async function setSplit() {
  const status = $("traffic-status");
  const split = [];
  for (const key of ["a", "b"]) {
    const version = $(`traffic-version-${key}`).value;
    if (!version) continue;
    const weight = $(`traffic-weight-${key}`).value.trim();
    if (!/^[0-9]+$/.test(weight)) {
      say(status, `the weight of v${version} must be a whole number from 0 to 100`, true);
      return;
    }
    split.push({ version: Number(version), weight: Number(weight) });
  }
  try {
    const answer = await api("PUT", fnPath(target.name, "/traffic"), { split });
    say(status, `split set: ${describe(answer.split)}`);
    await loadVersions();
  } catch (e) { say(status, e.message, true); }
}

async function clearSplit() {
  const status = $("traffic-status");
  try {
    await api("DELETE", fnPath(target.name, "/traffic"));
    say(status, "split cleared: every call goes to the current version");
    await loadVersions();
  } catch (e) { say(status, e.message, true); }
}

// The second weight follows the first (they sum to 100) while a second version is chosen.
$("traffic-weight-a").addEventListener("input", () => {
  const first = $("traffic-weight-a").value.trim();
  if ($("traffic-version-b").value && /^[0-9]+$/.test(first) && Number(first) <= 100) {
    $("traffic-weight-b").value = String(100 - Number(first));
  }
});
$("traffic-form").addEventListener("submit", (ev) => { ev.preventDefault(); setSplit(); });
$("traffic-clear").addEventListener("click", clearSplit);
