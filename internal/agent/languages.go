package agent

import "github.com/pandastack/pandastack/internal/agent/jupyter"

// langKernel is what a non-Python kernel needs beyond its kernelspec.
type langKernel struct {
	// transport: Deno's kernel binds no ipc:// sockets, so TCP on loopback.
	transport jupyter.Transport
	envCode   func(map[string]string) (set, restore string)
	// byMessage: SIGINT kills Deno's kernel; an interrupt_request stops a
	// running cell (not a pending await: after the grace the kernel restarts).
	byMessage bool
	// reseedCode: see jupyter.Options.ReseedCode. V8 seeds Math.random once
	// per process and offers no way to reseed it, so Deno's replaces it
	// (crypto.getRandomValues reads the OS's randomness each call anyway).
	reseedCode func() string
}

// otherKernels are the kernels of the code-interpreter template besides
// ipykernel and the bash kernel.
var otherKernels = map[string]langKernel{
	"javascript": {jupyter.TCP, jupyter.DenoEnvCode, true, jupyter.DenoReseedCode},
	"typescript": {jupyter.TCP, jupyter.DenoEnvCode, true, jupyter.DenoReseedCode},
	"r":          {jupyter.TCP, jupyter.REnvCode, false, jupyter.RReseedCode},
	// JJava (Java on JShell): an interrupt_request stops a running cell.
	"java": {jupyter.TCP, jupyter.JavaEnvCode, true, jupyter.JavaReseedCode},
}
