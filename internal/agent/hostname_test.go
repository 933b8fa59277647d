package agent

import (
	"errors"
	"testing"
)

// The hello names the sandbox after its id when the restore left another
// name, and leaves a name that is right alone (setting it would mark it
// changed, and gVisor would then keep it in a fork's child).
func TestEnsureHostname(t *testing.T) {
	name := "sbx-other"
	var sets []string
	ops := hostnameOps{
		get: func() (string, error) { return name, nil },
		set: func(n string) error { sets = append(sets, n); name = n; return nil },
	}
	if err := ops.ensure("sbx_abc"); err != nil || name != "sbx-abc" {
		t.Fatalf("ensure: %v, hostname %q", err, name)
	}
	if err := ops.ensure("sbx_abc"); err != nil || len(sets) != 1 {
		t.Fatalf("a right name was set again: %q %v", sets, err)
	}
	ops.set = func(string) error { return errors.New("operation not permitted") }
	if err := ops.ensure("sbx_def"); err == nil {
		t.Fatal("a failed set was not reported")
	}
}
