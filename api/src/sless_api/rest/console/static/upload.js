// Upload new code for the selected function: a .zip dropped on the drop zone or chosen with the file picker
// is sent as a raw application/zip body (XMLHttpRequest, for its upload progress), then the function is
// followed until its new code is Ready or Failed (a failed build shows the end of its log).
"use strict";
import { $, api, errorOf, nsPath, say, seg, session, sleep } from "./api.js";

const BUILD_WAIT_MS = 15 * 60 * 1000;
let target = null;
let onSettled = () => {};

export function setUploadTarget(fn, settled) {
  target = fn;
  onSettled = settled;
  say($("upload-status"), "");
  $("upload-status").dataset.phase = "";
  $("upload-progress").hidden = true;
  $("upload-log").textContent = "";
  $("upload-log").hidden = true;
}

function send(file) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", nsPath(`/functions/${seg(target.name)}/upload`));
    xhr.setRequestHeader("Authorization", `Bearer ${session.token}`);
    xhr.setRequestHeader("Content-Type", "application/zip");
    xhr.upload.addEventListener("progress", (ev) => {
      if (ev.lengthComputable) $("upload-progress").value = ev.loaded / ev.total;
    });
    xhr.addEventListener("load", () => resolve(new Response(xhr.responseText || null,
      { status: xhr.status, headers: { "Content-Type": xhr.getResponseHeader("Content-Type") || "" } })));
    xhr.addEventListener("error", () => reject(new Error("the upload did not reach the server")));
    xhr.send(file);
  });
}

async function upload(file) {
  if (!target) return;
  const status = $("upload-status");
  status.dataset.phase = "";
  if (!file) { say(status, "no file", true); return; }
  if (!file.name.toLowerCase().endsWith(".zip")) { say(status, `${file.name} is not a .zip file`, true); return; }
  const name = target.name;
  $("upload-log").hidden = true;
  $("upload-progress").hidden = false;
  $("upload-progress").value = 0;
  say(status, `uploading ${file.name} (${file.size} bytes)…`);
  try {
    const resp = await send(file);
    if (resp.status !== 202) throw await errorOf(resp);
    const queued = await resp.json();
    $("upload-progress").value = 1;
    await follow(name, queued.code_hash);
  } catch (e) {
    say(status, e.message, true);
  }
}

/** Poll the function until the uploaded code (by its hash) is Ready or Failed. */
async function follow(name, codeHash) {
  const status = $("upload-status");
  const deadline = Date.now() + BUILD_WAIT_MS;
  while (Date.now() < deadline) {
    const fn = await api("GET", nsPath(`/functions/${seg(name)}`));
    const settled = fn.code_hash === codeHash && (fn.phase === "Ready" || fn.phase === "Failed");
    say(status, `${fn.phase}${fn.message ? `: ${fn.message.split("\n")[0]}` : ""}`, fn.phase === "Failed" && settled);
    status.dataset.phase = settled ? fn.phase : "";
    if (settled) {
      if (fn.phase === "Failed") {
        $("upload-log").textContent = fn.message;
        $("upload-log").hidden = false;
      }
      onSettled(fn);
      return;
    }
    await sleep(500);
  }
  say(status, "the build is still running; refresh later", true);
}

const zone = $("drop-zone");
for (const type of ["dragenter", "dragover"]) {
  zone.addEventListener(type, (ev) => { ev.preventDefault(); zone.classList.add("dragging"); });
}
zone.addEventListener("dragleave", () => zone.classList.remove("dragging"));
zone.addEventListener("drop", (ev) => {
  ev.preventDefault();
  zone.classList.remove("dragging");
  upload(ev.dataTransfer && ev.dataTransfer.files[0]);
});
$("upload-file").addEventListener("change", (ev) => {
  const file = ev.target.files[0];
  ev.target.value = "";
  upload(file);
});
