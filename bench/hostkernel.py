"""The host baseline of the benchmark: one ipykernel on the host, no sandbox.

The benchmark starts this with the kernel venv's python (scripts/test-python-env.sh).
It starts a kernel, prints {"ready": true, "kernel_pid": N}, then for every line
read on stdin (a JSON string: the code) runs it with jupyter_client's
execute_interactive and prints {"ms": elapsed, "text": main result, "status": ...}.
EOF or "quit" shuts the kernel down. The kernel also exits on its own if this
process dies (jupyter_client sets JPY_PARENT_PID, which ipykernel watches).
"""

import json
import sys
import time

from jupyter_client.manager import start_new_kernel


def versions():
    """What the host baseline runs: its figure moves with these."""
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for dist in ("ipykernel", "jupyter_client", "pyzmq"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "none"
    return out


def main():
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        pid = getattr(km.provisioner, "pid", None)
        print(json.dumps({"ready": True, "kernel_pid": pid, "versions": versions()}), flush=True)
        for line in sys.stdin:
            line = line.strip()
            if not line or line == "quit":
                break
            code = json.loads(line)
            texts = []

            def hook(msg):
                if msg["header"]["msg_type"] == "execute_result":
                    texts.append(msg["content"]["data"].get("text/plain", ""))

            t0 = time.perf_counter()
            reply = kc.execute_interactive(code, allow_stdin=False, output_hook=hook, timeout=60)
            ms = (time.perf_counter() - t0) * 1000
            out = {"ms": ms, "text": texts[-1] if texts else None, "status": reply["content"]["status"]}
            print(json.dumps(out), flush=True)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
