// The token page: check the token against the API, keep it in this tab, go back.
//
// The submit handler is attached first, before anything waits on the network, and the
// button is enabled only then (the page ships it disabled): a token typed and submitted
// early never leaves as a form submission, let alone in a URL.
import { $, getToken, setToken } from "./app.js";

// The path to go back to after signing in: a path on this origin, or "/". Browsers drop
// tabs and newlines anywhere in a URL and trim control characters and spaces at its ends,
// so "/\t/evil.example" is "//evil.example" to them: normalise as they do, refuse
// anything that is not a plain path ("//host", "/\host", "scheme:"), then let the URL
// parser confirm that it resolves to this very origin.
export function safeNext(raw, origin = location.origin) {
  const cleaned = String(raw || "")
    .replace(/[\t\n\r]/g, "")
    .replace(/^[\u0000-\u0020]+|[\u0000-\u0020]+$/g, "");
  if (!cleaned.startsWith("/") || /^\/[\/\\]/.test(cleaned) || /[\\\u0000-\u001f]/.test(cleaned)) {
    return "/";
  }
  let url;
  try {
    url = new URL(cleaned, origin);
  } catch (_) {
    return "/";
  }
  // The absolute URL, not its path: a path like "/.//evil.example" resolves to the path
  // "//evil.example", which location.assign would read as another host.
  return url.origin === origin ? url.href : "/";
}

function nextPath() {
  return safeNext(new URLSearchParams(location.search).get("next"));
}

async function check(token) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch("/v1/agents", { headers });
  return response.status;
}

async function submit(event) {
  event.preventDefault();
  const status = $("login-status");
  const token = $("token").value.trim();
  if (!token) return;
  status.textContent = "Checking…";
  status.className = "status-line";
  try {
    const code = await check(token);
    if (code === 200) {
      setToken(token, $("remember").checked);
      location.assign(nextPath());
      return;
    }
    status.textContent = code === 401 ? "That token is not accepted by this server." : `The server answered ${code}.`;
  } catch (err) {
    status.textContent = "The server cannot be reached.";
  }
  status.className = "status-line bad";
  $("token").focus();
}

$("login-form").addEventListener("submit", submit);
$("sign-in").disabled = false;

async function noTokensNeeded() {
  const status = $("login-status");
  // A server without tokens (loopback dev) needs no sign-in at all.
  if (!getToken() && (await check("")) === 200) {
    status.textContent = "This server runs without API tokens (local development): no sign-in needed.";
    status.className = "status-line ok";
  }
}

noTokensNeeded();
