package agent

import "github.com/pandastack/pandastack/internal/agent/jupyter"

// kernelOptions are what a non-Python kernel needs beyond its kernelspec.
type kernelOptions struct {
	// transport: Deno's kernel binds no ipc:// sockets, so TCP on loopback.
	transport jupyter.Transport
	envCode   func(map[string]string) (set, restore string)
	// byMessage: SIGINT kills Deno's kernel; an interrupt_request stops a
	// running cell (not a pending await: after the grace the kernel restarts).
	byMessage bool
}

// otherKernels are the kernels of the code-interpreter template besides
// ipykernel and the bash kernel.
var otherKernels = map[string]kernelOptions{
	"javascript": {jupyter.TCP, jupyter.DenoEnvCode, true},
	"typescript": {jupyter.TCP, jupyter.DenoEnvCode, true},
	"r":          {jupyter.TCP, jupyter.REnvCode, false},
}
