// The console's link to the REST API: the tenant's token (this tab's sessionStorage only), JSON calls whose
// failures carry the API's own `error` text, and DOM building that only ever creates text nodes.
"use strict";

export const session = { token: sessionStorage.getItem("sless-token") || "", namespace: "" };

export const $ = (id) => document.getElementById(id);

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** An element with attributes and children; strings become text nodes, never markup. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

/** A failed API call: `message` is the API's `error` text (or the HTTP status when the body is not JSON), `field`
 * the request field it names (a 400's `field`), if any. */
export class ApiError extends Error {
  constructor(status, message, field = "") {
    super(message);
    this.status = status;
    this.field = field;
  }
}

/** The `error` text of a failed answer, read from its JSON body. */
export async function errorOf(resp) {
  let message = `HTTP ${resp.status}`;
  let field = "";
  try {
    const data = await resp.json();
    if (data && typeof data.error === "string") message = data.error;
    if (data && typeof data.field === "string") field = data.field;
  } catch { /* not JSON: the status says it */ }
  return new ApiError(resp.status, message, field);
}

export const authHeader = () => ({ Authorization: `Bearer ${session.token}` });

/** A path under the caller's namespace; names come from the API (DNS labels) and are escaped anyway. */
export const nsPath = (rest) => `/v1/namespaces/${encodeURIComponent(session.namespace)}${rest}`;

export const seg = encodeURIComponent;

/** One JSON call; resolves to the decoded body (null for 204), rejects with an ApiError. */
export async function api(method, path, body) {
  const headers = { ...authHeader(), ...(body !== undefined ? { "Content-Type": "application/json" } : {}) };
  const resp = await fetch(path, { method, headers, body: body !== undefined ? JSON.stringify(body) : undefined,
    cache: "no-store" });
  if (!resp.ok) throw await errorOf(resp);
  return resp.status === 204 ? null : resp.json();
}

/** Every item of a paged listing (`?limit=&cursor=`), up to `max`. */
export async function listAll(path, max = 5000) {
  const items = [];
  let cursor = null;
  do {
    const sep = path.includes("?") ? "&" : "?";
    const page = await api("GET", `${path}${sep}limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`);
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < max);
  return items;
}

/** Show a message in a status element: errors as alerts (read out at once), the rest politely. */
export function say(node, text, isError = false) {
  node.textContent = text;
  node.classList.toggle("error", isError);
  node.setAttribute("role", isError ? "alert" : "status");
}
