// Uploads the CSV, then follows the run's server-sent events and draws each
// step as it arrives. Output comes from code run in a sandbox: it is inserted
// as text, and tables are rebuilt cell by cell, never as raw HTML.
const $ = (id) => document.getElementById(id);

function el(tag, props = {}, ...kids) {
  const e = Object.assign(document.createElement(tag), props);
  e.append(...kids.filter((k) => k !== null && k !== undefined));
  return e;
}

function table(html) {
  const src = new DOMParser().parseFromString(html, "text/html").querySelector("table");
  if (!src) return null;
  const copy = (n) => {
    const tag = n.tagName.toLowerCase();
    if (!["table", "thead", "tbody", "tr", "th", "td"].includes(tag)) return null;
    const e = document.createElement(tag);
    if (n.children.length) for (const k of n.children) { const c = copy(k); if (c) e.append(c); }
    else e.textContent = n.textContent;
    return e;
  };
  return copy(src);
}

function renderStep(ev) {
  const id = "step-" + ev.step;
  const box = $(id) || $("steps").appendChild(el("article", { id, className: "step" }));
  box.dataset.status = ev.status;
  box.replaceChildren(...[
    el("h2", { textContent: `Step ${ev.step} · ${ev.status}` }),
    el("pre", { className: "code", textContent: ev.code }),
    ev.stdout ? el("pre", { className: "stdout", textContent: ev.stdout }) : null,
    ev.stderr ? el("pre", { className: "stderr", textContent: ev.stderr }) : null,
    ev.text ? el("pre", { className: "result", textContent: ev.text }) : null,
    ev.error ? el("pre", { className: "error", textContent: ev.error }) : null,
    ...(ev.tables || []).map(table),
    ...(ev.charts || []).map((png, i) => el("img", { src: "data:image/png;base64," + png, alt: `Chart ${i + 1} of step ${ev.step}` })),
  ].filter(Boolean));
}

$("ask").addEventListener("submit", async (e) => {
  e.preventDefault();
  const file = $("csv").files[0];
  if (!file) return;
  $("go").disabled = true;
  $("steps").replaceChildren();
  $("answer").replaceChildren();
  $("status").textContent = "Starting a sandbox…";
  document.body.dataset.run = "running";
  const res = await fetch("/api/runs?question=" + encodeURIComponent($("question").value), { method: "POST", body: file });
  if (!res.ok) {
    $("status").textContent = "Could not start: " + (await res.json()).error;
    $("go").disabled = false;
    document.body.dataset.run = "failed";
    return;
  }
  const { id } = await res.json();
  const es = new EventSource(`/api/runs/${id}/events`);
  const finish = (state, text) => {
    es.close();
    document.body.dataset.run = state;
    $("status").textContent = text;
    $("go").disabled = false;
  };
  es.addEventListener("sandbox", (m) => { $("status").textContent = `Running in sandbox ${JSON.parse(m.data).sandbox_id}…`; });
  es.addEventListener("step", (m) => renderStep(JSON.parse(m.data)));
  es.addEventListener("answer", (m) => {
    $("answer").replaceChildren(el("div", { className: "final" }, el("h2", { textContent: "Answer" }), el("p", { textContent: JSON.parse(m.data).answer })));
    finish("done", "Done.");
  });
  es.addEventListener("failed", (m) => finish("failed", "The run failed: " + JSON.parse(m.data).error));
  es.onerror = () => { if (document.body.dataset.run === "running") finish("failed", "Lost the connection to the app."); };
});
