import { PandaStackError } from "./errors.js";

/** The binary exec stream's media type (see the API's openapi.json). */
export const STREAM_MEDIA_TYPE = "application/vnd.pandastack.stream";

const HEADER = 5; // type byte, uint32 big-endian length
const MAX_PAYLOAD = 1 << 20;
const TYPES: Record<number, string> = { 1: "stdout", 2: "stderr", 3: "exit", 4: "error" };

/**
 * Cuts a binary exec stream, fed in pieces of any size, into events of the
 * same shape as the NDJSON ones: stdout/stderr carry `data` as text (a
 * character cut between frames is kept whole), exit/error their JSON.
 * @internal
 */
export class FrameDecoder {
  #buf = new Uint8Array(0);
  #text = { stdout: new TextDecoder(), stderr: new TextDecoder() };

  /** Feeds bytes; returns the events of the frames now complete. */
  feed(chunk: Uint8Array): Record<string, unknown>[] {
    let buf = chunk;
    if (this.#buf.length) {
      buf = new Uint8Array(this.#buf.length + chunk.length);
      buf.set(this.#buf);
      buf.set(chunk, this.#buf.length);
    }
    const out: Record<string, unknown>[] = [];
    let pos = 0;
    while (buf.length - pos >= HEADER) {
      const kind = buf[pos];
      const n = new DataView(buf.buffer, buf.byteOffset + pos + 1, 4).getUint32(0);
      const type = TYPES[kind];
      if (!type) throw new PandaStackError(`bad frame in the exec stream: unknown type ${kind}`, "stream_error");
      if (n > MAX_PAYLOAD) {
        throw new PandaStackError(`bad frame in the exec stream: ${n} bytes, more than the ${MAX_PAYLOAD} allowed`, "stream_error");
      }
      if (buf.length - pos - HEADER < n) break;
      const payload = buf.subarray(pos + HEADER, pos + HEADER + n);
      pos += HEADER + n;
      if (type === "stdout" || type === "stderr") {
        const data = this.#text[type].decode(payload, { stream: true });
        if (data) out.push({ type, data });
        continue;
      }
      let ev: unknown;
      try {
        ev = JSON.parse(new TextDecoder().decode(payload));
      } catch {
        // below
      }
      if (!ev || typeof ev !== "object") {
        throw new PandaStackError(`bad ${type} frame in the exec stream: ${new TextDecoder().decode(payload).slice(0, 200)}`, "stream_error");
      }
      if (type === "exit") {
        // A character cut at the very end.
        for (const t of ["stdout", "stderr"] as const) {
          const rest = this.#text[t].decode();
          if (rest) out.push({ type: t, data: rest });
        }
      }
      out.push({ ...(ev as Record<string, unknown>), type });
    }
    this.#buf = buf.slice(pos);
    return out;
  }

  /** Throws if the stream stopped inside a frame. */
  finish(): void {
    if (this.#buf.length) {
      throw new PandaStackError("the exec stream was cut inside a frame (connection cut?)", "stream_error");
    }
  }
}
