// The console's client of the public REST API. The key lives only in this
// page's memory, never in storage: pages a sandbox serves through the port
// proxy share the console's origin, and could read any web storage of it.
let key = "";

export const session = {
  get key() { return key; },
  set key(v) { key = v || ""; },
};

export class APIError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function failure(res) {
  let code = "http_" + res.status, message = res.statusText;
  try { const b = await res.json(); code = b.error.code; message = b.error.message; } catch { /* not JSON */ }
  if (res.status === 401) window.dispatchEvent(new CustomEvent("pandastack:unauthorized", { detail: message }));
  return new APIError(res.status, code, message);
}

// reachError says what a request that got no answer at all met: the
// browser's own words ("Failed to fetch") tell a user nothing.
function reachError(e) {
  if (e && e.name === "TimeoutError") return new APIError(0, "timeout", "the server did not answer within 30 s; it may be overloaded or stopped");
  if (e && e.name === "AbortError") return e;
  return new APIError(0, "connection_error", "cannot reach the PandaStack server: is pandastack serve running, and reachable from this browser?");
}

// anySignal aborts when any of signals does (AbortSignal.any where the
// browser has it: Chrome 116, Firefox 124, Safari 17.4).
function anySignal(signals) {
  if (signals.length <= 1) return signals[0];
  if (typeof AbortSignal.any === "function") return AbortSignal.any(signals);
  const c = new AbortController();
  for (const s of signals) {
    if (s.aborted) { c.abort(s.reason); break; }
    s.addEventListener("abort", () => c.abort(s.reason), { once: true });
  }
  return c.signal;
}

// api calls the API and returns the decoded JSON (or null for 204).
export async function api(method, path, body, opts = {}) {
  const headers = { Authorization: "Bearer " + session.key, ...(opts.headers || {}) };
  let payload = body;
  if (body !== undefined && !(body instanceof Blob) && !(body instanceof ArrayBuffer)) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  // A server that stops answering is said so, not waited for: reads give
  // up after 30 s (downloads and actions that do work may take longer).
  const timed = method === "GET" && !opts.raw && typeof AbortSignal.timeout === "function";
  const signal = anySignal([opts.signal, timed ? AbortSignal.timeout(30000) : null].filter(Boolean));
  let res;
  try {
    res = await fetch(path, { method, headers, body: payload, signal });
  } catch (e) {
    throw reachError(e);
  }
  if (!res.ok) throw await failure(res);
  if (opts.raw) return res;
  if (res.status === 204) return null;
  return res.json();
}

// stream POSTs body and calls onEvent for each NDJSON line as it arrives.
export async function stream(path, body, onEvent, signal) {
  let res;
  try {
    res = await fetch(path, {
      method: "POST", signal,
      headers: { Authorization: "Bearer " + session.key, "Content-Type": "application/json", Accept: "application/x-ndjson" },
      body: JSON.stringify(body),
    });
  } catch (e) {
    throw reachError(e);
  }
  if (!res.ok) throw await failure(res);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, i).trim();
      buf = buf.slice(i + 1);
      if (line) onEvent(JSON.parse(line));
    }
  }
  if (buf.trim()) onEvent(JSON.parse(buf));
}

// ptySocket opens the terminal WebSocket; the key rides as a subprotocol,
// since a browser cannot set headers on a WebSocket.
export function ptySocket(id, cols, rows) {
  const proto = location.protocol === "https:" ? "wss:" : "ws:";
  const ws = new WebSocket(`${proto}//${location.host}/v1/sandboxes/${encodeURIComponent(id)}/pty?cols=${cols}&rows=${rows}`,
    ["pandastack.pty", "bearer." + session.key]);
  ws.binaryType = "arraybuffer";
  return ws;
}

export const enc = encodeURIComponent;
