// Dead letters of the selected function's event triggers: one panel per trigger's queue listing the oldest
// (GET .../queues/{queue}/dead-letters: kind, reason, attempts, when), one shown with its headers and body
// (GET .../dead-letters/{id}), and each redriven to its queue or purged for good (POST .../redrive, .../purge
// with {"ids": [id]}). On a platform without a broker the API answers 422, and its message is shown.
"use strict";
import { $, api, el, nsPath, say, seg } from "./api.js";

const LIMIT = 50;
let shownKey = "";

const queuePath = (queue, rest = "") => nsPath(`/queues/${seg(queue)}/dead-letters${rest}`);

/** One panel per event trigger; panels already shown for the same queues are left as they are. */
export function setDeadLetterTarget(fn, triggers, fresh = true) {
  const events = triggers.filter((t) => t.type === "event" && t.queue);
  const key = JSON.stringify([fn.name, events.map((t) => [t.name, t.queue])]);
  if (!fresh && key === shownKey) return;
  shownKey = key;
  const box = $("dead-letters");
  box.replaceChildren();
  for (const t of events) {
    const panel = makePanel(t);
    box.append(panel.node);
    panel.load();
  }
}

function makePanel(trigger) {
  const queue = trigger.queue;
  const ids = `dl-${trigger.name}`;
  const title = el("h3", { id: `${ids}-title`, tabindex: "-1" }, `Dead letters of queue ${queue} (trigger ${trigger.name})`);
  const status = el("p", { class: "dl-status", role: "status" });
  const rows = el("tbody", { class: "dl-rows" });
  const table = el("table", { "aria-labelledby": `${ids}-title` },
    el("thead", {}, el("tr", {}, ...["Failed at", "Kind", "Reason", "Attempts", "Message id", ""].map((h) => el("th", {}, h)))),
    rows);
  const view = el("div", { class: "dl-view", tabindex: "-1", "aria-live": "polite" });
  const refresh = el("button", { type: "button", class: "dl-refresh",
    "aria-label": `Refresh the dead letters of queue ${queue}` }, "Refresh");
  const node = el("section", { class: "dead-letters", "data-queue": queue, "aria-labelledby": `${ids}-title` },
    title, refresh, status, table, view);

  let reads = 0;  // a listing answered after a later one was asked for is not shown

  async function load() {
    const read = ++reads;
    say(status, "loading…");
    try {
      const listing = await api("GET", queuePath(queue, `?limit=${LIMIT}`));
      if (read !== reads) return;
      rows.replaceChildren();
      for (const d of listing.items) rows.append(row(d));
      table.hidden = listing.items.length === 0;
      say(status, listing.items.length === 0 ? "no dead letters"
        : `${listing.items.length} dead letter(s)${listing.more ? ", and more after them" : ""}`);
    } catch (e) {
      if (read !== reads) return;
      rows.replaceChildren();
      table.hidden = true;
      say(status, e.message, true);
    }
  }

  function row(d) {
    const label = d.message_id || d.id;
    return el("tr", { "data-dead-letter": d.id },
      el("td", {}, d.failed_at || ""), el("td", {}, d.kind || ""), el("td", { class: "message" }, d.reason || ""),
      el("td", {}, String(d.attempts ?? "")), el("td", {}, d.message_id || ""),
      el("td", {},
        el("button", { type: "button", class: "dl-show", "aria-label": `Show dead letter ${label}`,
          onclick: () => show(d) }, "Show"), " ",
        el("button", { type: "button", class: "dl-redrive", "aria-label": `Redrive dead letter ${label}`,
          onclick: () => act(d, "redrive") }, "Redrive"), " ",
        el("button", { type: "button", class: "dl-purge", "aria-label": `Purge dead letter ${label}`,
          onclick: () => act(d, "purge") }, "Purge")));
  }

  async function show(d) {
    view.replaceChildren(el("h4", {}, `Dead letter ${d.message_id || d.id}`));
    try {
      const one = await api("GET", queuePath(queue, `/${seg(d.id)}`));
      const seen = el("dl", { class: "record dl-seen" },
        el("dt", {}, "first seen"), el("dd", {}, one.first_seen_at || "-"),
        el("dt", {}, "last seen (dead-lettered)"), el("dd", {}, one.failed_at || "-"),
        el("dt", {}, "attempts"), el("dd", {}, String(one.attempts ?? "-")));
      const headers = el("dl", { class: "record dl-headers" });
      for (const [k, v] of Object.entries(one.headers || {})) {
        headers.append(el("dt", {}, k), el("dd", {}, v !== null && typeof v === "object" ? JSON.stringify(v) : String(v)));
      }
      view.append(seen, el("h5", {}, "Headers"), headers,
        el("h5", {}, `Body (${one.body_encoding || "utf-8"})`), el("pre", { class: "answer dl-body" }, one.body ?? ""));
    } catch (e) {
      const note = el("p", {});
      say(note, e.message, true);
      view.append(note);
    }
    view.focus();
  }

  async function act(d, action) {
    if (action === "purge" && !window.confirm(`Purge dead letter ${d.message_id || d.id} of queue ${queue}? ` +
        "It is dropped for good.")) {
      say(status, "purge cancelled");
      return;
    }
    try {
      const done = await api("POST", queuePath(queue, `/${action}`), { ids: [d.id] });
      view.replaceChildren();
      await load();
      say(status, action === "redrive" ? `redriven: ${done.redriven}` : `purged: ${done.purged}`);
    } catch (e) {
      say(status, e.message, true);
    }
    title.focus();
  }

  refresh.addEventListener("click", load);
  return { node, load };
}
