// One call's output: its log lines from `.../invocations/{record id}/logs` and its invocation record, drawn
// as text. Where the API keeps no per-call logs (404; 501 where a cluster does not let it read pod logs), the
// record alone says what is known.
"use strict";
import { authHeader, el, errorOf, nsPath, say, seg } from "./api.js";

function when(ts) {
  if (typeof ts === "number") return new Date(ts * 1000).toISOString();
  return ts ? String(ts) : "";
}

function renderLines(logs, id) {
  const list = el("ol", { class: "log-lines", id });
  for (const line of logs.lines || []) {
    list.append(el("li", { class: `stream-${line.stream === "stderr" ? "stderr" : "stdout"}` },
      el("span", { class: "ts" }, when(line.ts)), " ", el("span", { class: "stream" }, line.stream), " ",
      el("span", { class: "text" }, line.text)));
  }
  if (!(logs.lines || []).length) list.append(el("li", {}, "(the call wrote no log lines)"));
  if (logs.truncated) list.append(el("li", { class: "note" }, "(more lines were written than are kept)"));
  return list;
}

function renderRecord(record, id) {
  const dl = el("dl", { class: "record", id });
  for (const [k, v] of Object.entries(record)) {
    dl.append(el("dt", {}, k), el("dd", {}, v !== null && typeof v === "object" ? JSON.stringify(v) : String(v)));
  }
  return dl;
}

/** The nodes to show for one recorded call; element ids start with `prefix` (`<prefix>-log-lines`,
 * `<prefix>-record`). */
export async function callLogNodes(name, record, prefix) {
  const resp = await fetch(nsPath(`/functions/${seg(name)}/invocations/${seg(String(record.id))}/logs`),
    { headers: authHeader(), cache: "no-store" });
  const nodes = [];
  if (resp.ok) {
    nodes.push(el("h4", {}, "Log lines"), renderLines(await resp.json(), `${prefix}-log-lines`));
  } else if (resp.status === 404 || resp.status === 501) {
    nodes.push(el("p", { class: "note" }, "Per-call log lines are not available here; the invocation record follows."));
  } else {
    const note = el("p", {});
    say(note, `the call's logs: ${(await errorOf(resp)).message}`, true);
    nodes.push(note);
  }
  nodes.push(el("h4", {}, "Invocation record"), renderRecord(record, `${prefix}-record`));
  return nodes;
}
