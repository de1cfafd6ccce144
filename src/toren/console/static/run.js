// The run page: header, controls, input/output, and the timeline of the run's streams,
// followed live over the API's SSE stream (events, token deltas, the final run).
import {
  $, ago, announce, api, CAUSE, digestButton, followStream, h, json, KIND, ms, num, pill, showError,
  stamp, STATUS, TERMINAL, usd,
} from "./app.js";

const runId = $("run-root").dataset.runId;
const STATES = { connecting: "connecting…", live: "● live", reconnecting: "reconnecting…", ended: "log complete" };
const events = [];
const deltas = new Map(); // "stream:pos" -> streamed text of a model call in flight
const requests = new Map(); // seq -> loaded request messages of a model call
// A stream shows its newest WINDOW steps; "Show earlier steps" adds WINDOW more. A run of
// 10,000 steps then renders a few hundred list items, not 10,000, on every live update.
const WINDOW = 200;
const shown = new Map(); // stream -> how many of its newest positions are rendered
const replayed = new Set(); // seqs of recorded steps a tick replayed while this page watched
let run = null;
let streamState = "connecting";
let scheduled = false;
let refreshTimer = null;

// -- folding the log into streams (as toren.core.contract.replay does) ------------------------------

function fold() {
  const streams = new Map();
  const root = { waiting: null };
  const get = (name) => {
    if (!streams.has(name)) streams.set(name, emptyStream(name));
    return streams.get(name);
  };
  for (const e of events) {
    if (e.stream === "") {
      if (e.type === "ModelCallCutOff") get(e.payload.stream || mainStream()).cutoffs.push(e);
      if (e.type === "RunRetried") retryFold(streams, e.payload.retried_seqs || []);
      if (e.type === "RunWaiting") root.waiting = e;
      else if (e.type !== "RunStarted") root.waiting = null;
      continue;
    }
    const s = get(e.stream);
    if (e.type === "StreamInvalidated") {
      const from = e.payload.from_pos;
      const removed = [...s.steps.values()].filter((st) => st.pos >= from).sort((a, b) => a.pos - b.pos);
      removed.forEach((st) => s.steps.delete(st.pos));
      // A call cut off in the suffix was an attempt at a superseded step: it goes with them.
      const cutoffs = s.cutoffs.filter((c) => c.payload.position >= from);
      s.cutoffs = s.cutoffs.filter((c) => c.payload.position < from);
      s.invalidations.push({ event: e, from, removed, cutoffs });
      continue;
    }
    if (e.position === null || e.position === undefined || !e.digest) continue;
    const step = s.steps.get(e.position);
    if (!step || step.digest !== e.digest) {
      s.steps.set(e.position, { pos: e.position, digest: e.digest, first: e, done: null, stream: e.stream });
    } else {
      step.done = e;
    }
  }
  return { streams, root };
}

function emptyStream(name) {
  return { name, steps: new Map(), invalidations: [], cutoffs: [] };
}

function mainStream() {
  return run ? run.process : "main";
}

// A retry takes the failures it retries out of the view (toren.core.contract.replay.StreamView.retry).
function retryFold(streams, seqs) {
  const retried = new Set(seqs);
  for (const s of streams.values()) {
    for (const [pos, step] of [...s.steps]) {
      if (retried.has(step.first.seq) && !step.first.type.startsWith("Child") && step.first.type !== "TimerScheduled") s.steps.delete(pos);
      else if (step.done && retried.has(step.done.seq)) step.done = null;
    }
  }
}

// -- rendering steps -----------------------------------------------------------------------

function compact(value, max = 120) {
  if (value === undefined) return "";
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

function pre(value) {
  return h("pre", { class: "json", tabindex: "0" }, typeof value === "string" ? value : json(value));
}

function block(title, value) {
  return h("div", {}, h("h4", {}, title), pre(value));
}

function describe(step) {
  const p = step.first.payload;
  const done = step.done && step.done.payload;
  switch (step.first.type) {
    case "ModelCallRecorded": {
      const response = p.response || {};
      const calls = (response.tool_calls || []).map((c) => c.name);
      return {
        kind: KIND.MODEL,
        name: `${p.provider}:${p.model}`,
        preview: p.error ? null : (response.text ? compact(response.text, 160) : calls.length ? `→ calls ${calls.join(", ")}` : ""),
        badges: p.error ? [h("span", { class: "badge err" }, `error: ${compact(p.error.message || p.error.code, 80)}`)] : [],
        facts: [ms(p.latency_ms), `${num(p.input_tokens)} → ${num(p.output_tokens)} tok`,
          cost(p.cost_usd)],
        details: () => modelDetails(step),
      };
    }
    case "ToolCallRecorded":
      return {
        kind: KIND.TOOL,
        name: p.name,
        args: `(${compact(p.args, 90).replace(/^\{|\}$/g, "")})`,
        preview: p.error ? null : `→ ${compact(p.result, 160)}`,
        badges: [
          p.reused_from_seq ? h("span", { class: "badge reused", title: `The identical call at seq ${p.reused_from_seq} in a superseded suffix was not executed again` }, `reused result of seq ${p.reused_from_seq}`) : null,
          p.error ? h("span", { class: "badge err" }, `error: ${compact(p.error.message || p.error.code, 80)}`) : null,
        ],
        facts: [ms(p.latency_ms)],
        details: () => h("div", { class: "detail-grid" }, block("Arguments", p.args), p.error ? block("Error", p.error) : block("Result", p.result)),
      };
    case "ValueRecorded":
      return { kind: KIND.VALUE, name: p.what, preview: `= ${compact(p.value)}`, facts: [] };
    case "TimerScheduled": {
      const isSleep = p.purpose === "sleep"; // TimerScheduled.purpose: "sleep" or "message"
      let preview = `${isSleep ? "fires" : "times out"} ${stamp(p.fire_at)}`;
      if (done && step.done.type === "TimerFired") preview = `fired ${stamp(done.fired_at)}`;
      if (done && step.done.type === "MessageReceived") preview = `received “${done.name}” → ${compact(done.payload)}`;
      return {
        kind: isSleep ? KIND.SLEEP : KIND.MESSAGE,
        name: isSleep ? `sleep ${p.seconds} s` : `wait for message (timeout ${p.seconds} s)`,
        preview, facts: [],
        details: done && step.done.type === "MessageReceived" ? () => block("Payload", done.payload) : null,
      };
    }
    case "MessageReceived":
      return { kind: KIND.MESSAGE, name: `message “${p.name}”`, preview: `→ ${compact(p.payload)}`, facts: [],
        details: () => block("Payload", p.payload) };
    case "ChildStarted":
      return {
        kind: KIND.CHILD,
        name: `spawn ${p.process}`,
        args: `(${compact(p.input, 80)})`,
        preview: done ? (done.error ? null : `→ ${compact(done.output, 140)}`) : "running…",
        badges: done && done.error ? [h("span", { class: "badge err" }, `error: ${compact(done.error.message, 80)}`)] : [],
        facts: [h("span", { class: "mono" }, p.child_stream)],
        details: () => h("div", { class: "detail-grid" }, block("Input", p.input), done ? block(done.error ? "Error" : "Output", done.error || done.output) : null),
      };
    default:
      return { kind: "other", name: step.first.type, preview: compact(step.first.payload), facts: [] };
  }
}

// A cost, rounded for reading, exact on hover (the log's decimal string).
function cost(value) {
  return h("span", { class: "cost", title: `$${value || 0} exactly` }, usd(value));
}

function modelDetails(step) {
  const p = step.first.payload;
  const response = p.response || {};
  const box = h("div", {});
  const grid = h("div", { class: "detail-grid" },
    p.error ? block("Error", p.error) : block("Response", response.text || "(no text)"),
    (response.tool_calls || []).length ? block("Tool calls", response.tool_calls) : block("Parameters", p.params || {}));
  const messages = h("div", { class: "messages", "aria-live": "polite" });
  const loaded = requests.get(step.first.seq);
  if (loaded) fillMessages(messages, loaded);
  const button = h("button", { type: "button", class: "link", hidden: loaded ? true : null }, `Show the request (${p.message_count} messages)`);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const body = await api(`/console/api/runs/${runId}/calls/${step.first.seq}`);
      requests.set(step.first.seq, body.messages);
      fillMessages(messages, body.messages);
      button.hidden = true;
    } catch (err) {
      messages.replaceChildren(h("p", { class: "error" }, err.message));
      button.disabled = false;
    }
  });
  box.append(grid, h("p", {}, button), messages);
  return box;
}

function fillMessages(el, messages) {
  el.replaceChildren(...messages.map((m) => {
    const content = typeof m.content === "string" ? m.content : json(m.content);
    return h("div", { class: `msg ${m.role}` }, h("span", { class: "role" }, m.role),
      h("p", {}, content || (m.tool_calls ? json(m.tool_calls) : "")));
  }));
}

function stepItem(step, ctx, superseded) {
  const d = describe(step);
  const key = `${step.stream}|${step.first.seq}`;
  const li = h("li", { class: "step", dataset: { kind: d.kind, pos: step.pos, seq: step.first.seq } });
  li.append(h("div", { class: "step-row" },
    h("span", { class: "pos", title: `position ${step.pos} in stream ${step.stream}` }, `#${step.pos}`),
    h("span", { class: `kind ${d.kind}` }, d.kind),
    h("div", { class: "title" },
      h("span", { class: "name" }, d.name), d.args ? h("span", { class: "args" }, d.args) : null,
      " ", ...(d.badges || []),
      replayed.has(step.first.seq) ? h("span", { class: "badge replayed", title: "Replayed from the log: not executed (nor paid) again" }, "↺ replayed") : null,
      d.preview ? h("span", { class: "preview", title: d.preview }, d.preview) : null),
    h("div", { class: "facts" }, ...d.facts.map((f) => h("span", {}, f)), digestButton(step.digest))));
  if (d.details) li.append(detailsBox(key, d.details, ctx));
  const child = step.first.type === "ChildStarted" && step.first.payload.child_stream;
  if (child && ctx.streams.has(child) && !ctx.rendered.has(child) && (!superseded || !ctx.claimed.has(child))) {
    li.append(h("div", { class: "children" }, streamBox(ctx.streams.get(child), ctx)));
  }
  return li;
}

// Details rendered on first open, and kept open across re-renders (ctx.open holds the keys).
function detailsBox(key, render, ctx) {
  const details = h("details", { dataset: { key } }, h("summary", {}, "Details"));
  if (ctx.open.has(key)) {
    details.open = true;
    details.append(render());
  } else {
    details.addEventListener("toggle", () => {
      if (details.open && details.children.length === 1) details.append(render());
    });
  }
  return details;
}

// A model call cut off in flight (ModelCallCutOff: a drain window ran out during a reload
// or a shutdown after the provider had reported usage). The provider billed it and the run's
// totals count it, but it is not a step: a run-level event naming the step it was, which has
// no recorded call of its own and runs again. Shown at that step's place, before its
// eventual recorded call, greyed, so that every cost in the header has its row.
function cutOffItem(e, ctx) {
  const p = e.payload;
  const tokens = `${num(p.input_tokens)} → ${num(p.output_tokens)} tok`;
  return h("li", { class: "step cut-off", dataset: { cutOff: "", pos: p.position, seq: e.seq } },
    h("div", { class: "step-row" },
      h("span", { class: "pos", title: `position ${p.position} in stream ${p.stream}` }, `#${p.position}`),
      h("span", { class: `kind ${KIND.MODEL}` }, KIND.MODEL),
      h("div", { class: "title" },
        h("span", { class: "name" }, `${p.provider}:${p.model}`), " ",
        h("span", { class: "badge cut", title: "Cut off in flight: billed by the provider and counted in the run's cost, not recorded as a step" }, "✂ cut off"),
        h("span", { class: "preview" }, `${p.reason || "stopped"}: billed and counted, not recorded; the step runs again`)),
      h("div", { class: "facts" }, ...[ms(p.latency_ms), tokens, cost(p.cost_usd)].map((f) => h("span", {}, f)),
        digestButton(p.request_digest))),
    detailsBox(`${p.stream}|cut|${e.seq}`, () => h("div", { class: "detail-grid" },
      block("Why", `Cut off in flight (${p.reason || "stopped"}) after the provider had reported usage. `
        + "The call is billed and counted in the run's cost; the step has no recorded call and runs again at this position."),
      block("Billed", { provider: p.provider, model: p.model, input_tokens: p.input_tokens, output_tokens: p.output_tokens,
        cost_usd: p.cost_usd, latency_ms: p.latency_ms, request_digest: p.request_digest })), ctx));
}

// What changed at each invalidation (GET /v1/runs/{id}/invalidations), by its seq.
const explained = new Map();
let explainTimer = null;

function whatChanged(seq) {
  const found = explained.get(seq);
  if (!found) return null;
  if (found.changes.length) {
    return h("ul", { class: "changes", "aria-label": "What changed" },
      ...found.changes.map((c) => h("li", { dataset: { part: c.part } }, c.text)));
  }
  return found.note ? h("p", { class: "changes-note" }, found.note) : null;
}

async function loadExplanations() {
  explainTimer = null;
  try {
    const body = await api(`/v1/runs/${runId}/invalidations`);
    explained.clear();
    for (const inv of body.invalidations) explained.set(inv.seq, inv);
    schedule();
  } catch (_) {
    // Best effort: the timeline shows the digests without it.
  }
}

// After an invalidation, and while one waits for its new step to be recorded.
function explainSoon() {
  const waiting = events.some((e) => e.type === "StreamInvalidated"
    && (!explained.has(e.seq) || (!explained.get(e.seq).changes.length && e.payload.cause !== CAUSE.PARENT_INVALIDATED && e.payload.cause !== CAUSE.STREAM_ENDED)));
  if (waiting && !explainTimer) explainTimer = setTimeout(loadExplanations, 300);
}

function invalidationItem(inv, ctx) {
  const p = inv.event.payload;
  const cause = {
    [CAUSE.DIGEST_MISMATCH]: "the request changed",
    [CAUSE.KIND_MISMATCH]: "a different kind of step",
    [CAUSE.STREAM_ENDED]: "the new code ended the stream here",
    [CAUSE.PARENT_INVALIDATED]: "its parent step was invalidated",
  }[p.cause] || p.cause;
  const versions = [...new Set(inv.removed.map((s) => (s.done || s.first).code_version))].join(", ");
  return h("li", { class: "invalidation", dataset: { from: inv.from } },
    h("div", { class: "inv-head" },
      h("strong", {}, `Invalidated from #${inv.from}`),
      h("span", {}, `${cause} · code version `, h("span", { class: "mono" }, p.code_version || "?")),
      h("span", { class: "inv-digests" },
        h("span", {}, "expected ", h("del", {}, digestButton(p.expected_digest) || "–"), p.expected_kind ? ` ${p.expected_kind}` : ""),
        h("span", {}, "actual ", h("ins", {}, digestButton(p.actual_digest) || "none"), p.actual_kind ? ` ${p.actual_kind}` : ""))),
    whatChanged(inv.event.seq),
    inv.removed.length || inv.cutoffs.length ? h("div", { class: "superseded", role: "group", "aria-label": `Superseded steps from #${inv.from}` },
      h("p", {}, `Superseded: ${inv.removed.length} step${inv.removed.length === 1 ? "" : "s"} kept in the log, no longer replayed`,
        versions ? ` (written by ${versions})` : "", inv.cutoffs.length ? ` · ${cutOffCount(inv.cutoffs.length)}` : ""),
      h("ol", { class: "steps" }, ...supersededItems(inv, ctx))) : null);
}

// The superseded steps and the calls cut off among them, by position (a cut-off first: it
// came before the step's recorded call).
function supersededItems(inv, ctx) {
  return [...inv.cutoffs.map((e) => cutOffItem(e, ctx)), ...inv.removed.map((s) => stepItem(s, ctx, true))]
    .sort((a, b) => Number(a.dataset.pos) - Number(b.dataset.pos));
}

function cutOffCount(n) {
  return `${n} model call${n === 1 ? "" : "s"} cut off`;
}

function pendingItem(stream, pos, text) {
  return h("li", { class: "step pending", dataset: { pending: `${stream}:${pos}` }, "aria-busy": "true" },
    h("div", { class: "step-row" },
      h("span", { class: "pos" }, `#${pos}`), h("span", { class: `kind ${KIND.MODEL}` }, KIND.MODEL),
      h("div", { class: "title" }, h("span", { class: "name" }, "streaming…")), h("div", { class: "facts" })),
    h("p", { class: "live-text" }, h("span", { class: "live-delta" }, text), h("span", { class: "cursor", "aria-hidden": "true" })));
}

// The question the agent asked (the built-in loop's ask_human tool), if it asked one: the
// last such call of the main stream's model.
function askedQuestion() {
  for (let i = events.length - 1; i >= 0; i--) {
    const e = events[i];
    if (e.type !== "ModelCallRecorded") continue;
    const calls = ((e.payload && e.payload.response) || {}).tool_calls || [];
    const ask = calls.find((c) => c.name === "ask_human");
    if (ask && ask.arguments && typeof ask.arguments.question === "string") return ask.arguments.question;
    if (e.stream === (run ? run.process : "main")) return null;
  }
  return null;
}

function waitingItem(waiting) {
  const p = waiting.payload;
  const question = askedQuestion();
  let text = p.messages && p.messages.length
    ? `Waiting for message ${p.messages.map((m) => `“${m}”`).join(" or ")}`
    : p.not_before ? `Sleeping until ${stamp(p.not_before)}` : "Waiting";
  if (question && p.messages && p.messages.length) text += `: the agent asks “${question}”`;
  return h("li", { class: "step pending", dataset: { waiting: "" } },
    h("div", { class: "step-row" }, h("span", { class: "pos" }, "…"), h("span", { class: "kind message" }, "wait"),
      h("div", { class: "title" }, h("span", { class: "name" }, text)), h("div", { class: "facts" })));
}

function streamBox(s, ctx) {
  ctx.rendered.add(s.name);
  const items = [];
  const positions = new Set([...s.steps.keys(), ...s.invalidations.map((i) => i.from), ...s.cutoffs.map((c) => c.payload.position)]);
  for (const key of deltas.keys()) {
    const [stream, pos] = splitKey(key);
    if (stream === s.name && !s.steps.has(pos)) positions.add(pos);
  }
  const sorted = [...positions].sort((a, b) => a - b);
  const limit = shown.get(s.name) || WINDOW;
  const hidden = Math.max(0, sorted.length - limit);
  if (hidden) items.push(earlierItem(s.name, hidden, limit));
  for (const pos of sorted.slice(hidden)) {
    for (const inv of s.invalidations.filter((i) => i.from === pos)) items.push(invalidationItem(inv, ctx));
    for (const cut of s.cutoffs.filter((c) => c.payload.position === pos)) items.push(cutOffItem(cut, ctx));
    if (s.steps.has(pos)) items.push(stepItem(s.steps.get(pos), ctx, false));
    else if (deltas.has(`${s.name}:${pos}`)) items.push(pendingItem(s.name, pos, deltas.get(`${s.name}:${pos}`)));
  }
  if (s.name === ctx.main && ctx.root.waiting && run && run.status === STATUS.WAITING) items.push(waitingItem(ctx.root.waiting));
  const inv = s.invalidations.length;
  const cut = s.cutoffs.length;
  return h("section", { class: "stream", "aria-label": `Stream ${s.name}`, dataset: { stream: s.name } },
    h("h3", {}, "Stream ", h("span", { class: "mono" }, s.name),
      // Current steps only: superseded ones sit under their invalidation, and the run's
      // "Steps recorded" (its usage) counts those too.
      h("span", { class: "sub" }, `${s.steps.size} current step${s.steps.size === 1 ? "" : "s"}${inv ? ` · ${inv} invalidation${inv === 1 ? "" : "s"}` : ""}${cut ? ` · ${cutOffCount(cut)}` : ""}`)),
    items.length ? h("ol", { class: "steps" }, ...items) : h("p", { class: "empty" }, "No steps yet."));
}

function earlierItem(stream, hidden, limit) {
  const more = Math.min(WINDOW, hidden);
  return h("li", { class: "step earlier", dataset: { earlier: String(hidden) } },
    h("button", {
      type: "button",
      class: "more",
      onclick: () => { shown.set(stream, limit + WINDOW); schedule(); },
    }, `Show ${more} earlier step${more === 1 ? "" : "s"}`),
    h("span", { class: "sub" }, ` ${hidden} earlier step${hidden === 1 ? "" : "s"} not shown`));
}

function splitKey(key) {
  const cut = key.lastIndexOf(":");
  return [key.slice(0, cut), Number(key.slice(cut + 1))];
}

function renderTimeline() {
  scheduled = false;
  const el = $("timeline");
  const { streams, root } = fold();
  for (const key of deltas.keys()) {
    const [stream] = splitKey(key);
    if (!streams.has(stream)) streams.set(stream, emptyStream(stream));
  }
  const open = new Set([...el.querySelectorAll("details[open]")].map((d) => d.dataset.key));
  const claimed = new Set();
  for (const s of streams.values()) {
    for (const st of s.steps.values()) if (st.first.type === "ChildStarted") claimed.add(st.first.payload.child_stream);
  }
  const main = mainStream();
  const ctx = { streams, root, open, claimed, rendered: new Set(), main };
  const order = [...streams.keys()].sort((a, b) => (a === main ? -1 : b === main ? 1 : a.localeCompare(b)));
  const boxes = [];
  for (const name of order) if (!ctx.rendered.has(name) && !isChildAnywhere(name, streams)) boxes.push(streamBox(streams.get(name), ctx));
  for (const name of order) if (!ctx.rendered.has(name)) boxes.push(streamBox(streams.get(name), ctx)); // orphans
  if (!boxes.length) boxes.push(h("p", { class: "empty" }, run && run.status === STATUS.QUEUED ? "Queued: no steps yet." : "No steps yet."));
  el.replaceChildren(...boxes);
  el.setAttribute("aria-busy", String(streamState === "connecting"));
  const invalidations = [...streams.values()].reduce((n, s) => n + s.invalidations.length, 0);
  const cutoffs = events.filter((e) => e.type === "ModelCallCutOff").length;
  $("timeline-legend").replaceChildren(...[
    h("span", {}, `${events.length} events`), h("span", {}, `${streams.size} stream${streams.size === 1 ? "" : "s"}`),
    invalidations ? h("span", {}, `${invalidations} invalidation${invalidations === 1 ? "" : "s"}`) : null,
    cutoffs ? h("span", {}, cutOffCount(cutoffs)) : null,
    h("span", { id: "stream-state" }, STATES[streamState] || streamState)].filter(Boolean));
}

function isChildAnywhere(name, streams) {
  for (const s of streams.values()) {
    for (const st of s.steps.values()) if (st.first.type === "ChildStarted" && st.first.payload.child_stream === name) return true;
    for (const inv of s.invalidations) for (const st of inv.removed) if (st.first.type === "ChildStarted" && st.first.payload.child_stream === name) return true;
  }
  return false;
}

function schedule() {
  if (!scheduled) {
    scheduled = true;
    requestAnimationFrame(renderTimeline);
  }
}

// -- header, output, controls --------------------------------------------------------------

function renderRun() {
  if (!run) return;
  const u = run.usage || {};
  $("run-status").className = `pill ${run.status}`;
  $("run-status").textContent = run.status + (run.cancel_requested && !TERMINAL.has(run.status) ? " · cancelling" : "");
  $("run-meta").replaceChildren(
    h("strong", {}, run.agent), ` · ${run.process} · started `,
    h("time", { datetime: new Date(run.created_at * 1000).toISOString() }, stamp(run.created_at)),
    ` · updated ${ago(run.updated_at)}`,
    run.idempotency_key ? ` · key ${run.idempotency_key}` : "",
    run.lease_recoveries ? ` · recovered from a dead worker ${run.lease_recoveries}×` : "",
    run.retries ? ` · retried ${run.retries}×` : "",
    ...(run.forked_from ? [" · forked from run ", h("a", { href: `/runs/${encodeURIComponent(run.forked_from.run_id)}`, id: "forked-from" }, run.forked_from.run_id), ` at ${run.forked_from.at}`] : []));
  const blocked = run.blocked && !TERMINAL.has(run.status) ? run.blocked : null;
  $("run-blocked").hidden = !blocked;
  if (blocked) {
    const e = blocked.error || {};
    $("run-blocked").replaceChildren(h("strong", {}, "blocked: "), e.message || e.code || "infrastructure error",
      h("span", { class: "sub" }, ` · attempt ${blocked.attempts}`,
        blocked.retry_at ? ` · next try ${clock(blocked.retry_at)}` : "",
        blocked.since ? ` · since ${stamp(blocked.since)}` : ""));
  }
  const queue = run.status === STATUS.QUEUED && run.queue ? run.queue : null;
  const paced = run.status === STATUS.WAITING && run.rate_limit ? run.rate_limit : null;
  const why = queue || paced;
  $("run-queued").hidden = !why;
  if (why) $("run-queued").textContent = why.reason;
  const lease = run.lease && !TERMINAL.has(run.status) ? run.lease : null;
  $("run-lease").hidden = !lease;
  if (lease) $("run-lease").textContent = `held by worker ${lease.worker} until ${clock(lease.expires_at)}`;
  $("s-steps").textContent = num(u.steps);
  $("s-tokens").textContent = `${num(u.input_tokens)} · ${num(u.output_tokens)}`;
  $("s-cost").textContent = usd(u.cost_usd);
  $("s-cost").title = `$${u.cost_usd || 0} exactly`;
  $("s-saved").textContent = usd(u.saved_by_replay_usd);
  $("s-inval").textContent = num(run.invalidations);
  $("s-toolerr").textContent = num(run.tool_errors || 0);
  $("s-toolerr").classList.toggle("bad", Boolean(run.tool_errors));
  $("s-version").textContent = run.code_version || "–";
  $("run-input").textContent = json(run.input);
  const out = $("run-output");
  if (run.status === STATUS.COMPLETED) {
    const o = run.output;
    const text = typeof o === "string" ? o : o && typeof o === "object" && typeof (o.answer ?? o.text ?? o.output) === "string" ? (o.answer ?? o.text ?? o.output) : null;
    out.replaceChildren(...[text !== null ? h("p", { class: "output-text" }, text) : null, pre(o)].filter(Boolean));
  } else if (run.status === STATUS.FAILED) {
    const e = run.error || {};
    out.replaceChildren(h("div", { class: "run-error-box" }, h("strong", {}, e.type || e.code || "Failed"), ": ", e.message || ""), ...(e.details ? [pre(e.details)] : []),
      ...(e.traceback ? [h("h4", {}, "Traceback"), h("pre", { class: "json traceback", id: "run-traceback", tabindex: "0" }, e.traceback)] : []));
  } else if (run.status === STATUS.CANCELLED) {
    out.replaceChildren(h("p", { class: "empty" }, "Cancelled before finishing."));
  } else {
    out.replaceChildren(h("p", { class: "empty" }, run.status === STATUS.WAITING ? "Not finished: the run is waiting." : "Not finished yet."));
  }
  const live = !TERMINAL.has(run.status);
  $("controls").hidden = !live;
  $("retry-zone").hidden = run.status !== STATUS.FAILED;
  if (!$("fork-at").value) $("fork-at").value = `${run.process}:0`;
  const waitingFor = run.waiting_for || [];
  $("waiting-hint").textContent = run.status === STATUS.WAITING && waitingFor.length
    ? `The run is waiting for ${waitingFor.map((n) => `“${n}”`).join(" or ")}.`
    : "Messages wait in the run's inbox until it asks for them.";
  const question = run.status === STATUS.WAITING && waitingFor.length ? askedQuestion() : null;
  $("waiting-question").hidden = !question;
  $("waiting-question").textContent = question ? `The agent asks: ${question}` : "";
  // The name the run waits for, pre-filled; a name typed by hand stays.
  const name = $("msg-name");
  if (waitingFor.length && (!name.value || name.value === name.dataset.filled) && !waitingFor.includes(name.value)) {
    name.value = waitingFor[0];
    name.dataset.filled = waitingFor[0];
  }
  schedule();
}

async function refreshRun() {
  clearTimeout(refreshTimer);
  refreshTimer = null;
  try {
    const before = run && run.status;
    run = await api(`/v1/runs/${runId}`);
    if (before && before !== run.status) announce(`Run is ${run.status}`);
    renderRun();
  } catch (err) {
    if (err.status !== 401) showError($("run-error"), err);
  }
}

function clock(ts) {
  return ts ? new Date(ts * 1000).toLocaleTimeString([], { hour12: false }) : "–";
}

function refreshSoon() {
  if (!refreshTimer) refreshTimer = setTimeout(refreshRun, 400);
}

function onMessage(message) {
  if (message.event === "event") {
    const e = message.data;
    if (e.seq <= lastSeq) return; // a stream followed again after a retry
    lastSeq = e.seq;
    events.push(e);
    if (e.position !== null && e.position !== undefined) deltas.delete(`${e.stream}:${e.position}`);
    if (e.type === "StreamInvalidated") announce(`Stream ${e.stream} invalidated from step ${e.payload.from_pos}`);
    if (e.type === "ModelCallCutOff") {
      deltas.delete(`${e.payload.stream}:${e.payload.position}`); // the text it streamed ends here
      announce(`Model call at step ${e.payload.position} of stream ${e.payload.stream} cut off: ${usd(e.payload.cost_usd)} counted`);
    }
    explainSoon();
    refreshSoon();
    schedule();
  } else if (message.event === "delta") {
    const { stream, position, text } = message.data;
    const key = `${stream}:${position}`;
    deltas.set(key, (deltas.get(key) || "") + text);
    const el = document.querySelector(`[data-pending="${CSS.escape(key)}"] .live-delta`);
    if (el) el.textContent = deltas.get(key);
    else schedule();
  } else if (message.event === "replayed") {
    replayed.add(message.data.seq);
    schedule();
  } else if (message.event === "end") {
    deltas.clear();
    const before = run && run.status;
    if (message.data.run) run = message.data.run;
    if (run && before !== run.status) announce(`Run ${run.status}`);
    renderRun();
  } else if (message.event === "error") {
    showError($("run-error"), new Error(message.data.error.message));
  }
}

function setupControls() {
  $("copy-id").addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(runId);
      announce("Run id copied");
    } catch (_) {
      announce("Copy is not available here");
    }
  });
  $("message-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const status = $("msg-status");
    // As the start form and `toren runs send`: JSON when it parses; otherwise plain text,
    // sent as a string ("Yes please" needs no quotes).
    const raw = $("msg-payload").value;
    let payload;
    try {
      payload = JSON.parse(raw || "null");
    } catch (err) {
      if (/^\s*[[{]/.test(raw)) { // meant as JSON: say what is wrong rather than guess
        status.textContent = `The payload is not valid JSON: ${err.message}`;
        status.className = "status-line bad";
        $("msg-payload").setAttribute("aria-invalid", "true");
        return;
      }
      payload = raw.trim();
    }
    $("msg-payload").removeAttribute("aria-invalid");
    try {
      const sent = await api(`/v1/runs/${runId}/messages`, { method: "POST", body: { name: $("msg-name").value.trim(), payload } });
      // A name the run does not wait for is kept, with the server's warning naming the names.
      status.textContent = sent.warning ? `Message kept (inbox id ${sent.message_id}), but ${sent.warning}.` : `Message sent (inbox id ${sent.message_id}).`;
      status.className = sent.warning ? "status-line bad" : "status-line ok";
      refreshSoon();
    } catch (err) {
      status.textContent = err.message;
      status.className = "status-line bad";
    }
  });
  const cancel = $("cancel");
  let armed = null;
  cancel.addEventListener("click", async () => {
    if (!armed) {
      cancel.textContent = "Click again to cancel";
      cancel.classList.add("confirm");
      armed = setTimeout(() => {
        armed = null;
        cancel.textContent = "Cancel run";
        cancel.classList.remove("confirm");
      }, 5000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    cancel.disabled = true;
    try {
      run = await api(`/v1/runs/${runId}/cancel`, { method: "POST" });
      $("cancel-status").textContent = "Cancellation requested.";
      renderRun();
    } catch (err) {
      $("cancel-status").textContent = err.message;
      cancel.disabled = false;
    }
  });
}

let lastSeq = 0;

async function follow() {
  await followStream(`/v1/runs/${runId}/stream?after=${lastSeq}`, {
    onMessage,
    onState: (state) => {
      streamState = state;
      schedule();
    },
  }).catch((err) => showError($("run-error"), err));
  streamState = "ended";
  schedule();
}

function setupFixForward() {
  const retry = $("retry");
  retry.addEventListener("click", async () => {
    retry.disabled = true;
    const status = $("retry-status");
    try {
      run = await api(`/v1/runs/${runId}/retry`, { method: "POST", body: {} });
      status.textContent = "Retrying under the code now deployed.";
      status.className = "status-line ok";
      renderRun();
      if (streamState === "ended") follow();
    } catch (err) {
      status.textContent = err.message;
      status.className = "status-line bad";
    } finally {
      retry.disabled = false;
    }
  });
  $("fork-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const status = $("fork-status");
    const body = { at: $("fork-at").value.trim() };
    const text = $("fork-input").value.trim();
    if (text) {
      try {
        body.input = JSON.parse(text);
      } catch (_) {
        body.input = text; // plain text is an input too
      }
    }
    try {
      const forked = await api(`/v1/runs/${runId}/fork`, { method: "POST", body });
      status.textContent = `Forked as ${forked.id}.`;
      status.className = "status-line ok";
      window.location.assign(`/runs/${encodeURIComponent(forked.id)}`);
    } catch (err) {
      status.textContent = err.message;
      status.className = "status-line bad";
    }
  });
}

async function init() {
  setupControls();
  setupFixForward();
  try {
    run = await api(`/v1/runs/${runId}`);
  } catch (err) {
    if (err.status !== 401) {
      showError($("run-error"), err);
      $("timeline").replaceChildren(h("p", { class: "empty" }, "Nothing to show."));
      $("run-meta").textContent = "";
      $("run-status").textContent = "unknown";
    }
    return;
  }
  renderRun();
  await follow();
}

init();
