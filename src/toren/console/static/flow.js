// The flow page: each concurrency key with unfinished runs (its limit, the runs holding a
// slot, those queued and since when) and each provider rate limit (the window's use, a
// 429 block, the runs parked for a slot), from GET /v1/flow.
import { $, ago, api, h, num, showError } from "./app.js";

const per = (period) => (period === 60 ? "min" : `${period} s`);

function used(taken, limit, period) {
  return limit === null ? `${num(taken)} (no limit)` : `${num(taken)} / ${num(limit)} per ${per(period)}`;
}

function keyRow(k) {
  return h("tr", { "data-key": k.key },
    h("td", { class: "mono" }, k.key),
    h("td", { class: "num" }, k.limit === null ? "removed" : String(k.limit)),
    h("td", { class: "num" }, num(k.holding)),
    h("td", { class: "num" }, num(k.queued)),
    h("td", {}, k.oldest_queued_at ? ago(k.oldest_queued_at) : "–"),
  );
}

function limitRow(r, now) {
  const blocked = r.blocked_until ? `for ${Math.ceil(r.blocked_until - now)} s more` : "–";
  return h("tr", { "data-limit": r.key },
    h("td", { class: "mono" }, r.key),
    h("td", { class: "num" }, used(r.calls_in_window, r.rpm, r.period)),
    h("td", { class: "num" }, used(r.tokens_in_window, r.tpm, r.period)),
    h("td", { class: "num" }, num(r.parked)),
    h("td", {}, blocked),
    h("td", { class: "num" }, `${num(r.paced)} / ${num(r.throttled)} / ${num(r.calls)}`),
  );
}

function empty(cols, text) {
  return h("tr", {}, h("td", { colspan: String(cols), class: "empty" }, text));
}

async function init() {
  try {
    const flow = await api("/v1/flow");
    $("keys-body").replaceChildren(...(flow.keys.length ? flow.keys.map(keyRow)
      : [empty(5, "No run with a concurrency key is unfinished.")]));
    $("limits-body").replaceChildren(...(flow.rate_limits.length
      ? flow.rate_limits.map((r) => limitRow(r, flow.now))
      : [empty(6, "No rate limit declared (agent.yaml rate_limits: or TOREN_RATE_LIMITS).")]));
  } catch (err) {
    if (err.status !== 401) showError($("flow-error"), err);
  }
}

init();
