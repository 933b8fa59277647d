package agent

import "github.com/pandastack/pandastack/internal/agent/jupyter"

// kernelOptions are what a non-Python kernel needs beyond its kernelspec.
type kernelOptions struct {
	// transport: Deno's kernel binds no ipc:// sockets, so TCP on loopback.
	transport jupyter.Transport
	envCode   func(map[string]string) (set, restore string)
}

// otherKernels are the kernels of the code-interpreter template besides
// ipykernel and the bash kernel.
var otherKernels = map[string]kernelOptions{
	"javascript": {jupyter.TCP, jupyter.DenoEnvCode},
	"typescript": {jupyter.TCP, jupyter.DenoEnvCode},
	"r":          {jupyter.TCP, jupyter.REnvCode},
}
