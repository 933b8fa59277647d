package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPauseDone(t *testing.T) {
	const (
		created = `time=1 level=INFO msg="sandbox created" sandbox=sbx_a template=code-interpreter`
		paused  = `time=2 level=INFO msg="sandbox paused" sandbox=sbx_a reason=idle`
		other   = `time=3 level=INFO msg="sandbox paused" sandbox=sbx_ab reason=idle`
		resumed = `time=4 level=INFO msg="sandbox resumed" sandbox=sbx_a total_ms=170.1`
		onDem   = `time=5 level=INFO msg="sandbox resumed on demand" sandbox=sbx_a request_ms=200`
	)
	for _, tc := range []struct {
		name string
		log  string
		want bool
	}{
		{"never paused", created + "\n", false},
		{"paused", created + "\n" + paused + "\n", true},
		{"paused, no newline at the end", created + "\n" + paused, true},
		{"resumed since", paused + "\n" + resumed + "\n" + onDem + "\n", false},
		{"another sandbox whose id starts alike", created + "\n" + resumed + "\n" + other + "\n", false},
		{"paused again", paused + "\n" + resumed + "\n" + paused + "\n" + other + "\n", true},
		{"empty", "", false},
	} {
		if got := pauseDone(tc.log, "sbx_a"); got != tc.want {
			t.Errorf("%s: pauseDone = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A sandbox resumed into a container prepared under another id has that
// container's processes filed under its own id.
func TestByAlias(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sbx_c"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sbx_c", filepath.Join(dir, "sbx_s")); err != nil {
		t.Fatal(err)
	}
	pids := map[string][]int{"sbx_c": {7, 8}, "sbx_o": {9}}
	byAlias(pids, dir)
	if len(pids) != 2 || len(pids["sbx_s"]) != 2 || len(pids["sbx_o"]) != 1 || pids["sbx_c"] != nil {
		t.Fatalf("after byAlias: %v", pids)
	}
}
