/**
 * The binary exec stream's decoder on its own (no server): frames cut at
 * any byte, characters cut between frames, and bad frames.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
// Internal: the package does not export the decoder.
import { FrameDecoder } from "../dist/frames.js";

function frame(kind: number, payload: Uint8Array | string): Uint8Array {
  const p = typeof payload === "string" ? new TextEncoder().encode(payload) : payload;
  const out = new Uint8Array(5 + p.length);
  out[0] = kind;
  new DataView(out.buffer).setUint32(1, p.length);
  out.set(p, 5);
  return out;
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let pos = 0;
  for (const p of parts) {
    out.set(p, pos);
    pos += p.length;
  }
  return out;
}

function decode(data: Uint8Array, piece: number): Record<string, unknown>[] {
  const dec = new FrameDecoder();
  const evs: Record<string, unknown>[] = [];
  for (let i = 0; i < data.length; i += piece) evs.push(...dec.feed(data.subarray(i, i + piece)));
  dec.finish();
  return evs;
}

test("stream frames: decoded in pieces of any size", () => {
  const data = concat(
    frame(1, new Uint8Array([0x63, 0x61, 0x66, 0xc3])), // "caf" and half of "é"
    frame(1, new Uint8Array([0xa9, 0x0a])),
    frame(2, "warn\n"),
    frame(3, '{"exit_code":3,"timed_out":false,"duration_ms":9}'),
  );
  for (const piece of [1, 3, 7, 1 << 20]) {
    const evs = decode(data, piece);
    const out = evs.filter((e) => e.type === "stdout").map((e) => e.data).join("");
    assert.equal(out, "café\n");
    assert.deepEqual(evs.filter((e) => e.type === "stderr"), [{ type: "stderr", data: "warn\n" }]);
    assert.deepEqual(evs.at(-1), { type: "exit", exit_code: 3, timed_out: false, duration_ms: 9 });
  }
});

test("stream frames: bad frames throw clear errors", () => {
  const big = new Uint8Array(5);
  big[0] = 1;
  new DataView(big.buffer).setUint32(1, (1 << 20) + 1);
  const cases: [Uint8Array, RegExp][] = [
    [frame(9, "x"), /unknown type 9/],
    [big, /more than the/],
    [frame(1, "abc").subarray(0, 7), /cut inside a frame/],
    [frame(3, "{"), /bad exit frame/],
  ];
  for (const [data, want] of cases) {
    assert.throws(() => decode(data, 4), want);
  }
});
