// The token page: check the token against the API, keep it in this tab, go back.
import { $, getToken, setToken } from "./app.js";

function nextPath() {
  const next = new URLSearchParams(location.search).get("next") || "/";
  // Only a path on this origin: "//host" or "https:" would leave the console.
  return /^\/(?![\/\\])/.test(next) ? next : "/";
}

async function check(token) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const response = await fetch("/v1/agents", { headers });
  return response.status;
}

async function init() {
  const status = $("login-status");
  // A server without tokens (loopback dev) needs no sign-in at all.
  if (!getToken() && (await check("")) === 200) {
    status.textContent = "This server runs without API tokens (local development): no sign-in needed.";
    status.className = "status-line ok";
  }
  $("login-form").addEventListener("submit", async (event) => {
    event.preventDefault();
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
  });
}

init();
