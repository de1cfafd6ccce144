// The schedules page: each schedule's timing and policies, next fire times, paused or
// orphaned or not (with its note or reason), its last runs with their status, and why a time was last skipped.
import { $, api, h, pill, showError, STATUS } from "./app.js";

const utc = (iso) => (iso ? iso.replace("T", " ").replace("Z", " UTC") : "–");

function when(s) {
  return s.cron ? `cron ${s.cron} (${s.zone})` : `every ${s.every} s`;
}

function state(s) {
  if (s.orphaned) return "orphaned";
  return s.paused ? "paused" : "active";
}

function card(s) {
  const runs = s.recent_runs || [];
  const idle = s.paused || s.orphaned;
  return h("li", { "data-schedule": s.id },
    h("h2", {}, s.id, " ", h("span", { class: `pill ${idle ? STATUS.WAITING : STATUS.RUNNING}` },
      state(s))),
    s.orphaned ? h("p", { class: "hint" }, `Orphaned: ${s.orphaned}`) : null,
    s.paused && s.note ? h("p", { class: "hint" }, `Paused: ${s.note}`) : null,
    h("dl", { class: "facts" },
      h("dt", {}, "When"), h("dd", { class: "mono" }, when(s)),
      h("dt", {}, "Starts"), h("dd", { class: "mono" }, `${s.agent}:${s.process}`),
      h("dt", {}, "Overlap"), h("dd", { class: "mono", "data-overlap": s.overlap }, s.overlap),
      h("dt", {}, "Catch-up"), h("dd", { class: "mono" }, `${s.catch_up}, window ${s.catch_up_window} s`),
      h("dt", {}, "From"), h("dd", {}, s.source === "agent.yaml"
        ? `agent.yaml (code version ${s.code_version || "–"})` : "the API"),
      h("dt", {}, "Next"), h("dd", { class: "next" }, s.upcoming.length
        ? s.upcoming.slice(0, 3).map(utc).join(" · ") : `– (${state(s)})`),
      h("dt", {}, "Fired"), h("dd", {}, `${s.fires} times` + (s.mean_lateness_seconds !== null
        ? `, ${s.mean_lateness_seconds} s late on average` : "")),
      h("dt", {}, "Skipped"), h("dd", { class: "skip" }, s.last_skip
        ? `${s.skips} times; last ${utc(s.last_skip.nominal)}: ${s.last_skip.reason}`
        : `${s.skips} times`),
    ),
    h("h3", {}, "Last runs"),
    runs.length
      ? h("ul", { "aria-label": `Runs of ${s.id}` }, ...runs.map((r) =>
        h("li", {}, h("a", { href: `/runs/${encodeURIComponent(r.id)}`, class: "mono" }, r.id),
          " ", pill(r.status), " ", h("span", { class: "hint" }, `for ${utc(r.nominal)}`))))
      : h("p", { class: "hint" }, "No run yet."),
  );
}

async function init() {
  try {
    const { schedules } = await api("/v1/schedules");
    const full = await Promise.all(schedules.map((s) =>
      api(`/v1/schedules/${encodeURIComponent(s.agent)}/${encodeURIComponent(s.name)}`)));
    $("schedules").replaceChildren(...(full.length ? full.map(card)
      : [h("li", { class: "empty" }, "No schedules. Add schedules: to an agent.yaml, or run toren schedules create.")]));
  } catch (err) {
    if (err.status !== 401) showError($("schedules-error"), err);
  }
}

init();
