package gvisor

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// agent.log is written through a descriptor the sandbox holds, opened
// O_APPEND: after a rotation the writer goes on at the start of the
// truncated file, the old content is in agent.log.1, and only one old file
// is kept.
func TestRotateLogKeepsOneOldFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "agent.log")
	w, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	write := func(b byte, n int) {
		if _, err := w.Write(bytes.Repeat([]byte{b}, n)); err != nil {
			t.Fatal(err)
		}
	}
	write('a', 100)
	if err := rotateLog(p, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p + ".1"); !os.IsNotExist(err) {
		t.Fatalf("a log under the limit was rotated: %v", err)
	}
	write('a', 1000)
	if err := rotateLog(p, 1000); err != nil {
		t.Fatal(err)
	}
	write('b', 10)
	write('c', 1100)
	if err := rotateLog(p, 1000); err != nil {
		t.Fatal(err)
	}
	write('d', 5)
	cur, _ := os.ReadFile(p)
	old, _ := os.ReadFile(p + ".1")
	if string(cur) != "ddddd" {
		t.Errorf("agent.log after two rotations = %q, want the 5 bytes written since", cur)
	}
	if want := "bbbbbbbbbb" + string(bytes.Repeat([]byte{'c'}, 1100)); string(old) != want {
		t.Errorf("agent.log.1 holds %d bytes (%q…), want the 1110 bytes before the last rotation", len(old), old[:min(len(old), 20)])
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 2 {
		t.Errorf("files beside the log: %d, want agent.log and agent.log.1", len(ents))
	}
}
