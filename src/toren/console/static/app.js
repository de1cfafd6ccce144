// Shared by every console page: the token, API calls, the SSE reader, small DOM helpers.
//
// The API token lives in sessionStorage (or localStorage when the user ticked "remember")
// and goes out only as an Authorization header. It is never put in a URL: EventSource
// cannot send headers, so live streams are read with fetch() and a ReadableStream.

const KEY = "toren.token";

// Toren's fixed sets, rendered into every page by the server (toren.core.contract.values): the
// console never spells a status, a step kind or an invalidation cause list itself.
const VOCABULARY = JSON.parse(document.body.dataset.vocabulary || "{}");
export const STATUS = Object.freeze(VOCABULARY.RunStatus || {});
export const STATUSES = Object.freeze(Object.values(STATUS));
export const TERMINAL = new Set(VOCABULARY.terminal || []);
export const KIND = Object.freeze(VOCABULARY.StepKind || {});
export const CAUSE = Object.freeze(VOCABULARY.InvalidationCause || {});

export function getToken() {
  return sessionStorage.getItem(KEY) || localStorage.getItem(KEY) || "";
}

export function setToken(token, remember) {
  clearToken();
  (remember ? localStorage : sessionStorage).setItem(KEY, token);
}

export function clearToken() {
  sessionStorage.removeItem(KEY);
  localStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function headers(extra = {}) {
  const token = getToken();
  return token ? { ...extra, Authorization: `Bearer ${token}` } : extra;
}

function toLogin() {
  const next = location.pathname + location.search;
  location.assign(`/login?next=${encodeURIComponent(next)}`);
}

async function failure(response) {
  let code = "http_" + response.status;
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) ({ code, message } = body.error);
  } catch (_) {
    /* not JSON */
  }
  return new ApiError(response.status, code, message);
}

// fetch a JSON route of the API with the token; a 401 sends the user to the token page.
export async function api(path, { method = "GET", body, signal, redirect = true } = {}) {
  const init = { method, headers: headers({ Accept: "application/json" }), signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401 && redirect) {
    toLogin();
    throw new ApiError(401, "unauthorized", "sign in with an API token");
  }
  if (!response.ok) throw await failure(response);
  return response.json();
}

// Follow a Server-Sent Events stream with the Authorization header. Calls
// onMessage({event, id, data}) per message; reconnects with Last-Event-ID after a dropped
// connection (the API then resumes after the last delivered event: nothing lost or
// repeated). Resolves after the `end` (or `error`) message, or when `signal` aborts.
export async function followStream(path, { onMessage, onState, signal }) {
  let lastId = null;
  let retry = 1000;
  for (;;) {
    if (signal && signal.aborted) return;
    try {
      const init = { headers: headers({ Accept: "text/event-stream" }), signal };
      if (lastId !== null) init.headers["Last-Event-ID"] = lastId;
      const response = await fetch(path, init);
      if (response.status === 401) return toLogin();
      if (!response.ok) throw await failure(response);
      onState && onState("live");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let current = {};
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.search(/\r?\n/)) >= 0) {
          const line = buffer.slice(0, cut);
          buffer = buffer.slice(cut + (buffer[cut] === "\r" ? 2 : 1));
          if (line === "") {
            if (current.data !== undefined) {
              const message = { event: current.event || "message", id: current.id, data: JSON.parse(current.data) };
              if (message.id !== undefined) lastId = message.id;
              onMessage(message);
              if (message.event === "end" || message.event === "error") return;
            }
            current = {};
          } else if (!line.startsWith(":")) {
            const colon = line.indexOf(":");
            const field = colon < 0 ? line : line.slice(0, colon);
            const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            if (field === "data") current.data = current.data === undefined ? value : current.data + "\n" + value;
            else if (field === "retry") retry = Number(value) || retry;
            else current[field] = value;
          }
        }
      }
    } catch (err) {
      if (signal && signal.aborted) return;
      if (err instanceof ApiError && err.status < 500) throw err;
    }
    onState && onState("reconnecting");
    await new Promise((resolve) => setTimeout(resolve, retry));
  }
}

// -- DOM --------------------------------------------------------------------------------

// h("a", {href: "/x", class: "y"}, "text", child): build an element; strings become text
// nodes (never HTML), so run data cannot inject markup.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function $(id) {
  return document.getElementById(id);
}

export function announce(text) {
  const el = $("announcer");
  if (!el) return;
  el.textContent = "";
  setTimeout(() => (el.textContent = text), 30);
}

export function showError(el, err) {
  el.hidden = !err;
  el.textContent = err ? (err.message || String(err)) : "";
}

// -- formatting -------------------------------------------------------------------------

export function usd(value) {
  const n = Number(value || 0);
  if (n === 0) return "$0";
  if (n < 0.01) return "$" + n.toPrecision(2).replace(/0+$/, "");
  return "$" + n.toFixed(n < 10 ? 4 : 2).replace(/0{1,2}$/, "");
}

export function num(n) {
  n = Number(n || 0);
  if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + "M";
  if (n >= 1e4) return (n / 1e3).toFixed(n >= 1e5 ? 0 : 1) + "k";
  return n.toLocaleString("en-US");
}

export function ms(value) {
  const n = Number(value || 0);
  if (n < 1) return "<1 ms";
  if (n < 1000) return Math.round(n) + " ms";
  if (n < 60000) return (n / 1000).toFixed(n < 10000 ? 2 : 1) + " s";
  return Math.round(n / 60000) + " min";
}

export function ago(seconds) {
  if (!seconds) return "–";
  const d = Date.now() / 1000 - seconds;
  if (d < 5) return "just now";
  if (d < 60) return Math.round(d) + " s ago";
  if (d < 3600) return Math.round(d / 60) + " min ago";
  if (d < 86400) return Math.round(d / 3600) + " h ago";
  return new Date(seconds * 1000).toLocaleDateString();
}

export function stamp(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "–";
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}

export function pill(status) {
  return h("span", { class: `pill ${status}` }, status);
}

export function digestButton(digest) {
  if (!digest) return null;
  const full = String(digest);
  const short = full.replace(/^sha256:/, "").slice(0, 10);
  const button = h("button", { type: "button", class: "digest", title: full, "aria-expanded": "false",
    "aria-label": `digest ${short}, show the full digest` }, short);
  button.addEventListener("click", () => {
    const open = button.getAttribute("aria-expanded") === "true";
    button.setAttribute("aria-expanded", String(!open));
    button.textContent = open ? short : full;
  });
  return button;
}

// The header's session area: who is signed in, and a way out.
export async function session() {
  const el = $("session");
  if (!el || document.body.dataset.page === "login") return;
  if (getToken()) {
    el.append(h("span", {}, "Signed in with a token"),
      h("button", { type: "button", class: "link", onclick: () => { clearToken(); location.assign("/login"); } }, "Sign out"));
  }
}

session();
