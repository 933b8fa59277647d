/**
 * Run by snapshot.test.ts in a separate node process, as a later session of
 * a user's program would be: restores a snapshot by id and reports what it
 * finds as one JSON line on stdout. Args: <snapshotId> <contextId>.
 */

import { Sandbox } from "@pandastack/sdk";

const [snapshotId, contextId] = process.argv.slice(2);
if (!snapshotId || !contextId) throw new Error("usage: restore-child.js <snapshotId> <contextId>");
const sandbox = await Sandbox.create({ snapshotId, ttlSeconds: 300, metadata: { suite: "ts-sdk", role: "restored" } });
try {
  const inContext = await sandbox.runCode("secret * 2", { context: contextId });
  const inDefault = await sandbox.runCode("default_var");
  const file = await sandbox.files.readText("state/note.txt");
  process.stdout.write(
    JSON.stringify({
      id: sandbox.id,
      template: sandbox.template,
      inContext: inContext.text ?? String(inContext.error),
      inDefault: inDefault.text ?? String(inDefault.error),
      file,
    }) + "\n",
  );
} finally {
  await sandbox.kill();
}
