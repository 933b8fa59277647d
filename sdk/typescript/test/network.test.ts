/**
 * Networking through the TypeScript SDK against the real server: the policy
 * on create and setNetwork, typed errors, the egress log and getUrl. No
 * traffic leaves the machine: blocked names are answered by the sandbox's
 * own resolver.
 */

import assert from "node:assert/strict";
import { test } from "node:test";
import { InvalidRequestError, NetworkDeniedError } from "@pandastack/sdk";
import { haveServer, newSandbox } from "./helpers.js";

test("network policy on create, live change, and bad entries", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t, { network: { allowInternetAccess: false, allowOut: ["api.allowed.test"] } });
  assert.deepEqual(sb.network, { allowInternetAccess: false, allowOut: ["api.allowed.test"], denyOut: [] });
  await sb.setNetwork({ allowInternetAccess: true, denyOut: ["203.0.113.0/24"] });
  assert.deepEqual(sb.network, { allowInternetAccess: true, allowOut: [], denyOut: ["203.0.113.0/24"] });
  await assert.rejects(sb.setNetwork({ allowOut: ["1.2.3.4", "not a domain"] }), (err: unknown) => {
    assert.ok(err instanceof InvalidRequestError && !(err instanceof NetworkDeniedError), String(err));
    assert.match((err as Error).message, /allow_out\[1\]/);
    return true;
  });
  await assert.rejects(sb.setNetwork({ allowOut: ["192.168.1.1"] }), NetworkDeniedError);
  // denyOut alone (internet access omitted, so off) would deny nothing and cut the sandbox off.
  await assert.rejects(sb.setNetwork({ denyOut: ["203.0.113.0/24"] }), (err: unknown) => {
    assert.ok(err instanceof InvalidRequestError, String(err));
    assert.match((err as Error).message, /deny_out alone leaves the sandbox no internet/);
    return true;
  });
  const info = await sb.getInfo();
  assert.deepEqual(sb.network?.denyOut, ["203.0.113.0/24"]);
  assert.deepEqual(info.network, sb.network);
  // Omitted, internet access is off, as in the API: only allowOut is reachable.
  await sb.setNetwork({ allowOut: ["api.allowed.test"] });
  assert.deepEqual(sb.network, { allowInternetAccess: false, allowOut: ["api.allowed.test"], denyOut: [] });

  await sb.setNetwork({ allowInternetAccess: false, allowOut: ["api.allowed.test"] });
  const r2 = await sb.exec(["python3", "-c", "import socket\ntry:\n socket.gethostbyname('blocked.example')\nexcept socket.gaierror:\n print('nxdomain')"]);
  assert.equal(r2.stdout.trim(), "nxdomain");
  const log = await sb.networkLog();
  assert.ok(log.some((e) => e.kind === "dns" && e.domain === "blocked.example" && !e.allowed), JSON.stringify(log));
});

test("a fork may give its children a policy of their own", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t, { network: { allowInternetAccess: true } });
  const [kid] = await sb.fork(1, { ttlSeconds: 60, network: { allowOut: ["api.allowed.test"] } });
  try {
    assert.deepEqual(kid!.network, { allowInternetAccess: false, allowOut: ["api.allowed.test"], denyOut: [] });
    assert.equal((await sb.getInfo()).network?.allowInternetAccess, true);
  } finally {
    await kid!.kill();
  }
  await assert.rejects(sb.fork(1, { network: { allowOut: ["169.254.169.254"] } }), NetworkDeniedError);
});

test("getUrl reaches a server in the sandbox, with a token or the key", async (t) => {
  if (!haveServer(t)) return;
  const sb = await newSandbox(t);
  await sb.exec("cd /tmp && echo from-the-sandbox > hi.txt && nohup python3 -m http.server 8000 >/dev/null 2>&1 &");
  const url = await sb.getUrl(8000);
  assert.match(url, /\/ports\/8000\/\?pandastack_token=pst_/);
  const fileUrl = url.replace("/ports/8000/", "/ports/8000/hi.txt");
  let res = await fetch(fileUrl);
  for (let i = 0; i < 100 && res.status !== 200; i++) {
    await new Promise((ok) => setTimeout(ok, 200));
    res = await fetch(fileUrl);
  }
  assert.equal(res.status, 200);
  assert.equal(await res.text(), "from-the-sandbox\n");
  const plain = await sb.getUrl(8000, { token: false });
  assert.equal((await fetch(plain + "hi.txt")).status, 401);
});
