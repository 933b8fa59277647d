// Small DOM helpers and the rendering of code outputs. Output comes from
// code run in a sandbox: it is never inserted as HTML into this page except
// tables rebuilt element by element (DataFrames); other HTML goes into an
// iframe with every sandbox restriction on.

// h builds an element: h("button", {type: "button", onclick}, "text", child…)
export function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) if (kid !== undefined && kid !== null && kid !== false) el.append(kid);
  return el;
}

export function bytes(n) {
  if (n === undefined || n === null) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

export function duration(ms) {
  if (ms < 0) return "expired";
  const s = Math.round(ms / 1000);
  if (s < 60) return s + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
}

// tableFromHTML rebuilds html from its text alone when it is one table (a
// DataFrame), with at most some text beside it ("100 rows × 1 columns"):
// each cell keeps its text, not its markup. Anything else (headings, a
// second table, images) returns null, for the sandboxed iframe, so that
// nothing is dropped.
export function tableFromHTML(html) {
  const doc = new DOMParser().parseFromString(html, "text/html");
  for (const s of doc.querySelectorAll("style, script")) s.remove();
  const tables = doc.querySelectorAll("table");
  if (tables.length !== 1) return null;
  const src = tables[0];
  if (src.querySelector("img, svg, iframe, video, audio, canvas, object")) return null;
  const beside = [...doc.body.querySelectorAll("*")].filter((e) => !src.contains(e) && !e.contains(src));
  if (beside.some((e) => !["p", "span", "div", "br", "small"].includes(e.tagName.toLowerCase()))) return null;
  const structure = ["table", "thead", "tbody", "tfoot", "tr"];
  const copy = (node) => {
    const tag = node.tagName.toLowerCase();
    if (!structure.includes(tag) && !["th", "td", "caption"].includes(tag)) return null;
    const el = document.createElement(tag);
    for (const a of ["colspan", "rowspan"]) if (node.hasAttribute(a)) el.setAttribute(a, String(parseInt(node.getAttribute(a), 10) || 1));
    if (structure.includes(tag)) for (const kid of node.children) { const c = copy(kid); if (c) el.append(c); }
    else el.textContent = node.textContent;
    return el;
  };
  const t = copy(src);
  t.className = "df";
  src.remove();
  const rest = doc.body.textContent.trim();
  return rest ? h("div", {}, t, h("p", { class: "muted", text: rest })) : t;
}

function image(mime, b64, alt) {
  return h("img", { src: `data:${mime};base64,${b64}`, alt });
}

// result renders one rich output of a cell.
export function result(r) {
  const box = h("div", { class: "result" });
  if (r.png) box.append(image("image/png", r.png, "chart (PNG) produced by the cell"));
  else if (r.jpeg) box.append(image("image/jpeg", r.jpeg, "image (JPEG) produced by the cell"));
  else if (r.svg) box.append(h("img", { src: "data:image/svg+xml;base64," + btoa(unescape(encodeURIComponent(r.svg))), alt: "chart (SVG) produced by the cell" }));
  else if (r.html) {
    const t = tableFromHTML(r.html);
    if (t) box.append(t);
    else box.append(h("iframe", { sandbox: "", srcdoc: r.html, title: "HTML output of the cell" }));
  } else if (r.markdown) box.append(h("pre", { text: r.markdown }));
  else if (r.latex) box.append(h("pre", { text: r.latex }));
  else if (r.json !== undefined) box.append(h("pre", { text: JSON.stringify(r.json, null, 2) }));
  else if (r.text) box.append(h("pre", { text: r.text }));
  return box;
}

export function execError(err) {
  return h("div", { class: "error", role: "alert" },
    h("strong", { text: `${err.name}: ${err.value}` }),
    err.traceback ? h("pre", { text: err.traceback }) : null);
}
