// The replay plan: which in-flight runs the code this server runs would invalidate.
import { $, api, CAUSE, digestButton, h, num, pill, showError, usd } from "./app.js";

// Which parts of the request differ ("message 0 (the system prompt) changed", ...).
function changeList(changes) {
  if (!changes || !changes.length) return null;
  return h("ul", { class: "changes", "aria-label": "What changed" },
    ...changes.map((c) => h("li", { dataset: { part: c.part } }, c.text)));
}

function finding(f) {
  const fact = (label, ...value) => h("div", {}, h("dt", {}, label), h("dd", {}, ...value));
  return h("dl", { class: "finding" },
    fact("Stream", h("span", { class: "mono" }, f.stream)),
    fact("From step", `#${f.from_pos}`),
    fact("Cause", f.cause.replace(/_/g, " ")),
    fact("What changed", changeList(f.changes) || (f.cause === CAUSE.STREAM_ENDED ? "the code ends the stream here" : "–")),
    fact("Expected digest", digestButton(f.expected_digest) || "–", f.expected_kind ? ` (${f.expected_kind})` : ""),
    fact("New digest", digestButton(f.actual_digest) || "stream ends", f.actual_kind ? ` (${f.actual_kind})` : ""),
    fact("Superseded", `${f.suffix_steps} step${f.suffix_steps === 1 ? "" : "s"}, ${f.suffix_model_calls} model call${f.suffix_model_calls === 1 ? "" : "s"}`),
    fact("Re-run cost", `${usd(f.suffix_cost_usd)} · ${num(f.suffix_tokens)} tokens`),
    fact("Written by", h("span", { class: "mono" }, f.written_by.join(", ") || "–")),
  );
}

function planCard(p) {
  const verdict = p.problem ? "cannot be planned" : p.clean ? "replays cleanly" : "would be invalidated";
  return h("article", { class: `plan-run ${p.clean ? "clean" : ""}`, "aria-label": `${p.run_id}: ${verdict}` },
    h("h2", {}, h("a", { href: `/runs/${p.run_id}`, class: "mono" }, p.run_id), pill(p.status),
      h("span", {}, `${p.agent} · ${p.process}`),
      h("span", { class: "sub" }, `${p.replayed_steps} steps replay · ${verdict}`)),
    p.problem ? h("p", { class: "error" }, p.problem) : null,
    ...p.findings.map(finding));
}

async function load() {
  const status = $("plan-status");
  status.textContent = "Planning…";
  try {
    const plan = await api("/v1/plan");
    $("plan-totals").hidden = false;
    $("p-runs").textContent = num(plan.runs);
    $("p-inval").textContent = num(plan.invalidated);
    $("p-problems").textContent = num(plan.problems);
    $("p-cost").textContent = usd(plan.rerun_cost_usd);
    const sorted = [...plan.plans].sort((a, b) => Number(a.clean) - Number(b.clean));
    $("plan").replaceChildren(...(sorted.length ? sorted.map(planCard)
      : [h("p", { class: "empty" }, "No in-flight runs: nothing to plan.")]));
    status.textContent = `Planned ${plan.runs} run${plan.runs === 1 ? "" : "s"} in ${plan.elapsed_ms} ms.`;
    showError($("plan-error"), null);
  } catch (err) {
    status.textContent = "";
    if (err.status !== 401) showError($("plan-error"), err);
  }
}

$("replan").addEventListener("click", load);
load();
