// Jobs: the tenant's one-shot runs with their phase, run_id and result; "run again" sends the next run_id,
// "delete" removes one after asking, and a new job can be started for the selected function with an event.
"use strict";
import { $, api, el, listAll, nsPath, say, seg } from "./api.js";

const ACTIVE = new Set(["Pending", "Running"]);
const POLL_MS = 1000;
let timer = null;
let jobFunction = null;

export async function loadJobs() {
  clearTimeout(timer);
  const jobs = await listAll(nsPath("/jobs"));
  const rows = $("job-rows");
  rows.replaceChildren();
  for (const job of jobs) {
    rows.append(el("tr", { "data-job": job.name },
      el("td", {}, job.name), el("td", {}, job.function),
      el("td", { class: `phase-${job.phase}`, "data-field": "phase" }, job.phase),
      el("td", { "data-field": "run_id" }, String(job.run_id)),
      el("td", { class: "message", "data-field": "message" }, job.message),
      el("td", {}, el("button", { type: "button", class: "run-again", "aria-label": `Run ${job.name} again`,
        onclick: () => runAgain(job) }, "Run again"), " ",
      el("button", { type: "button", class: "job-delete", "aria-label": `Delete job ${job.name}`,
        onclick: () => remove(job) }, "Delete"))));
  }
  $("jobs-empty").hidden = jobs.length > 0;
  if (jobs.some((j) => ACTIVE.has(j.phase))) timer = setTimeout(() => loadJobs().catch(showError), POLL_MS);
}

function showError(e) { say($("jobs-status"), e.message, true); }

async function runAgain(job) {
  try {
    await api("PATCH", nsPath(`/jobs/${seg(job.name)}`), { run_id: job.run_id + 1 });
    say($("jobs-status"), `${job.name}: run ${job.run_id + 1} started`);
    await loadJobs();
  } catch (e) { showError(e); }
}

async function remove(job) {
  if (!window.confirm(`Delete job ${job.name}? Its result goes with it.`)) {
    say($("jobs-status"), "delete cancelled");
    return;
  }
  try {
    await api("DELETE", nsPath(`/jobs/${seg(job.name)}`));
    say($("jobs-status"), `job ${job.name} deleted`);
    await loadJobs();
  } catch (e) { showError(e); }
  $("jobs-title").focus();
}

export function setJobFunction(fn) {
  jobFunction = fn;
  say($("job-create-status"), "");
}

async function createJob() {
  const status = $("job-create-status");
  let event;
  try {
    event = JSON.parse($("job-event").value.trim() || "{}");
  } catch (e) {
    say(status, `the event is not JSON: ${e.message}`, true);
    return;
  }
  try {
    const job = await api("POST", nsPath("/jobs"), { name: $("job-name").value.trim(), function: jobFunction.name, event });
    say(status, `job ${job.name} created (run ${job.run_id})`);
    await loadJobs();
  } catch (e) { say(status, e.message, true); }
}

$("job-form").addEventListener("submit", (ev) => { ev.preventDefault(); createJob(); });
$("jobs-refresh").addEventListener("click", () => loadJobs().catch(showError));
