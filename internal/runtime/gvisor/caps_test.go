package gvisor

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
)

// Revision 1 is the set images without a record were taken with: agentCaps
// without CAP_SYS_ADMIN. An image's record picks the set; a damaged one, or
// one from a newer server, is a corrupt snapshot.
func TestCapsRevisions(t *testing.T) {
	if slices.Contains(capsOf(1), "CAP_SYS_ADMIN") || len(capsOf(1)) != len(agentCaps)-1 || !slices.Contains(capsOf(capsRevision), "CAP_SYS_ADMIN") {
		t.Fatalf("revision 1: %v; current: %v", capsOf(1), capsOf(capsRevision))
	}
	r := &Runtime{}
	dir := t.TempDir()
	for _, c := range []struct {
		record string // "" : none
		want   int
		bad    bool
	}{{"", 1, false}, {"1", 1, false}, {"2", 2, false}, {"3", 3, false}, {"4", 0, true}, {"x", 0, true}} {
		os.Remove(filepath.Join(dir, imageCapsFile))
		if c.record != "" {
			if err := os.WriteFile(filepath.Join(dir, imageCapsFile), []byte(c.record), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := r.capsFor(dir)
		if c.bad != pandastack.IsCode(err, pandastack.ESnapshotCorrupt) || (!c.bad && got != c.want) {
			t.Errorf("record %q: %d %v, want %d (corrupt: %v)", c.record, got, err, c.want, c.bad)
		}
	}
	if got, _ := r.capsFor(""); got != capsRevision {
		t.Errorf("a boot's revision: %d", got)
	}
	if got := sandboxCaps(t.TempDir()); got != 1 {
		t.Errorf("a sandbox dir without a record: revision %d, want 1", got)
	}
}

// A container taken over by another id (Rename) answers to that id only;
// its marker alone, left by a crash before or after the link went, does
// not hide it, so a Stop by its own id still removes it.
func TestContainerOfARenamedSandbox(t *testing.T) {
	r := &Runtime{sbxRoot: t.TempDir()}
	const from, to = "sbx_prep", "sbx_susp"
	if err := os.Mkdir(r.dir(from), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir(from), renamedFile), []byte(to), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, ok := r.container(from); c != from || !ok {
		t.Fatalf("a marker without the link: %s %v, want %s true", c, ok, from)
	}
	if err := os.Symlink(from, r.dir(to)); err != nil {
		t.Fatal(err)
	}
	if c, ok := r.container(from); c != from || ok {
		t.Fatalf("the old id with the link: %s %v, want %s false", c, ok, from)
	}
	if c, ok := r.container(to); c != from || !ok {
		t.Fatalf("the new id: %s %v, want %s true", c, ok, from)
	}
	if c, ok := r.container("sbx_other"); c != "sbx_other" || !ok {
		t.Fatalf("an id of its own: %s %v", c, ok)
	}
}

// LogTail reads the last lines of a sandbox's runsc and agent logs, through
// the container a Rename made it take over, and nothing for an unknown or
// invalid id.
func TestLogTail(t *testing.T) {
	r := &Runtime{sbxRoot: t.TempDir()}
	const from, to = "sbx_prep", "sbx_susp"
	if err := os.Mkdir(r.dir(from), 0o700); err != nil {
		t.Fatal(err)
	}
	var runscLog strings.Builder
	for i := range 15 {
		fmt.Fprintf(&runscLog, "line %d\n", i)
	}
	os.WriteFile(filepath.Join(r.dir(from), "runsc.log"), []byte(runscLog.String()), 0o600)
	os.WriteFile(filepath.Join(r.dir(from), "agent.log"), []byte("panic: boom\n"), 0o600)
	os.WriteFile(filepath.Join(r.dir(from), renamedFile), []byte(to), 0o600)
	if err := os.Symlink(from, r.dir(to)); err != nil {
		t.Fatal(err)
	}
	got := r.LogTail(to)
	if want := "runsc.log: line 5 | line 6 | line 7 | line 8 | line 9 | line 10 | line 11 | line 12 | line 13 | line 14; agent.log: panic: boom"; got != want {
		t.Errorf("LogTail = %q\nwant %q", got, want)
	}
	if got := r.LogTail("sbx_none"); got != "" {
		t.Errorf("LogTail of an unknown sandbox = %q", got)
	}
	if got := r.LogTail("../x"); got != "" {
		t.Errorf("LogTail of an invalid id = %q", got)
	}
}
