/**
 * Not a test that runs: the README's ways of calling the SDK, as they are
 * written there (its streaming, exec, background and terminal examples),
 * which the test build (tsc, strict) must accept.
 */

import WebSocket from "ws";
import type { CodeContext, Sandbox } from "@pandastack/sdk";

export async function readmeUsage(sandbox: Sandbox, ctx: CodeContext): Promise<void> {
  await ctx.runCode("for i in range(3):\n    print(i, flush=True)", {
    timeout: 60,
    onStdout: (data) => process.stdout.write(data),
    onStderr: (data) => process.stderr.write(data),
    onResult: (result) => console.log("result", Object.keys(result)),
    onError: (error) => console.log("raised", error.name),
  });
  await sandbox.exec(["ls", "-la", "/tmp"], {
    timeout: 30,
    onStdout: (d) => process.stdout.write(d),
    onStderr: (d) => process.stderr.write(d),
  });
  const h = await sandbox.exec("python3 -u -m http.server 8000", { background: true });
  await h.wait({ onStdout: (d) => process.stdout.write(d) });
  const term = await sandbox.terminal({ cols: 100, rows: 30, WebSocket });
  await term.close();
  const watch = await sandbox.files.watchDir("out", (ev) => console.log(ev.type, ev.name), { recursive: true });
  await watch.stop();
}
