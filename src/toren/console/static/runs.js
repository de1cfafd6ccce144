// The runs page: totals, filters, a live table (polled every 2 s), and the start form.
import { $, ago, announce, api, h, num, pill, showError, STATUSES, TERMINAL, usd } from "./app.js";

const POLL_MS = 2000;
const PAGE = 50;
const ID_LIKE = /^[A-Za-z0-9_-]{6,64}$/;

let limit = PAGE;
let known = new Map(); // run id -> status, to announce changes and highlight new rows
let first = true;
let agents = [];
let timer = null;

function filters() {
  return {
    status: $("f-status").value,
    agent: $("f-agent").value,
    process: $("f-process").value.trim(),
    q: $("f-q").value.trim(),
    search: $("f-search").value.trim(),
  };
}

function syncUrl() {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(filters())) if (v) params.set(k, v);
  const query = params.toString();
  history.replaceState(null, "", query ? `/?${query}` : "/");
}

function restoreFilters() {
  const params = new URLSearchParams(location.search);
  $("f-status").value = params.get("status") || "";
  $("f-process").value = params.get("process") || "";
  $("f-q").value = params.get("q") || "";
  $("f-search").value = params.get("search") || "";
  return params.get("agent") || "";
}

// The table is kept up to date by asking only for what changed: a full page when the
// filters (or the page size) change and every FULL_EVERY polls, and in between only the
// runs updated since the last poll (`updated_after`, with an overlap for clocks that
// differ between workers), merged in place. Lists carry no large inputs or outputs
// (they come as summaries), so a poll costs the server little whatever the runs hold.
const FULL_EVERY = 15;
const OVERLAP_S = 10;
let table = { key: null, runs: [], since: 0, polls: 0, more: false };

function matches(run, f) {
  return (!f.status || run.status === f.status) && (!f.agent || run.agent === f.agent)
    && (!f.process || run.process === f.process);
}

async function fullPage(f, size) {
  const params = new URLSearchParams({ limit: String(size) });
  for (const key of ["status", "agent", "process", "search"]) if (f[key]) params.set(key, f[key]);
  const page = await api(`/v1/runs?${params}`);
  return { runs: page.runs, more: Boolean(page.next_cursor) };
}

async function changedSince(f, since) {
  // No status filter here: a run that left the filtered status must leave the table.
  const params = new URLSearchParams({ limit: "200", updated_after: String(Math.max(0, since - OVERLAP_S)) });
  for (const key of ["agent", "process"]) if (f[key]) params.set(key, f[key]);
  const page = await api(`/v1/runs?${params}`);
  return page.next_cursor ? null : page.runs; // too many changes: reload instead
}

function merge(runs, changed, f, size) {
  const byId = new Map(runs.map((r) => [r.id, r]));
  for (const run of changed) {
    if (matches(run, f)) byId.set(run.id, run);
    else byId.delete(run.id);
  }
  const merged = [...byId.values()].sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
  return merged.slice(0, size);
}

async function loadTable(f) {
  const size = Math.min(limit, 200);
  const key = JSON.stringify([f.status, f.agent, f.process, f.search, size]);
  let changed = null;
  // With a search every poll is a full page: whether a changed run's input matches is the
  // server's to say (a list may carry only a summary of it).
  const incremental = table.key === key && table.polls % FULL_EVERY !== 0 && !f.search;
  if (incremental) changed = await changedSince(f, table.since);
  if (changed === null) {
    const page = await fullPage(f, size);
    table = { key, runs: page.runs, since: 0, polls: 0, more: page.more };
    changed = page.runs;
  } else {
    table.runs = merge(table.runs, changed, f, size);
  }
  table.polls += 1;
  for (const run of changed) table.since = Math.max(table.since, run.updated_at || 0);
  return table;
}

async function loadRuns() {
  const f = filters();
  const current = await loadTable(f);
  let runs = current.runs;
  if (f.q) {
    runs = runs.filter((r) => r.id.toLowerCase().includes(f.q.toLowerCase()));
    // An exact id beyond the loaded page (or outside the filters) is looked up directly.
    if (!runs.length && ID_LIKE.test(f.q)) {
      try {
        runs = [await api(`/v1/runs/${encodeURIComponent(f.q)}`)];
      } catch (err) {
        if (err.status !== 404) throw err;
      }
    }
  }
  $("more").hidden = !current.more || Boolean(f.q) || limit >= 200;
  return runs;
}

function cell(label, content, cls) {
  return h("td", { "data-label": label, class: cls }, content);
}

// What the run was asked, in one line: the built-in loop's message, a string, or JSON.
function inputSummary(run) {
  // A large input is left out of a list: its summary carries the start of its JSON text.
  if (run.input_summary && typeof run.input_summary.preview === "string") {
    const preview = run.input_summary.preview;
    return preview.length > 80 ? preview.slice(0, 79) + "…" : preview + "…";
  }
  const input = run.input;
  const text = typeof input === "string" ? input
    : input && typeof input === "object" && typeof input.message === "string" ? input.message
      : input === null || input === undefined ? "" : JSON.stringify(input);
  return text.length > 80 ? text.slice(0, 79) + "…" : text;
}

function blockedBadge(run) {
  const b = run.blocked;
  if (!b) return null;
  const message = (b.error && b.error.message) || "infrastructure error";
  return h("span", { class: "badge err blocked", title: message }, ` blocked ×${b.attempts}`);
}

// Tool calls that failed: the built-in loop showed the model the error and went on, so a
// completed run may carry them (docs/agent-yaml.md, on_tool_error).
function toolErrorsBadge(run) {
  const n = run.tool_errors || 0;
  if (!n) return null;
  return h("span", { class: "badge cut tool-errors", title: "tool calls that failed; the model saw the errors" },
    ` ⚠ ${n} tool error${n === 1 ? "" : "s"}`);
}

function row(run) {
  const u = run.usage || {};
  const fresh = !first && !known.has(run.id);
  return h("tr", { class: fresh ? "fresh" : null, dataset: { runId: run.id, status: run.status } },
    cell("Run", h("a", { href: `/runs/${run.id}` }, run.id), "id"),
    cell("Agent", [h("span", { class: "agent" }, run.agent), h("span", { class: "proc" }, ` · ${run.process}`)]),
    cell("Input", h("span", { class: "input-summary", title: inputSummary(run) }, inputSummary(run)), "input"),
    cell("Status", [pill(run.status), blockedBadge(run), toolErrorsBadge(run), run.cancel_requested && !TERMINAL.has(run.status)
      ? h("span", { class: "badge", title: "cancellation requested" }, " cancelling") : null]),
    cell("Steps", num(u.steps), "num"),
    cell("Tokens", num((u.input_tokens || 0) + (u.output_tokens || 0)), "num"),
    cell("Cost", usd(u.cost_usd), "num"),
    cell("Saved", Number(u.saved_by_replay_usd) ? usd(u.saved_by_replay_usd) : "–", "num"),
    cell("Started", h("time", { datetime: new Date(run.created_at * 1000).toISOString(), title: new Date(run.created_at * 1000).toLocaleString() }, ago(run.created_at)), "when"),
    cell("Updated", ago(run.updated_at), "when"),
  );
}

function render(runs) {
  const body = $("runs-body");
  const changes = [];
  for (const run of runs) {
    const before = known.get(run.id);
    if (!first && before === undefined) changes.push(`Run ${run.id} started (${run.agent})`);
    else if (!first && before !== run.status) changes.push(`Run ${run.id} is ${run.status}`);
  }
  body.replaceChildren(...(runs.length ? runs.map(row)
    : [h("tr", {}, h("td", { colspan: 10, class: "empty" }, "No runs match. Start one above, or with `toren run`."))]));
  known = new Map([...known, ...runs.map((r) => [r.id, r.status])]);
  first = false;
  if (changes.length) announce(changes.slice(0, 3).join(". "));
}

async function loadTotals() {
  const t = await api("/console/api/summary");
  $("t-runs").textContent = num(t.runs);
  $("t-status").replaceChildren(h("span", { class: "status-counts" },
    ...STATUSES
      .filter((s) => t.runs_by_status[s])
      .map((s) => h("a", { href: `/?status=${s}` }, `${t.runs_by_status[s]} ${s}`))));
  $("t-tokens").textContent = num(t.input_tokens + t.output_tokens);
  $("t-tokens-split").textContent = `${num(t.input_tokens)} in · ${num(t.output_tokens)} out`;
  $("t-cost").textContent = usd(t.cost_usd);
  $("t-steps").textContent = `${num(t.steps)} steps executed`;
  $("t-saved").textContent = usd(t.saved_by_replay_usd);
  $("t-inval").textContent = `${num(t.invalidations)} invalidation${t.invalidations === 1 ? "" : "s"}`;
}

async function refresh() {
  clearTimeout(timer);
  try {
    const [runs] = await Promise.all([loadRuns(), loadTotals()]);
    render(runs);
    showError($("runs-error"), null);
    $("live-dot").classList.remove("stale");
  } catch (err) {
    if (err.status === 401) return;
    showError($("runs-error"), err);
    $("live-dot").classList.add("stale");
  }
  if (!document.hidden) timer = setTimeout(refresh, POLL_MS);
}

// -- the start form -----------------------------------------------------------------------

function fillProcesses() {
  const agent = agents.find((a) => a.name === $("start-agent").value);
  const wanted = new URLSearchParams(location.search).get("process");
  $("start-process").replaceChildren(...(agent ? agent.processes : []).map((p) =>
    h("option", { selected: p === wanted || null }, p)));
}

async function loadAgents(selectedAgent) {
  agents = (await api("/v1/agents")).agents;
  const options = agents.map((a) => h("option", { value: a.name }, a.name + (a.error ? " (does not load)" : "")));
  $("f-agent").append(...options.map((o) => o.cloneNode(true)));
  $("f-agent").value = selectedAgent;
  $("start-agent").replaceChildren(...options);
  const startAgent = new URLSearchParams(location.search).get("start");
  if (startAgent) {
    $("start-agent").value = startAgent;
    $("start-panel").open = true;
  }
  fillProcesses();
}

async function startRun(event) {
  event.preventDefault();
  const status = $("start-status");
  // JSON when it parses; otherwise plain text, sent as a string (what the built-in loop
  // takes): "What is the weather in Paris?" needs no quotes.
  const raw = $("start-input").value;
  let input;
  try {
    input = JSON.parse(raw || "null");
  } catch (err) {
    if (/^\s*[[{]/.test(raw)) { // meant as JSON: say what is wrong rather than guess
      status.textContent = `The input is not valid JSON: ${err.message}`;
      status.className = "status-line bad";
      $("start-input").setAttribute("aria-invalid", "true");
      $("start-input").focus();
      return;
    }
    input = raw.trim();
  }
  $("start-input").removeAttribute("aria-invalid");
  const body = { agent: $("start-agent").value, process: $("start-process").value || "main", input };
  const key = $("start-key").value.trim();
  if (key) body.idempotency_key = key;
  status.textContent = "Starting…";
  status.className = "status-line";
  try {
    const run = await api("/v1/runs", { method: "POST", body });
    status.replaceChildren("Started ", h("a", { href: `/runs/${run.id}` }, run.id), ".");
    status.className = "status-line ok";
    refresh();
  } catch (err) {
    status.textContent = err.message;
    status.className = "status-line bad";
  }
}

function init() {
  const agent = restoreFilters();
  $("filters").addEventListener("input", () => {
    syncUrl();
    limit = PAGE;
    refresh();
  });
  $("filters").addEventListener("submit", (e) => e.preventDefault());
  $("more").addEventListener("click", () => {
    limit += PAGE;
    refresh();
  });
  $("start-agent").addEventListener("change", fillProcesses);
  $("start-form").addEventListener("submit", startRun);
  document.addEventListener("visibilitychange", () => !document.hidden && refresh());
  loadAgents(agent).then(refresh, (err) => {
    if (err.status !== 401) showError($("runs-error"), err);
  });
}

init();
