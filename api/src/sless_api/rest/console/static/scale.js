// Scaling of the selected function: its `scale` in words (or "fixed replicas"), and a form that sets it
// (PATCH {"scale": {...}}: the fields filled in; the API keeps the others as they are, or gives a function
// without scale their defaults) or removes it
// (PATCH {"scale": null}). The API checks the values (400 naming the field; 422 on a cluster without KEDA).
"use strict";
import { $, api, nsPath, say, seg } from "./api.js";

const FIELDS = ["min", "max", "target", "idle_sec"];
let target = null;
let onSaved = () => {};

/** A function's `scale` in words, as the page and `sless get` say it. */
export function scaleText(scale) {
  if (!scale) return "fixed replicas (no scale)";
  return `${scale.min}..${scale.max} replicas, target ${scale.target} calls in flight per replica, ` +
    `back to ${scale.min} after ${scale.idle_sec}s without calls`;
}

/** One word for the functions table. */
export const scaleShort = (scale) => (scale ? `${scale.min}..${scale.max}` : "fixed");

export function setScaleTarget(fn, saved, fresh = true) {
  target = fn;
  onSaved = saved;
  $("scale-current").textContent = scaleText(fn.scale);
  if (!fresh) return;
  say($("scale-status"), "");
  for (const key of FIELDS) $(`scale-${key}`).value = fn.scale ? String(fn.scale[key]) : "";
}

async function save(scale) {
  if (!target) return;
  const status = $("scale-status");
  try {
    const fn = await api("PATCH", nsPath(`/functions/${seg(target.name)}`), { scale });
    setScaleTarget(fn, onSaved);
    say(status, scale === null ? "scaling removed: fixed replicas" : `saved: ${scaleText(fn.scale)}`);
    await onSaved();
  } catch (e) {
    say(status, e.message, true);
  }
}

$("scale-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const scale = {};
  for (const key of FIELDS) {
    const text = $(`scale-${key}`).value.trim();
    if (text !== "") scale[key] = Number(text);
  }
  save(scale);
});
$("scale-off").addEventListener("click", () => save(null));
