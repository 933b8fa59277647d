package main

import (
	"testing"

	"github.com/pandastack/pandastack/client"
)

// A listing says why the server suspended a sandbox.
func TestStateWithReason(t *testing.T) {
	for _, c := range []struct {
		sb   client.Sandbox
		want string
	}{
		{client.Sandbox{State: "running"}, "running"},
		{client.Sandbox{State: "paused"}, "paused"},
		{client.Sandbox{State: "paused", PauseReason: "idle"}, "paused (idle)"},
		{client.Sandbox{State: "paused", PauseReason: "memory"}, "paused (memory)"},
	} {
		if got := stateWithReason(c.sb); got != c.want {
			t.Errorf("%+v: %q, want %q", c.sb, got, c.want)
		}
	}
}
