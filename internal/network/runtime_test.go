package network

import (
	"context"
	"testing"

	"github.com/pandastack/pandastack"
)

// statsRuntime is a pandastack.Runtime that knows one sandbox's figures
// through Stats alone.
type statsRuntime struct{ pandastack.Runtime }

func (statsRuntime) Stats(context.Context, string) (pandastack.RuntimeStats, error) {
	return pandastack.RuntimeStats{CPUNanos: 7, MemoryBytes: 8 << 20}, nil
}

// usageRuntime is statsRuntime with cheaper readings and logs of its own.
type usageRuntime struct{ statsRuntime }

func (usageRuntime) CPUNanos(context.Context, string) (int64, error)    { return 70, nil }
func (usageRuntime) MemoryBytes(context.Context, string) (int64, error) { return 80 << 20, nil }
func (usageRuntime) LogTail(id string) string                           { return "runsc.log: " + id }
func (usageRuntime) OOMKills(string) int64                              { return 3 }

// The wrapper passes the optional interfaces of the runtime it wraps on:
// the manager asks for them with a type assertion on the wrapper (the
// memory relief's readings, the log of a sandbox that died at its start).
func TestRuntimePassesOptionalInterfacesOn(t *testing.T) {
	ctx := context.Background()
	rt := Wrap(usageRuntime{}, nil)
	if n, err := rt.CPUNanos(ctx, "sbx_a"); n != 70 || err != nil {
		t.Errorf("CPUNanos = %d %v, want the wrapped runtime's 70", n, err)
	}
	if n, err := rt.MemoryBytes(ctx, "sbx_a"); n != 80<<20 || err != nil {
		t.Errorf("MemoryBytes = %d %v, want the wrapped runtime's", n, err)
	}
	if got := rt.LogTail("sbx_a"); got != "runsc.log: sbx_a" {
		t.Errorf("LogTail = %q", got)
	}
	if n := rt.OOMKills("sbx_a"); n != 3 {
		t.Errorf("OOMKills = %d, want the wrapped runtime's 3", n)
	}
	plain := Wrap(statsRuntime{}, nil)
	if n, err := plain.CPUNanos(ctx, "sbx_a"); n != 7 || err != nil {
		t.Errorf("CPUNanos of a runtime without readings = %d %v, want Stats' 7", n, err)
	}
	if n, err := plain.MemoryBytes(ctx, "sbx_a"); n != 8<<20 || err != nil {
		t.Errorf("MemoryBytes of a runtime without readings = %d %v, want Stats'", n, err)
	}
	if got := plain.LogTail("sbx_a"); got != "" {
		t.Errorf("LogTail of a runtime without logs = %q", got)
	}
	if n := plain.OOMKills("sbx_a"); n != -1 {
		t.Errorf("OOMKills of a runtime without the count = %d, want -1", n)
	}
}
