// The console: a hash-routed single page over the public REST API.
import { api, stream, session, enc } from "./api.js";
import { h, bytes, duration, result, execError } from "./render.js";
import { Terminal } from "./terminal.js";

const main = document.getElementById("main");
const statusBox = document.getElementById("status");
let cleanups = [];

function onLeave(fn) { cleanups.push(fn); }

function say(text, isError = false) {
  const m = h("div", { class: "msg" + (isError ? " error" : ""), text });
  statusBox.append(m);
  setTimeout(() => m.remove(), isError ? 9000 : 4000);
}

// act runs an action and reports its failure.
async function act(what, fn) {
  try { const r = await fn(); return r; } catch (e) { say(`${what} failed: ${e.message}`, true); return undefined; }
}

function every(ms, fn) {
  fn();
  const t = setInterval(fn, ms);
  onLeave(() => clearInterval(t));
}

function page(title, ...kids) {
  document.title = title + " · PandaStack";
  main.replaceChildren(h("h1", { text: title }), ...kids);
}

// ---- sign in ----

function signIn(message) {
  document.getElementById("nav").hidden = true;
  const input = h("input", { id: "apikey", type: "password", autocomplete: "off", required: true, placeholder: "pds_…" });
  const form = h("form", { class: "signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title", text: "Sign in to PandaStack" }),
    h("p", { class: "muted", text: "Paste an API key. `pandastack serve` prints one on first start and saves it to <data dir>/api-key. The console keeps it in this page's memory only: a reload asks for it again." }),
    message ? h("p", { class: "error", role: "alert", text: message }) : null,
    h("label", { for: "apikey", text: "API key" }), input,
    h("button", { type: "submit", class: "primary", text: "Sign in" }));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    session.key = input.value.trim();
    try { await api("GET", "/v1/sandboxes?limit=1"); } catch (err) { session.key = ""; signIn(err.message); return; }
    location.hash = "#/sandboxes";
    route();
  });
  main.replaceChildren(form);
  input.focus();
}

window.addEventListener("pandastack:unauthorized", (e) => { session.key = ""; leave(); signIn(e.detail); });
document.getElementById("signout").addEventListener("click", () => { session.key = ""; leave(); signIn(); });

// ---- sandboxes ----

const cpuSamples = new Map(); // sandbox id → last {cpu_seconds, at}
// How many sandboxes a list in the console shows at most (the newest).
const LIST_PAGE = 500;

function cpuPercent(id, st) {
  const now = Date.parse(st.sampled_at), prev = cpuSamples.get(id);
  cpuSamples.set(id, { s: st.cpu_seconds, at: now });
  // The count starts again at a resume: a drop is a new start, no sample.
  if (!prev || now <= prev.at || st.cpu_seconds < prev.s) return null;
  return (100 * (st.cpu_seconds - prev.s)) / ((now - prev.at) / 1000);
}

function stateCell(s) { return h("span", { class: "state state-" + s.state, text: s.state }); }

// stateReason says why a sandbox is paused or stopped, in words.
function stateReason(s) {
  if (s.state === "paused" && s.pause_reason === "idle") {
    return h("span", { class: "reason muted", title: `Nothing ran in it for ${s.idle_timeout_seconds} s, so it was saved to disk and uses no CPU or memory; the next request resumes it.`, text: " (idle: resumes on the next request)" });
  }
  if (s.state === "paused" && s.pause_reason === "memory") {
    return h("span", { class: "reason muted", title: "The host ran short of memory and this sandbox was among the quietest, so it was saved to disk; the next request resumes it.", text: " (host memory: resumes on the next request)" });
  }
  if (s.state === "paused") return h("span", { class: "reason muted", text: s.auto_resume ? " (asked for; resumes on the next request)" : " (asked for; resume it to use it)" });
  if (s.stop_reason) return h("span", { class: "reason muted", text: ` (${s.stop_reason})` });
  return null;
}

function metadataTags(md) { return Object.entries(md || {}).map(([k, v]) => h("span", { class: "tag", text: `${k}=${v}` })); }

function sandboxActions(s, refresh) {
  const b = (label, text, fn, cls) => h("button", { type: "button", class: cls, "aria-label": `${label} ${s.id}`, text, onclick: fn });
  const out = [];
  if (s.state === "running" || s.state === "paused") out.push(b("Extend by 10 minutes", "+10 min", () => act("Extend", async () => { await api("PATCH", `/v1/sandboxes/${s.id}`, { ttl_seconds: 600 + Math.max(0, Math.round((Date.parse(s.expires_at) - Date.now()) / 1000)) }); say(`Extended ${s.id}`); refresh(); })));
  if (s.state === "running") {
    out.push(b("Pause", "Pause", () => act("Pause", async () => { await api("POST", `/v1/sandboxes/${s.id}/pause`); say(`Paused ${s.id}`); refresh(); })));
    out.push(b("Snapshot", "Snapshot", () => act("Snapshot", async () => { const sn = await api("POST", `/v1/sandboxes/${s.id}/snapshots`, {}); say(`Snapshot ${sn.id} of ${s.id} taken`); refresh(); })));
    out.push(b("Fork", "Fork", () => act("Fork", async () => { const r = await api("POST", `/v1/sandboxes/${s.id}/fork`, { count: 1 }); say(`Forked ${s.id} into ${r.sandboxes.map((k) => k.id).join(", ")}`); refresh(); })));
    out.push(b("End processes", "End processes", () => act("End processes", async () => {
      if (!confirm(`End every process in sandbox ${s.id} but its code kernels (their variables stay)? Commands, background processes and terminals end.`)) return;
      const r = await api("POST", `/v1/sandboxes/${s.id}/processes/kill`);
      say(`Ended ${r.killed} process${r.killed === 1 ? "" : "es"} in ${s.id}; its kernels are kept` + (r.remaining ? ` (${r.remaining} still forking: end them again)` : ""));
      refresh();
    })));
  }
  if (s.state === "paused") out.push(b("Resume", "Resume", () => act("Resume", async () => { await api("POST", `/v1/sandboxes/${s.id}/resume`); say(`Resumed ${s.id}`); refresh(); })));
  if (s.state !== "stopped") out.push(b("Kill", "Kill", () => act("Kill", async () => {
    if (!confirm(`Kill sandbox ${s.id}? Its state is lost (snapshots stay).`)) return;
    await api("DELETE", `/v1/sandboxes/${s.id}`); say(`Killed ${s.id}`); refresh();
  }), "danger"));
  return h("div", { class: "actions" }, out);
}

async function templateOptions(select) {
  const r = await act("Listing templates", () => api("GET", "/v1/templates"));
  for (const t of r?.templates || []) select.append(h("option", { value: t.name, text: t.name }));
  if (select.querySelector('option[value="code-interpreter"]')) select.value = "code-interpreter";
}

function sandboxesPage() {
  const filter = h("input", { id: "filter", type: "search", placeholder: "key=value", value: sessionStorage.getItem("pandastack.filter") || "" });
  const showStopped = h("input", { id: "show-stopped", type: "checkbox" });
  const tbody = h("tbody");
  const table = h("table", { "aria-label": "Sandboxes" },
    h("thead", {}, h("tr", {}, ["Sandbox", "State", "Template", "Metadata", "CPU", "Memory", "Expires in", "Actions"].map((t) => h("th", { scope: "col", text: t })))), tbody);
  const tpl = h("select", { id: "create-template" });
  const ttl = h("input", { id: "create-ttl", type: "number", min: 1, value: 1800, size: 6 });
  const md = h("input", { id: "create-metadata", placeholder: "key=value, …" });
  const idle = h("input", { id: "create-idle", type: "number", min: 0, size: 6, placeholder: "default" });
  const create = h("form", { class: "inline", "aria-label": "Create a sandbox" },
    h("label", { for: "create-template", text: "Template" }), tpl,
    h("label", { for: "create-ttl", text: "TTL (seconds)" }), ttl,
    h("label", { for: "create-metadata", text: "Metadata" }), md,
    h("label", { for: "create-idle", text: "Pause when idle for (seconds, 0 never)" }), idle,
    h("button", { type: "submit", class: "primary", text: "Create sandbox" }));
  templateOptions(tpl);
  const parsePairs = (s) => Object.fromEntries(s.split(",").map((p) => p.trim()).filter(Boolean).map((p) => { const i = p.indexOf("="); return i < 0 ? [p, ""] : [p.slice(0, i).trim(), p.slice(i + 1).trim()]; }));
  create.addEventListener("submit", (e) => {
    e.preventDefault();
    const button = create.querySelector("button");
    button.disabled = true;
    act("Create", async () => {
      // Number, not parseInt: "1e3" is 1000 (parseInt read 1), and what is
      // no whole number goes to the server, which says what is wrong.
      const req = { template: tpl.value, metadata: parsePairs(md.value) };
      if (ttl.value !== "") req.ttl_seconds = Number(ttl.value);
      if (idle.value !== "") req.idle_timeout_seconds = Number(idle.value);
      const s = await api("POST", "/v1/sandboxes", req);
      say(`Created ${s.id}`);
      refresh();
    }).finally(() => { button.disabled = false; });
  });

  let latest = 0;
  const shown = new Map(); // sandbox id → {sig, tr}
  // The row an empty list shows is kept and compared like the others, so a
  // first load with no sandboxes shows it too (an empty tbody matched).
  const none = h("tr", {}, h("td", { colspan: 8, class: "muted", text: "No sandboxes. Create one above." }));
  // The list is the newest LIST_PAGE (stopped records are kept a day, and
  // a busy server has thousands): the row below says when more are left.
  const more = h("tr", {}, h("td", { colspan: 8, class: "muted", text: `Only the newest ${LIST_PAGE} are shown: filter by metadata to find older ones.` }));
  async function refresh() {
    const n = ++latest;
    sessionStorage.setItem("pandastack.filter", filter.value);
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(parsePairs(filter.value))) q.set("metadata." + k, v);
    if (showStopped.checked) q.set("state", "all");
    q.set("order", "newest");
    q.set("limit", String(LIST_PAGE));
    let list, next;
    try { ({ sandboxes: list, next } = await api("GET", "/v1/sandboxes?" + q)); } catch (e) { if (n === latest) say("Listing sandboxes failed: " + e.message, true); return; }
    const stats = await Promise.all(list.map((s) => s.state === "running" ? api("GET", `/v1/sandboxes/${s.id}/stats`).catch(() => null) : null));
    if (n !== latest) return;
    // A row is rebuilt only when what its buttons act on changed; the
    // figures change in place. Rebuilding every poll would take the
    // keyboard's focus, and a click under way, away from its button.
    const rows = list.map((s, i) => {
      const st = stats[i];
      const cpu = st ? cpuPercent(s.id, st) : null;
      const sig = JSON.stringify([s.state, s.pause_reason, s.stop_reason, s.auto_resume, s.idle_timeout_seconds, s.template, s.metadata, s.expires_at]);
      let row = shown.get(s.id);
      if (!row || row.sig !== sig) {
        row = { sig, tr: h("tr", { "data-id": s.id },
          h("td", {}, h("a", { href: `#/sandboxes/${s.id}`, class: "mono", text: s.id })),
          h("td", {}, stateCell(s), stateReason(s)),
          h("td", { text: s.template }),
          h("td", {}, metadataTags(s.metadata)),
          h("td"), h("td"), h("td"),
          h("td", {}, sandboxActions(s, refresh))) };
        shown.set(s.id, row);
      }
      const td = row.tr.children;
      td[4].textContent = cpu === null ? (st ? "…" : "") : `${cpu.toFixed(0)} % of ${s.cpu}`;
      td[5].textContent = st ? `${bytes(st.memory_bytes)} / ${bytes(st.memory_limit_bytes)}` : "";
      td[6].textContent = s.state === "stopped" ? "" : duration(Date.parse(s.expires_at) - Date.now());
      return row.tr;
    });
    for (const id of [...shown.keys()]) if (!list.some((s) => s.id === id)) shown.delete(id);
    if (!rows.length) rows.push(none);
    if (next) rows.push(more);
    const same = rows.length === tbody.children.length && rows.every((tr, i) => tbody.children[i] === tr);
    if (!same) tbody.replaceChildren(...rows);
  }
  filter.addEventListener("input", refresh);
  showStopped.addEventListener("change", refresh);
  page("Sandboxes",
    create,
    h("div", { class: "toolbar" },
      h("label", { for: "filter", text: "Filter by metadata" }), filter,
      h("label", {}, showStopped, "Show stopped")),
    table);
  every(3000, refresh);
}

// ---- one sandbox ----

function tabs(names, panels) {
  const buttons = names.map((name, i) => h("button", {
    type: "button", role: "tab", id: "tab-" + name.toLowerCase(), "aria-controls": "panel-" + name.toLowerCase(),
    "aria-selected": i === 0 ? "true" : "false", tabindex: i === 0 ? "0" : "-1", text: name,
  }));
  const select = (i) => {
    buttons.forEach((b, j) => { b.setAttribute("aria-selected", String(i === j)); b.tabIndex = i === j ? 0 : -1; panels[j].hidden = i !== j; });
    buttons[i].focus();
    panels[i].dispatchEvent(new Event("shown"));
  };
  buttons.forEach((b, i) => {
    b.addEventListener("click", () => select(i));
    b.addEventListener("keydown", (e) => {
      if (e.key === "ArrowRight") select((i + 1) % buttons.length);
      if (e.key === "ArrowLeft") select((i + buttons.length - 1) % buttons.length);
    });
  });
  panels.forEach((p, i) => { p.setAttribute("role", "tabpanel"); p.id = "panel-" + names[i].toLowerCase(); p.setAttribute("aria-labelledby", "tab-" + names[i].toLowerCase()); p.hidden = i !== 0; });
  return h("div", { role: "tablist", "aria-label": "Sandbox views" }, buttons);
}

function sandboxPage(id) {
  const head = h("div", { class: "toolbar" });
  // The state last read: panels that poll leave a paused sandbox asleep
  // (any request that needs it would resume it).
  const known = { state: "", sig: "", onRunning: [], seen: false };
  // looked resolves once the state was first read: a panel that must not
  // wake a paused sandbox waits for it.
  let lookedAt;
  known.looked = new Promise((resolve) => { lookedAt = resolve; });
  async function refreshHead() {
    try { await readHead(); } finally { lookedAt(); }
  }
  async function readHead() {
    try {
      const s = await api("GET", `/v1/sandboxes/${id}`);
      const wasRunning = known.state === "running";
      known.state = s.state;
      known.seen = true;
      const idle = s.idle_timeout_seconds ? ` · pauses after ${duration(s.idle_timeout_seconds * 1000)} idle` : "";
      const info = `template ${s.template} · ${s.cpu} CPU · ${s.memory_mb} MiB · expires in ${duration(Date.parse(s.expires_at) - Date.now())}${idle}`;
      // Rebuilt only when its buttons would change (focus stays put).
      const sig = JSON.stringify([s.state, s.pause_reason, s.stop_reason, s.auto_resume, s.metadata, s.expires_at]);
      if (sig !== known.sig) {
        known.sig = sig;
        head.replaceChildren(h("span", { id: "sandbox-state" }, "State: ", stateCell(s), stateReason(s)), h("span", { class: "muted", id: "sandbox-info" }), ...metadataTags(s.metadata), sandboxActions(s, refreshHead));
      }
      head.querySelector("#sandbox-info").textContent = info;
      if (s.state === "running" && !wasRunning) known.onRunning.forEach((f) => f());
    } catch (e) {
      known.state = e.status === 404 ? "killed" : "";
      known.sig = "";
      head.replaceChildren(h("span", { id: "sandbox-state" }, "State: ", h("span", { class: "state state-killed", text: e.status !== 404 ? "unknown" : known.seen ? "killed" : "not found" })), h("span", { class: "muted", text: e.status !== 404 ? e.message : known.seen ? " (the sandbox is gone; its history stays below)" : " (killed, or no sandbox of this project; its history, if any, stays below)" }));
    }
  }
  const panels = [notebookPanel(id, known), historyPanel(id), filesPanel(id, known), terminalPanel(id), metricsPanel(id, known)];
  page("Sandbox " + id, head, tabs(["Notebook", "History", "Files", "Terminal", "Metrics"], panels), ...panels);
  every(5000, refreshHead);
}

function notebookPanel(id, known) {
  const panel = h("section");
  const lang = h("select", { id: "nb-language" }, ["python", "bash", "javascript", "typescript", "r", "java"].map((l) => h("option", { value: l, text: l })));
  const ctx = h("select", { id: "nb-context" }, h("option", { value: "", text: "default context of the language" }));
  const loadContexts = async () => {
    const r = await api("GET", `/v1/sandboxes/${id}/contexts`).catch(() => null);
    const keep = ctx.value;
    ctx.replaceChildren(h("option", { value: "", text: "default context of the language" }), ...(r?.contexts || []).map((c) => h("option", { value: c.id, text: `${c.id} (${c.language})` })));
    ctx.value = keep;
  };
  // Listing contexts needs the sandbox: list them once it runs, or when asked.
  known.onRunning.push(loadContexts);
  ctx.addEventListener("focus", () => { if (known.state === "running") loadContexts(); });
  const newCtx = h("button", { type: "button", text: "New context", onclick: () => act("New context", async () => { const c = await api("POST", `/v1/sandboxes/${id}/contexts`, { language: lang.value }); await loadContexts(); ctx.value = c.id; say(`Context ${c.id} created`); }) });
  const cells = h("div");
  const addCell = (code = "") => {
    const n = cells.children.length + 1;
    const src = h("textarea", { class: "code", id: `cell-${n}`, "aria-label": `Code of cell ${n}`, spellcheck: "false" });
    src.value = code;
    src.rows = Math.max(4, code.split("\n").length + 1);
    const out = h("div", { class: "output", "aria-live": "polite", "aria-label": `Output of cell ${n}` });
    const run = h("button", { type: "button", class: "primary", text: "Run", "aria-label": `Run cell ${n}` });
    const stop = h("button", { type: "button", text: "Interrupt", "aria-label": `Interrupt cell ${n}` });
    stop.hidden = true;
    const state = h("span", { class: "muted", id: `cell-${n}-state` });
    const go = async () => {
      if (run.disabled) return; // running: Shift+Enter must not start it again over its output
      run.disabled = true;
      // Interrupt the context the cell runs in; leaving the page cancels
      // the run (the server then interrupts it), so no cell runs on unseen.
      const cid = ctx.value || `ctx_default_${lang.value}`;
      const cancel = new AbortController();
      const abort = () => cancel.abort();
      onLeave(abort);
      stop.onclick = async () => {
        try {
          await api("POST", `/v1/sandboxes/${id}/contexts/${cid}/interrupt`);
          state.textContent = "interrupting…";
        } catch (e) {
          // A context's first cell waits for its kernel to start (seconds,
          // for bash, R or Java), and until it runs no interrupt reaches it.
          if (e.status === 409 && /still starting/.test(e.message)) state.textContent = "the kernel is still starting: the interrupt cannot reach it yet, and the cell runs once it is up (interrupt it then)";
          else say(`Interrupt failed: ${e.message}`, true);
        }
      };
      stop.hidden = false;
      out.replaceChildren();
      state.textContent = "running…";
      let stdout = null, stderr = null;
      const append = (cls, text) => {
        let pre = cls === "stdout" ? stdout : stderr;
        if (!pre) { pre = h("pre", { class: cls }); out.append(pre); if (cls === "stdout") stdout = pre; else stderr = pre; }
        pre.textContent += text;
      };
      const body = { code: src.value };
      let path = `/v1/sandboxes/${id}/run_code`;
      if (ctx.value) path = `/v1/sandboxes/${id}/contexts/${ctx.value}/run`; else body.language = lang.value;
      try {
        await stream(path, body, (ev) => {
          if (ev.type === "stdout" || ev.type === "stderr") append(ev.type, ev.data);
          else if (ev.type === "result") { out.append(result(ev.result)); stdout = stderr = null; }
          else if (ev.type === "error" && ev.error?.traceback !== undefined) out.append(execError(ev.error));
          else if (ev.type === "error") out.append(h("div", { class: "error", role: "alert", text: `${ev.error.code}: ${ev.error.message}` }));
          else if (ev.type === "execution") state.textContent = `done in ${ev.execution.duration_ms} ms` + (ev.execution.error ? " with an error" : "");
        }, cancel.signal);
      } catch (e) {
        if (cancel.signal.aborted) return; // the page was left
        out.append(h("div", { class: "error", role: "alert", text: `${e.code || "error"}: ${e.message}` }));
        state.textContent = "failed";
      } finally { run.disabled = false; stop.hidden = true; cleanups = cleanups.filter((f) => f !== abort); }
    };
    run.addEventListener("click", go);
    src.addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey || e.shiftKey)) { e.preventDefault(); go(); } });
    cells.append(h("div", { class: "cell" }, src, h("div", { class: "toolbar" }, run, stop, state, h("span", { class: "muted", text: "Shift+Enter or Ctrl+Enter runs" })), out));
    return src;
  };
  panel.append(h("div", { class: "toolbar" },
    h("label", { for: "nb-language", text: "Language" }), lang,
    h("label", { for: "nb-context", text: "Context" }), ctx, newCtx,
    h("button", { type: "button", text: "Add cell", onclick: () => addCell().focus() })), cells);
  addCell("import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.DataFrame({'x': [1, 2, 3, 4], 'y': [1, 4, 9, 16]})\nplt.plot(df.x, df.y)\nplt.show()\ndf");
  return panel;
}

function historyPanel(id) {
  const panel = h("section");
  const list = h("div", { "aria-live": "polite" });
  const load = async () => {
    const r = await act("Loading history", () => api("GET", `/v1/sandboxes/${id}/history`));
    if (!r) return;
    list.replaceChildren(...(r.history.length ? r.history.map((e) => {
      const what = e.kind === "exec" ? e.command : e.kind === "code" ? e.code : "interactive terminal";
      const outcome = e.running ? "running" : e.failure ? "failed: " + e.failure : e.error ? `${e.error.name}: ${e.error.value}` : e.exit_code !== undefined ? `exit ${e.exit_code}` : e.background ? `started in the background as pid ${e.pid}` : e.kind === "terminal" ? "closed" : "ok";
      return h("article", { class: "history-entry", "data-kind": e.kind },
        h("header", {}, h("strong", { text: e.kind }), h("span", { class: "muted", text: `${new Date(e.started_at).toLocaleTimeString()} · ${e.duration_ms} ms · ${outcome}` }),
          e.language ? h("span", { class: "tag", text: e.language }) : null, ...(e.results || []).map((k) => h("span", { class: "tag", text: k }))),
        h("pre", { class: "mono", text: what }),
        e.stdout ? h("details", { open: e.kind === "terminal" ? true : undefined }, h("summary", { text: e.kind === "terminal" ? "transcript" : "stdout" }), h("pre", { class: "out", text: e.stdout })) : null,
        e.stderr ? h("details", {}, h("summary", { text: "stderr" }), h("pre", { text: e.stderr })) : null,
        e.text ? h("pre", { text: e.text }) : null,
        e.error?.traceback ? h("details", {}, h("summary", { text: "traceback" }), h("pre", { text: e.error.traceback })) : null,
        e.output_truncated ? h("p", { class: "muted truncated", text: "Output cut: the history keeps the first 64 KiB of each output." }) : null);
    }) : [h("p", { class: "muted", text: "Nothing was run in this sandbox through the API yet." })]));
  };
  panel.append(h("div", { class: "toolbar" }, h("button", { type: "button", text: "Refresh history", onclick: load })), list);
  panel.addEventListener("shown", load);
  return panel;
}

// shownName is a file name as the table shows it: quoted when it has
// spaces at either end or characters that print as nothing or as
// something else.
function shownName(name) {
  return /^\s|\s$|[\x00-\x1f\x7f\u2028\u2029]/.test(name) ? JSON.stringify(name) : name;
}

function filesPanel(id, known) {
  const panel = h("section");
  const dir = h("input", { id: "files-path", value: "/home/user", size: 40 });
  const tbody = h("tbody");
  const join = (d, n) => (d.endsWith("/") ? d : d + "/") + n;
  let listed = null; // the folder the table shows, where uploads go
  const load = async () => {
    const path = dir.value;
    const r = await act("Listing files", () => api("GET", `/v1/sandboxes/${id}/files/list?path=${enc(path)}`));
    if (!r) {
      // The table shows no folder rather than the last one under this path.
      listed = null;
      tbody.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "muted", text: `Could not list ${path}.` })));
      return;
    }
    listed = path;
    const parent = path.replace(/\/[^/]+\/?$/, "") || "/";
    const rows = r.files.sort((a, b) => (a.type === "dir") === (b.type === "dir") ? a.name.localeCompare(b.name) : a.type === "dir" ? -1 : 1).map((f) => h("tr", { "data-name": f.name },
      // JSON quoting shows what a name holds that the eye would not: a
      // leading space, a line break.
      h("td", {}, f.type === "dir" ? h("button", { type: "button", class: "link", text: shownName(f.name) + "/", "aria-label": `Open folder ${f.name}`, onclick: () => { dir.value = f.path; load(); } }) : h("span", { class: "mono", text: shownName(f.name) })),
      h("td", { text: f.type }), h("td", { text: f.type === "file" ? bytes(f.size) : "" }), h("td", { text: new Date(f.mod_time).toLocaleString() }),
      h("td", {}, h("div", { class: "actions" },
        f.type === "file" ? h("button", { type: "button", text: "Download", "aria-label": `Download ${f.name}`, onclick: () => download(f) }) : null,
        h("button", { type: "button", class: "danger", text: "Delete", "aria-label": `Delete ${f.name}`, onclick: () => act("Delete", async () => {
          if (!confirm(`Delete ${f.path}${f.type === "dir" ? " and everything in it" : ""}?`)) return;
          await api("DELETE", `/v1/sandboxes/${id}/files?path=${enc(f.path)}&recursive=${f.type === "dir" ? 1 : 0}`); say(`Deleted ${f.path}`); load();
        }) })))));
    if (path !== "/") rows.unshift(h("tr", {}, h("td", { colspan: 5 }, h("button", { type: "button", text: "../ (up)", "aria-label": "Up one folder", onclick: () => { dir.value = parent; load(); } }))));
    tbody.replaceChildren(...rows);
  };
  const download = (f) => act("Download", async () => {
    const res = await api("GET", `/v1/sandboxes/${id}/files?path=${enc(f.path)}`, undefined, { raw: true });
    const url = URL.createObjectURL(await res.blob());
    const a = h("a", { href: url, download: f.name });
    document.body.append(a); a.click(); a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  });
  const upload = async (files) => {
    for (const file of files) {
      await act("Upload", async () => {
        if (listed === null) throw new Error("list a folder first: uploads go to the folder shown");
        await api("PUT", `/v1/sandboxes/${id}/files?path=${enc(join(listed, file.name))}`, file); say(`Uploaded ${file.name} to ${listed}`);
      });
    }
    if (listed !== null) dir.value = listed;
    load();
  };
  const picker = h("input", { id: "files-upload", type: "file", multiple: true, onchange: () => upload(picker.files) });
  const zone = h("div", { class: "dropzone", id: "dropzone", tabindex: "0", role: "button", "aria-label": "Drop files here to upload them to the folder shown, or press Enter to choose files" }, "Drop files here to upload them, or press Enter to choose");
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => { e.preventDefault(); zone.classList.remove("over"); upload(e.dataTransfer.files); });
  zone.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); picker.click(); } });
  zone.addEventListener("click", () => picker.click());
  dir.addEventListener("keydown", (e) => { if (e.key === "Enter") load(); });
  panel.append(h("div", { class: "toolbar" }, h("label", { for: "files-path", text: "Folder" }), dir, h("button", { type: "button", text: "List", onclick: load }),
    h("label", { for: "files-upload", text: "Upload files" }), picker), zone,
  h("table", { "aria-label": "Files" }, h("thead", {}, h("tr", {}, ["Name", "Type", "Size", "Modified", "Actions"].map((t) => h("th", { scope: "col", text: t })))), tbody));
  // Opening the tab lists the folder of a running sandbox only: a listing
  // resumes a paused one, which is the user's to ask for (List).
  panel.addEventListener("shown", async () => {
    await known.looked;
    if (known.state === "running" || known.state === "") { load(); return; } // "": the look failed
    listed = null;
    tbody.replaceChildren(h("tr", {}, h("td", { colspan: 5, class: "muted", text: known.state === "paused" ? "The sandbox is paused: List resumes it to show its files." : "The sandbox is not running." })));
  });
  return panel;
}

function terminalPanel(id) {
  const panel = h("section");
  const pre = h("pre", { class: "terminal", id: "terminal", tabindex: "0", role: "textbox", "aria-multiline": "true", "aria-label": "Terminal: keys typed here go to the sandbox's shell; Shift+Escape leaves it" });
  const state = h("span", { class: "muted", id: "terminal-state", role: "status", text: "not connected" });
  const term = new Terminal(pre, (s) => { state.textContent = s; connect.textContent = term.connected ? "Disconnect" : "Connect"; });
  pre.addEventListener("leave", () => connect.focus());
  const connect = h("button", { type: "button", id: "terminal-connect", text: "Connect", onclick: () => { if (term.connected) term.close(); else term.connect(id); connect.textContent = term.connected ? "Disconnect" : "Connect"; } });
  panel.append(h("div", { class: "toolbar" }, connect, state, h("span", { class: "muted", text: "An open terminal counts as work in progress: disconnect before a snapshot, fork or pause." })), pre);
  onLeave(() => term.close());
  window.pandastackTerminal = term; // for tests and the devtools console
  return panel;
}

function metricsPanel(id, known) {
  const panel = h("section");
  const cpu = h("canvas", { width: 420, height: 160, role: "img", "aria-label": "CPU use over the last two minutes" });
  const mem = h("canvas", { width: 420, height: 160, role: "img", "aria-label": "Memory use over the last two minutes" });
  const cpuNow = h("figcaption"), memNow = h("figcaption"), diskNow = h("p", { class: "muted" });
  const samples = [];
  const draw = (canvas, values, max, color) => {
    const c = canvas.getContext("2d"), W = canvas.width, H = canvas.height;
    c.clearRect(0, 0, W, H);
    c.strokeStyle = "#d7dde3"; c.beginPath(); for (let i = 1; i < 4; i++) { c.moveTo(0, (H * i) / 4); c.lineTo(W, (H * i) / 4); } c.stroke();
    c.strokeStyle = color; c.lineWidth = 2; c.beginPath();
    values.forEach((v, i) => { const x = (W * i) / 59, y = H - (H * Math.min(v, max)) / max; i ? c.lineTo(x, y) : c.moveTo(x, y); });
    c.stroke();
  };
  let prev = null;
  const poll = async () => {
    if (panel.hidden) return;
    if (known.state !== "running") {
      cpuNow.textContent = known.state === "paused" ? "CPU: none, the sandbox is paused (saved to disk)" : "CPU: not running";
      memNow.textContent = known.state === "paused" ? "Memory: none while paused" : "";
      diskNow.textContent = "";
      return;
    }
    const st = await api("GET", `/v1/sandboxes/${id}/stats`).catch(() => null);
    if (!st) { cpuNow.textContent = "CPU: not running"; return; }
    const at = Date.parse(st.sampled_at);
    // The count starts again at a resume: a drop is no sample.
    const pct = prev && at > prev.at && st.cpu_seconds >= prev.s ? (100 * (st.cpu_seconds - prev.s)) / ((at - prev.at) / 1000) : 0;
    prev = { s: st.cpu_seconds, at };
    samples.push({ pct, mem: st.memory_bytes });
    if (samples.length > 60) samples.shift();
    draw(cpu, samples.map((x) => x.pct), 100 * st.cpu_limit, "#1f6feb");
    draw(mem, samples.map((x) => x.mem), st.memory_limit_bytes, "#107c41");
    cpuNow.textContent = `CPU: ${pct.toFixed(1)} % (limit ${st.cpu_limit} CPU = ${100 * st.cpu_limit} %)`;
    memNow.textContent = `Memory: ${bytes(st.memory_bytes)} of ${bytes(st.memory_limit_bytes)}`;
    // Absent from an agent of an older build (a restore of an old snapshot).
    diskNow.textContent = st.disk_limit_bytes ? `Disk: ${bytes(st.disk_bytes)} of ${bytes(st.disk_limit_bytes)} used` : "";
  };
  panel.append(h("div", { class: "charts" }, h("figure", {}, cpu, cpuNow), h("figure", {}, mem, memNow)), diskNow);
  panel.addEventListener("shown", poll);
  const t = setInterval(poll, 2000);
  onLeave(() => clearInterval(t));
  return panel;
}

// ---- snapshots ----

async function snapshotsPage() {
  const tbody = h("tbody");
  const tree = h("div", { class: "tree", id: "lineage" });
  const total = h("p", { class: "muted" });
  page("Snapshots", total, h("table", { "aria-label": "Snapshots" },
    h("thead", {}, h("tr", {}, ["Snapshot", "Of sandbox", "Template", "Size", "Taken", "Metadata", "Actions"].map((t) => h("th", { scope: "col", text: t })))), tbody),
  h("h2", { text: "Lineage: which sandbox came from which snapshot or fork" }), tree);
  const load = async () => {
    // Every live sandbox, and the newest stopped records (kept a day; an
    // older one shows as gone).
    const [snaps, live, stopped, lin] = await Promise.all([api("GET", "/v1/snapshots"), api("GET", "/v1/sandboxes"), api("GET", `/v1/sandboxes?state=stopped&order=newest&limit=${LIST_PAGE}`), api("GET", "/v1/lineage")]).catch((e) => { say("Loading snapshots failed: " + e.message, true); return []; });
    if (!snaps) return;
    const sbx = { sandboxes: [...live.sandboxes, ...stopped.sandboxes] };
    total.textContent = `${snaps.snapshots.length} snapshots, ${bytes(snaps.total_size_bytes)} in all`;
    tbody.replaceChildren(...snaps.snapshots.slice().reverse().map((sn) => h("tr", { "data-id": sn.id },
      h("td", { class: "mono", text: sn.id }), h("td", {}, h("a", { href: `#/sandboxes/${sn.sandbox_id}`, class: "mono", text: sn.sandbox_id })), h("td", { text: sn.template }),
      h("td", { text: bytes(sn.size_bytes) }), h("td", { text: new Date(sn.created_at).toLocaleString() }), h("td", {}, metadataTags(sn.metadata)),
      h("td", {}, h("div", { class: "actions" },
        h("button", { type: "button", text: "New sandbox", "aria-label": `Create a sandbox from ${sn.id}`, onclick: () => act("Restore", async () => { const s = await api("POST", "/v1/sandboxes", { snapshot_id: sn.id, ttl_seconds: 1800 }); say(`Created ${s.id} from ${sn.id}`); load(); }) }),
        h("button", { type: "button", class: "danger", text: "Delete", "aria-label": `Delete ${sn.id}`, onclick: () => act("Delete", async () => { if (!confirm(`Delete snapshot ${sn.id}?`)) return; await api("DELETE", `/v1/snapshots/${sn.id}`); load(); }) }))))));
    // The tree: snapshot → the sandbox it was taken of; sandbox → its snapshot or fork parent.
    const parent = new Map(), label = new Map();
    for (const s of sbx.sandboxes) label.set(s.id, `${s.id} · ${s.state} · ${s.template}`);
    for (const sn of snaps.snapshots) { parent.set(sn.id, sn.sandbox_id); label.set(sn.id, `${sn.id} · snapshot · ${bytes(sn.size_bytes)}`); }
    for (const o of lin.origins) { parent.set(o.sandbox_id, o.from); if (!label.has(o.sandbox_id)) label.set(o.sandbox_id, `${o.sandbox_id} · killed`); }
    const kids = new Map();
    for (const [c, p] of parent) { if (!label.has(p)) label.set(p, `${p} · gone`); if (!kids.has(p)) kids.set(p, []); kids.get(p).push(c); }
    const node = (id, how) => h("li", { "data-node": id }, h("span", { class: id.startsWith("snap_") ? "mono" : "mono" }, how ? h("span", { class: "tag", text: how }) : null, " ", id.startsWith("sbx_") ? h("a", { href: `#/sandboxes/${id}`, text: label.get(id) }) : label.get(id)),
      kids.has(id) ? h("ul", {}, kids.get(id).map((k) => node(k, k.startsWith("snap_") ? "snapshot" : id.startsWith("sbx_") ? "fork" : "restored"))) : null);
    const roots = [...kids.keys()].filter((id) => !parent.has(id));
    tree.replaceChildren(roots.length ? h("ul", {}, roots.map((r) => node(r))) : h("p", { class: "muted", text: "No snapshots or forks yet." }));
  };
  await load();
}

// ---- templates and keys ----

async function templatesPage() {
  const r = await act("Listing templates", () => api("GET", "/v1/templates"));
  page("Templates", h("table", { "aria-label": "Templates" },
    h("thead", {}, h("tr", {}, ["Template", "Description", "CPU", "Memory", "Size", "Built", "Warm", "Pool"].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, (r?.templates || []).map((t) => h("tr", {},
      h("td", { class: "mono", text: t.name }), h("td", { text: t.description || "" }), h("td", { text: t.cpu }), h("td", { text: t.memory_mb + " MiB" }),
      h("td", { text: bytes(t.size_bytes) }), h("td", { text: `${new Date(t.built_at).toLocaleString()} (${t.build_seconds.toFixed(0)} s)` }),
      h("td", { text: t.warm ? "yes" : t.warm_error ? "no: its warm-up failed: " + t.warm_error : "no" }), h("td", { text: t.pool ? `${t.pool.ready} of ${t.pool.size} ready (${bytes(t.pool.pss_bytes)})` : "none" }))))));
}

async function keysPage() {
  const tbody = h("tbody");
  const name = h("input", { id: "key-name", placeholder: "e.g. ci, agent-42" });
  const scope = h("select", { id: "key-scope" },
    h("option", { value: "sandboxes", text: "sandboxes: everything but the keys (for agents, CI)" }),
    h("option", { value: "all", text: "all: the project's keys too" }));
  const shown = h("div", { "aria-live": "polite" });
  const table = h("table", { "aria-label": "API keys" }, h("thead", {}, h("tr", {}, ["Key", "Name", "Starts with", "Scope", "Created", "Status", "Actions"].map((t) => h("th", { scope: "col", text: t })))), tbody);
  const listing = h("div", {}, table);
  const load = async () => {
    let r;
    try { r = await api("GET", "/v1/api-keys"); } catch (e) {
      // Said in the page, not in a passing message: an empty table and a
      // live form would look like a project with no keys (a key of scope
      // "sandboxes" gets 403 here).
      form.hidden = true;
      listing.replaceChildren(h("p", { class: "error", role: "alert", text: `Cannot list this project's keys: ${e.message}` }));
      return;
    }
    form.hidden = false;
    if (listing.firstChild !== table) listing.replaceChildren(table);
    tbody.replaceChildren(...(r.api_keys || []).map((k) => h("tr", { "data-id": k.id },
      h("td", { class: "mono", text: k.id }), h("td", { text: k.name || "" }), h("td", { class: "mono", text: k.prefix + "…" }), h("td", { text: k.scope || "all" }),
      h("td", { text: new Date(k.created_at).toLocaleString() }), h("td", { text: k.revoked_at ? "revoked " + new Date(k.revoked_at).toLocaleString() : "active" }),
      h("td", {}, k.revoked_at ? null : h("button", { type: "button", class: "danger", text: "Revoke", "aria-label": `Revoke ${k.id}`, onclick: () => act("Revoke", async () => {
        if (!confirm(`Revoke ${k.id} (${k.prefix}…)? Anything using it stops working.`)) return;
        await api("DELETE", `/v1/api-keys/${k.id}`); say(`Revoked ${k.id}`); load();
      }) })))));
  };
  const form = h("form", { class: "inline", "aria-label": "Create an API key" }, h("label", { for: "key-name", text: "Name" }), name,
    h("label", { for: "key-scope", text: "May use" }), scope, h("button", { type: "submit", class: "primary", text: "Create key" }));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act("Create key", async () => {
      const k = await api("POST", "/v1/api-keys", { name: name.value, scope: scope.value });
      shown.replaceChildren(h("div", { class: "secret", role: "alert" }, h("p", { text: `Key ${k.id} created. Copy it now: it is shown only once.` }), h("code", { id: "new-secret", text: k.secret })));
      name.value = "";
      load();
    });
  });
  form.hidden = true; // until the list shows this key may manage keys
  page("API keys", form, shown, listing);
  load();
}

// ---- routing ----

function leave() { for (const f of cleanups) f(); cleanups = []; }

function route() {
  leave();
  if (!session.key) { signIn(); return; }
  document.getElementById("nav").hidden = false;
  const path = location.hash.replace(/^#/, "") || "/sandboxes";
  for (const a of document.querySelectorAll("nav a")) a.toggleAttribute("aria-current", path.startsWith(a.getAttribute("href").slice(1)));
  for (const a of document.querySelectorAll("nav a")) if (a.hasAttribute("aria-current")) a.setAttribute("aria-current", "page");
  let m;
  if ((m = /^\/sandboxes\/([\w-]+)$/.exec(path))) sandboxPage(m[1]);
  else if (path === "/snapshots") snapshotsPage();
  else if (path === "/templates") templatesPage();
  else if (path === "/keys") keysPage();
  else sandboxesPage();
  main.focus();
}

window.addEventListener("hashchange", route);
route();
