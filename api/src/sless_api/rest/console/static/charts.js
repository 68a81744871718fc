// Charts of the selected function, drawn here as SVG from its recent invocation records (GET .../invocations,
// newest first, up to the API's 500): calls per interval split by outcome (5xx apart from the rest), p50 and p99
// of duration_ms per interval as two lines, and a summary (calls, error ratio, cold starts, p50/p99). Each chart
// says its numbers in its aria-label, and a visually hidden table holds them per interval.
"use strict";
import { $, api, el, nsPath, say, seg } from "./api.js";

const LIMIT = 500;  // the most one listing of invocations answers
const BUCKETS = 20;  // about this many intervals over the records' span
const STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
const SVG_NS = "http:" + "//www.w3.org/2000/svg";  // split: no console file holds a URL
const WIDTH = 600;
const HEIGHT = 160;
const PAD = { left: 64, right: 8, top: 10, bottom: 22 };

let target = null;
let reads = 0;  // an answer to an earlier read, arriving after a later one was asked for, is not shown

/** An SVG element with attributes and children (strings become text nodes). */
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

/** The nearest-rank percentile P (0..100) of VALUES sorted ascending; null for none. */
export function percentile(sorted, p) {
  if (!sorted.length) return null;
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)];
}

export const isError = (record) => Number(record.status) >= 500;

const count = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

const ms = (v) => (v == null ? "-" : `${v.toFixed(1)} ms`);

function span(seconds) {
  if (seconds < 60) return `${seconds} s`;
  if (seconds < 3600) return `${seconds / 60} min`;
  if (seconds < 86400) return `${seconds / 3600} h`;
  return `${seconds / 86400} d`;
}

const clock = (ts) => new Date(ts * 1000).toISOString().slice(11, 19);

/** Calls, errors, cold starts and p50/p99 of some records. */
function stats(records) {
  const durations = records.map((r) => Number(r.duration_ms)).filter(Number.isFinite).sort((a, b) => a - b);
  return { calls: records.length, errors: records.filter(isError).length,
    cold: records.filter((r) => r.cold === true).length,
    p50: percentile(durations, 50), p99: percentile(durations, 99) };
}

/** The records in intervals of a step chosen from their span (the smallest of STEPS giving at most BUCKETS). */
export function bucketize(records) {
  const times = records.map((r) => Number(r.started_at));
  const first = Math.min(...times);
  const last = Math.max(...times);
  const step = STEPS.find((s) => (last - first) / s <= BUCKETS) ?? Math.ceil((last - first) / BUCKETS);
  const start = Math.floor(first / step) * step;
  const count = Math.floor((last - start) / step) + 1;
  const groups = Array.from({ length: count }, () => []);
  for (const r of records) groups[Math.min(count - 1, Math.floor((Number(r.started_at) - start) / step))].push(r);
  return { step, start, buckets: groups.map((g, i) => ({ start: start + i * step, ...stats(g) })) };
}

function frame(label, max, unit) {
  const bottom = HEIGHT - PAD.bottom;
  return [
    svg("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: bottom }),
    svg("line", { class: "axis", x1: PAD.left, y1: bottom, x2: WIDTH - PAD.right, y2: bottom }),
    svg("text", { class: "tick", x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, `${max}${unit}`),
    svg("text", { class: "tick", x: PAD.left - 4, y: bottom, "text-anchor": "end" }, `0${unit}`),
    svg("title", {}, label),
  ];
}

function timeTicks(chart) {
  const y = HEIGHT - 6;
  const end = chart.start + chart.buckets.length * chart.step;
  return [svg("text", { class: "tick", x: PAD.left, y }, clock(chart.start)),
    svg("text", { class: "tick", x: WIDTH - PAD.right, y, "text-anchor": "end" }, clock(end))];
}

function chartSvg(cls, label, ...children) {
  return svg("svg", { class: `chart ${cls}`, role: "img", "aria-label": label, viewBox: `0 0 ${WIDTH} ${HEIGHT}` },
    ...children);
}

function callsChart(chart, total) {
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const slot = plotW / chart.buckets.length;
  const max = Math.max(1, ...chart.buckets.map((b) => b.calls));
  const busiest = Math.max(...chart.buckets.map((b) => b.calls));
  const label = `Calls per ${span(chart.step)} from ${clock(chart.start)} UTC: ${count(total.calls, "call")}, ` +
    `${count(total.errors, "error")} (5xx); at most ${count(busiest, "call")} in one interval`;
  const bars = chart.buckets.map((b, i) => {
    const x = PAD.left + i * slot + slot * 0.1;
    const w = slot * 0.8;
    const okH = (plotH * (b.calls - b.errors)) / max;
    const errH = (plotH * b.errors) / max;
    const base = HEIGHT - PAD.bottom;
    return svg("g", { class: "bucket", "data-start": b.start, "data-calls": b.calls, "data-errors": b.errors },
      svg("rect", { class: "bar bar-ok", x, y: base - okH, width: w, height: okH, "data-count": b.calls - b.errors }),
      svg("rect", { class: "bar bar-error", x, y: base - okH - errH, width: w, height: errH, "data-count": b.errors }),
      svg("title", {}, `${clock(b.start)}: ${b.calls} calls, ${b.errors} errors`));
  });
  return chartSvg("chart-calls", label, ...frame(label, max, ""), ...timeTicks(chart), ...bars);
}

function latencyChart(chart, total) {
  const plotW = WIDTH - PAD.left - PAD.right;
  const plotH = HEIGHT - PAD.top - PAD.bottom;
  const slot = plotW / chart.buckets.length;
  const filled = chart.buckets.map((b, i) => ({ ...b, i })).filter((b) => b.p50 != null);
  const top = filled.length ? Math.max(...filled.map((b) => b.p99)) : null;
  const max = top > 0 ? top : 1;
  const x = (i) => PAD.left + (i + 0.5) * slot;
  const y = (v) => HEIGHT - PAD.bottom - (plotH * v) / max;
  const label = `Latency per ${span(chart.step)}: p50 ${ms(total.p50)}, p99 ${ms(total.p99)} over all calls; ` +
    `highest p99 of an interval ${ms(top)}`;
  const line = (key) => [
    svg("polyline", { class: `line line-${key}`, fill: "none",
      points: filled.map((b) => `${x(b.i).toFixed(1)},${y(b[key]).toFixed(1)}`).join(" ") }),
    ...filled.map((b) => svg("circle", { class: `point point-${key}`, cx: x(b.i), cy: y(b[key]), r: 2.5,
      "data-start": b.start, [`data-${key}`]: b[key] }, svg("title", {}, `${clock(b.start)}: ${key} ${ms(b[key])}`))),
  ];
  return chartSvg("chart-latency", label, ...frame(label, max.toFixed(1), " ms"), ...timeTicks(chart),
    ...line("p50"), ...line("p99"));
}

function hiddenTable(chart) {
  return el("table", { class: "visually-hidden", id: "charts-table" },
    el("caption", {}, `Calls and latency per ${span(chart.step)} (UTC)`),
    el("thead", {}, el("tr", {}, ...["Interval from", "Calls", "Errors (5xx)", "p50", "p99"].map((h) => el("th", {}, h)))),
    el("tbody", {}, ...chart.buckets.map((b) => el("tr", {}, el("td", {}, clock(b.start)), el("td", {}, String(b.calls)),
      el("td", {}, String(b.errors)), el("td", {}, ms(b.p50)), el("td", {}, ms(b.p99))))));
}

function legend(...items) {
  return el("p", { class: "legend", "aria-hidden": "true" },
    ...items.flatMap(([cls, text]) => [el("span", { class: `swatch ${cls}` }), ` ${text} `]));
}

/** Draw RECORDS (MORE: the listing had older ones) in the panel. */
function render(records, more) {
  const summary = $("charts-summary");
  const box = $("charts-box");
  for (const k of ["calls", "errors", "cold", "p50", "p99"]) summary.removeAttribute(`data-${k}`);
  if (!records.length) {
    summary.textContent = "no calls yet";
    box.replaceChildren();
    return;
  }
  const total = stats(records);
  for (const [k, v] of Object.entries(total)) summary.setAttribute(`data-${k}`, String(v));
  const ratio = ((100 * total.errors) / total.calls).toFixed(1);
  summary.textContent = `${more ? "last " : ""}${count(total.calls, "call")}, ${count(total.errors, "error")} ` +
    `(${ratio}%), ${count(total.cold, "cold start")}, p50 ${ms(total.p50)}, p99 ${ms(total.p99)}`;
  const chart = bucketize(records);
  box.replaceChildren(
    el("h4", {}, `Calls per ${span(chart.step)}`), callsChart(chart, total),
    legend(["bar-ok", "2xx, 3xx, 4xx"], ["bar-error", "5xx"]),
    el("h4", {}, `Latency per ${span(chart.step)}`), latencyChart(chart, total),
    legend(["line-p50", "p50"], ["line-p99", "p99"]), hiddenTable(chart));
}

async function load() {
  if (!target) return;
  const read = ++reads;
  const status = $("charts-status");
  say(status, "loading…");
  try {
    const page = await api("GET", nsPath(`/functions/${seg(target.name)}/invocations?limit=${LIMIT}`));
    if (read !== reads) return;
    render(page.items, Boolean(page.next_cursor));
    say(status, "");
  } catch (e) {
    if (read !== reads) return;
    $("charts-summary").textContent = "";
    $("charts-box").replaceChildren();
    say(status, e.message, true);
  }
}

/** Show FN's charts (read again on every call: a refresh of the page's lists refreshes them too). */
export function setChartsTarget(fn, fresh = true) {
  if (fresh || !target || target.name !== fn.name) {
    $("charts-summary").textContent = "";
    $("charts-box").replaceChildren();
  }
  target = fn;
  return load();
}

$("charts-refresh").addEventListener("click", load);
