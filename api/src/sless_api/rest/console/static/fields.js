// Field errors: a 400 that names its `field` is shown next to that field of the form (by element ids
// `<prefix>-<field>` and `<prefix>-<field>-error`), the field marked invalid and focused; what the form cannot
// place goes to its status line. The user's input is never cleared by a refusal.
"use strict";
import { $, say } from "./api.js";

/** Forget the errors shown in a form's fields. */
export function clearFieldErrors(prefix) {
  for (const node of document.querySelectorAll(`[id^="${prefix}-"][id$="-error"]`)) node.textContent = "";
  for (const node of document.querySelectorAll(`[id^="${prefix}-"][aria-invalid]`)) node.removeAttribute("aria-invalid");
}

/** Show ERR next to its field (`scale.min` and `env_vars[X]` belong to their top-level field), else in STATUS. */
export function showFieldError(prefix, err, status) {
  const field = String(err.field || "").split(/[.[]/)[0];
  const slot = field && $(`${prefix}-${field}-error`);
  if (!slot) {
    say(status, err.message, true);
    return;
  }
  say(status, "");
  say(slot, err.message, true);
  const input = $(`${prefix}-${field}`);
  if (input) {
    input.setAttribute("aria-invalid", "true");
    input.focus();
  } else {
    slot.setAttribute("tabindex", "-1");
    slot.focus();
  }
}
