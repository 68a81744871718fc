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

/** The slot of FIELD in the form: its own when the form has one (`cors.max_age`: `<prefix>-cors-max_age`), else
 * its top-level field's (`scale.min` and `env_vars[X]` belong to `scale` and `env_vars`). */
function slotOf(prefix, field) {
  const own = field.replaceAll(".", "-");
  return own && $(`${prefix}-${own}-error`) ? own : field.split(/[.[]/)[0];
}

/** Show ERR next to its field, else in STATUS. A field that is a group of checkboxes (a fieldset) has them all
 * marked invalid and its first one focused. */
export function showFieldError(prefix, err, status) {
  const field = slotOf(prefix, String(err.field || ""));
  const slot = field && $(`${prefix}-${field}-error`);
  if (!slot) {
    say(status, err.message, true);
    return;
  }
  say(status, "");
  say(slot, err.message, true);
  const input = $(`${prefix}-${field}`);
  const inputs = input && input.tagName === "FIELDSET" ? [...input.querySelectorAll("input")] : [input];
  if (inputs[0]) {
    for (const one of inputs) one.setAttribute("aria-invalid", "true");
    inputs[0].focus();
  } else {
    slot.setAttribute("tabindex", "-1");
    slot.focus();
  }
}
