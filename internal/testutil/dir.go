package testutil

import (
	"os"
	"testing"
)

// RequireEmptyDir fails t when dir holds anything (a missing dir is
// empty), naming what it holds: for leak checks of temp files.
func RequireEmptyDir(t testing.TB, dir string) {
	t.Helper()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %v, want nothing", dir, names)
	}
}
