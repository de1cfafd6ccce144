// The agents page: every agent and process, each with a link that opens the start form.
import { $, api, h, showError } from "./app.js";

async function init() {
  try {
    const { agents } = await api("/v1/agents");
    $("agents").replaceChildren(...(agents.length ? agents.map((agent) =>
      h("li", {},
        h("h2", {}, agent.name),
        agent.error ? h("p", { class: "error" }, agent.error) : null,
        h("ul", { "aria-label": `Processes of ${agent.name}` }, ...agent.processes.map((process) =>
          h("li", {},
            h("span", { class: "mono" }, process),
            h("a", { href: `/?start=${encodeURIComponent(agent.name)}&process=${encodeURIComponent(process)}`,
              "aria-label": `Start ${agent.name} ${process}` }, "Start a run →")))),
        h("p", {}, h("a", { href: `/?agent=${encodeURIComponent(agent.name)}` }, "See its runs")),
      )) : [h("li", { class: "empty" }, "No agents.")]));
  } catch (err) {
    if (err.status !== 401) showError($("agents-error"), err);
  }
}

init();
