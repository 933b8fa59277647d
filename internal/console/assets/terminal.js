// A small terminal: enough of a VT100 screen for a shell and readline
// (printable text, CR, LF, backspace, tab, erase in line and display,
// cursor moves), rendered into a <pre>. Keys typed while it has focus go
// to the sandbox over the PTY WebSocket.
import { api, ptySocket } from "./api.js";

// What write() reads at a given index (sticky): an escape sequence, and a
// run of printable characters.
const escape = /\x1b(\[[0-9;?<=>!]*[ -\/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\^_]|[()][0-9A-Za-z])/y;
const printable = /[^\x00-\x1f\x7f]+/y;

// altAsMeta tells Alt+key meant as Meta (Alt+b) from Alt that makes a
// character of its own (Option+L is @ on a German Mac): only a key that
// still gives its own letter or digit is Meta.
function altAsMeta(e) {
  const m = /^(?:Key([A-Z])|Digit([0-9]))$/.exec(e.code || "");
  return !!m && e.key.toUpperCase() === (m[1] || m[2]);
}

export class Terminal {
  constructor(pre, onStatus) {
    this.pre = pre;
    this.onStatus = onStatus;
    this.lines = [""];
    this.row = 0; this.col = 0;
    this.pending = "";
    this.dec = new TextDecoder();
    this.ws = null;
    this.queued = false;
    // Editable, so that text that comes without a key of its own (an input
    // method's, an emoji picker's, a phone keyboard's, dictation) arrives
    // as input events; what the browser would insert is sent instead, and
    // the next drawing replaces what a composition left on the screen.
    pre.contentEditable = "true";
    pre.spellcheck = false;
    pre.setAttribute("autocapitalize", "off");
    pre.setAttribute("autocorrect", "off");
    pre.addEventListener("keydown", (e) => this.key(e));
    pre.addEventListener("paste", (e) => { e.preventDefault(); this.send(e.clipboardData.getData("text")); });
    pre.addEventListener("beforeinput", (e) => {
      if (e.inputType === "insertCompositionText") return; // sent whole at compositionend
      e.preventDefault();
      if ((e.inputType === "insertText" || e.inputType === "insertReplacementText") && e.data) this.send(e.data);
      // A phone keyboard's keys come without a keydown naming them.
      else if (e.inputType === "deleteContentBackward") this.send("\x7f");
      else if (e.inputType === "insertParagraph" || e.inputType === "insertLineBreak") this.send("\r");
    });
    pre.addEventListener("compositionend", (e) => { if (e.data) this.send(e.data); this.queueRender(); });
    pre.addEventListener("drop", (e) => e.preventDefault());
  }

  get size() {
    const probe = document.createElement("span");
    probe.textContent = "M";
    this.pre.appendChild(probe);
    const w = probe.getBoundingClientRect().width || 8, h = probe.getBoundingClientRect().height || 16;
    probe.remove();
    const style = getComputedStyle(this.pre);
    const inner = this.pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return { cols: Math.max(20, Math.floor(inner / w) - 1), rows: Math.max(5, Math.floor((this.pre.clientHeight - 16) / h)) };
  }

  connect(sandboxID) {
    this.close();
    const { cols, rows } = this.size;
    this.cols = cols; this.rows = rows; // the size the shell starts with
    const ws = ptySocket(sandboxID, cols, rows);
    this.ws = ws;
    let opened = false;
    ws.onopen = () => { opened = true; this.onStatus("connected"); this.pre.focus(); this.resize(); };
    ws.onmessage = (ev) => {
      if (typeof ev.data === "string") {
        const m = JSON.parse(ev.data);
        if (m.type === "exit") this.onStatus(`the shell exited with status ${m.exit_code}`);
        return;
      }
      this.write(this.dec.decode(new Uint8Array(ev.data), { stream: true }));
    };
    ws.onclose = (ev) => {
      if (this.ws !== ws) return;
      this.ws = null;
      // A connection that never opened keeps the error's message: "closed"
      // says less.
      if (opened || ev.reason) this.onStatus(ev.reason ? "closed: " + ev.reason : "closed");
    };
    ws.onerror = () => { if (!opened) this.refused(sandboxID); };
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(this.pre);
  }

  // refused says why a connection never opened: a browser keeps the
  // handshake's answer from the page, so the sandbox is looked at instead
  // (a revoked key there signs out, as any other request's does).
  async refused(sandboxID) {
    this.onStatus("could not connect; looking at the sandbox…");
    try {
      const s = await api("GET", `/v1/sandboxes/${encodeURIComponent(sandboxID)}`);
      this.onStatus(s.state === "running"
        ? "could not connect: a snapshot, fork or pause of the sandbox may be under way; try again"
        : `could not connect: the sandbox is ${s.state}${s.state === "paused" ? " (resume it first)" : ""}`);
    } catch (e) {
      this.onStatus("could not connect: " + (e.message || e));
    }
  }

  resize() {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return;
    const { cols, rows } = this.size;
    if (cols === this.cols && rows === this.rows) return;
    this.cols = cols; this.rows = rows;
    this.ws.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  close() {
    if (this.observer) this.observer.disconnect();
    if (this.ws) { const ws = this.ws; this.ws = null; ws.close(); this.onStatus("closed"); }
  }

  get connected() { return !!this.ws; }

  send(text) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(new TextEncoder().encode(text));
  }

  key(e) {
    if (e.isComposing || e.keyCode === 229) return; // an input method's: its text comes at compositionend
    if (e.key === "Tab" && !this.connected) return; // keep Tab for moving focus when idle
    if (e.key === "Escape" && e.shiftKey) { // Shift+Escape hands focus back to the page
      e.preventDefault();
      this.pre.dispatchEvent(new CustomEvent("leave", { bubbles: true }));
      return;
    }
    const seq = {
      Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", ArrowUp: "\x1b[A", ArrowDown: "\x1b[B",
      ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D", Home: "\x1b[H", End: "\x1b[F", Delete: "\x1b[3~",
    }[e.key];
    // One character, counted in code points: an emoji is two UTF-16 units.
    const char = [...e.key].length === 1 ? e.key : "";
    // Ctrl+V and Ctrl+Shift+V paste, Ctrl+Shift+C copies: left to the
    // browser (the paste comes back as a paste event).
    const clipboard = e.ctrlKey && !e.altKey && (e.key === "v" || e.key === "V" || (e.shiftKey && (e.key === "c" || e.key === "C")));
    let out = seq;
    if (!out && clipboard) {
      return;
    } else if (!out && char && e.getModifierState && e.getModifierState("AltGraph")) {
      out = char; // AltGr (Windows reports Ctrl+Alt): the character it makes, such as @ or {
    } else if (!out && e.ctrlKey && !e.altKey && char) {
      const c = char.toUpperCase().charCodeAt(0);
      if (c >= 64 && c <= 95) out = String.fromCharCode(c - 64);
    } else if (!out && e.altKey && !e.ctrlKey && !e.metaKey && char && altAsMeta(e)) {
      out = "\x1b" + char; // Alt as Meta: readline's Alt+b, Alt+f
    } else if (!out && !e.ctrlKey && !e.metaKey && char) {
      out = char;
    }
    if (out) { e.preventDefault(); this.send(out); }
  }

  // write interprets terminal output.
  write(s) {
    s = this.pending + s;
    this.pending = "";
    let i = 0;
    while (i < s.length) {
      const ch = s[i];
      if (ch === "\x1b") {
        escape.lastIndex = i; // sticky: matched where it stands, nothing copied
        const m = escape.exec(s);
        if (!m) {
          if (s.length - i < 64) { this.pending = s.slice(i); break; } // an escape cut in two: wait for the rest
          i++; continue;
        }
        if (m[1][0] === "[") this.csi(m[1]);
        i += m[0].length;
        continue;
      }
      if (ch === "\r") this.col = 0;
      else if (ch === "\n") { this.row++; if (this.row >= this.lines.length) this.lines.push(""); }
      else if (ch === "\b") this.col = Math.max(0, this.col - 1);
      else if (ch === "\t") this.put(" ".repeat(8 - (this.col % 8)));
      else if (ch === "\x07") { /* bell */ }
      else if (ch >= " " && ch !== "\x7f") {
        // A run of printable text at once: a long line is not rebuilt
        // for each of its characters.
        printable.lastIndex = i;
        const run = printable.exec(s)[0];
        this.put(run);
        i += run.length;
        continue;
      }
      i++;
    }
    if (this.lines.length > 2000) { const drop = this.lines.length - 2000; this.lines.splice(0, drop); this.row -= drop; }
    // Drawn once per frame, however many messages came: drawing the
    // scrollback for each one froze the page on long output (seq 1 20000
    // took 14 s to show).
    this.queueRender();
  }

  queueRender() {
    if (!this.queued) {
      this.queued = true;
      requestAnimationFrame(() => { this.queued = false; this.render(); });
    }
  }

  put(text) {
    let line = this.lines[this.row] || "";
    if (line.length < this.col) line += " ".repeat(this.col - line.length);
    this.lines[this.row] = line.slice(0, this.col) + text + line.slice(this.col + text.length);
    this.col += text.length;
  }

  csi(seq) {
    const final = seq[seq.length - 1];
    const args = seq.slice(1, -1).replace(/^[?<=>!]/, "").split(";").map((x) => parseInt(x, 10));
    // Moves stay on the screen (rows × cols), as a VT100's do: the counts
    // come from the sandbox, and one as large as 999999999 must not make
    // the page allocate that many lines or spaces.
    const cols = this.cols || 80, rows = this.rows || 24, top = Math.max(0, this.lines.length - rows);
    const clamp = (v, lo, hi) => Math.min(Math.max(v, lo), hi);
    const n = isNaN(args[0]) ? 1 : clamp(args[0], 1, Math.max(cols, rows));
    const line = this.lines[this.row] || "";
    switch (final) {
      case "C": this.col = clamp(this.col + n, 0, Math.max(this.col, cols - 1)); break;
      case "D": this.col = Math.max(0, this.col - n); break;
      case "A": this.row = Math.max(Math.min(top, this.row), this.row - n); break;
      case "B": this.row = Math.min(this.row + n, Math.max(this.row, top + rows - 1)); while (this.row >= this.lines.length) this.lines.push(""); break;
      case "G": this.col = clamp(n - 1, 0, cols - 1); break;
      case "K": {
        const mode = isNaN(args[0]) ? 0 : args[0];
        if (mode === 0) this.lines[this.row] = line.slice(0, this.col);
        else if (mode === 1) this.lines[this.row] = " ".repeat(this.col) + line.slice(this.col);
        else this.lines[this.row] = "";
        break;
      }
      case "P": this.lines[this.row] = line.slice(0, this.col) + line.slice(this.col + n); break;
      case "@": // what goes past the right margin is lost, as on a VT100
        this.lines[this.row] = (line.slice(0, this.col) + " ".repeat(Math.min(n, Math.max(0, cols - this.col))) + line.slice(this.col)).slice(0, Math.max(cols, line.length)); break;
      case "J": if ((args[0] || 0) >= 2) { this.lines = [""]; this.row = 0; this.col = 0; } else { this.lines.length = this.row + 1; this.lines[this.row] = line.slice(0, this.col); } break;
      case "H": case "f": {
        // Absolute moves are relative to the visible screen: the last rows lines.
        this.row = top + (isNaN(args[0]) ? 0 : clamp(args[0] - 1, 0, rows - 1));
        this.col = isNaN(args[1]) ? 0 : clamp(args[1] - 1, 0, cols - 1);
        while (this.row >= this.lines.length) this.lines.push("");
        break;
      }
      default: break; // colours and modes: ignored
    }
  }

  render() {
    const frag = document.createDocumentFragment();
    this.lines.forEach((line, r) => {
      if (r === this.row) {
        const padded = line.length > this.col ? line : line + " ".repeat(this.col - line.length + 1);
        frag.append(padded.slice(0, this.col));
        const cur = document.createElement("span");
        cur.className = "cursor";
        cur.textContent = padded[this.col] || " ";
        frag.append(cur, padded.slice(this.col + 1));
      } else {
        frag.append(line);
      }
      if (r < this.lines.length - 1) frag.append("\n");
    });
    this.pre.replaceChildren(frag);
    this.pre.scrollTop = this.pre.scrollHeight;
  }

  // text is what the screen shows, for tests and copy.
  get text() { return this.lines.join("\n"); }
}
