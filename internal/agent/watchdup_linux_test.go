package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// A file made in a new directory after the directory's watch began and
// before the walk of it is seen by both, and reported once; so is one a
// walk reported when its event comes in a later read. A file made again
// at the same path after a removal is news.
func TestWatchReportsACreateOnce(t *testing.T) {
	root := t.TempDir()
	w, err := newWatcher(fileTarget{path: root, root: true}, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	read := func() []agentproto.FileEvent { t.Helper(); return readEvents(t, w) }
	creates := func(evs []agentproto.FileEvent, name string) int {
		n := 0
		for _, ev := range evs {
			if ev.Type == pandastack.FileEventCreate && ev.Name == name {
				n++
			}
		}
		return n
	}

	// In one read: the directory's event, then its file's, then the walk.
	d := filepath.Join(root, "d")
	ok(t, os.Mkdir(d, 0o755))
	ok(t, w.add(d)) // the watch begins before the walk, as in parse
	ok(t, os.WriteFile(filepath.Join(d, "f"), nil, 0o644))
	evs := read()
	if creates(evs, "d") != 1 || creates(evs, "d/f") != 1 {
		t.Fatalf("one read: %+v, want one create each of d and d/f", evs)
	}

	// Across reads: the walk of e (its directory's event read first)
	// reports e/g, whose own event comes in the next read.
	e := filepath.Join(root, "e")
	ok(t, os.Mkdir(e, 0o755))
	ok(t, w.add(e))
	ok(t, os.WriteFile(filepath.Join(e, "g"), nil, 0o644))
	found := []agentproto.FileEvent{}
	ok(t, w.addTree(e, &found))
	if creates(found, "e/g") != 1 {
		t.Fatalf("the walk of e: %+v", found)
	}
	evs = read()
	if creates(evs, "e") != 1 || creates(evs, "e/g") != 0 {
		t.Fatalf("after the walk: %+v, want a create of e and none of e/g", evs)
	}

	ok(t, os.Remove(filepath.Join(e, "g")))
	ok(t, os.WriteFile(filepath.Join(e, "g"), nil, 0o644))
	if evs := read(); creates(evs, "e/g") != 1 {
		t.Fatalf("made again after its removal: %+v", evs)
	}
}

// readEvents reads and parses one batch of w's events.
func readEvents(t *testing.T, w *watcher) []agentproto.FileEvent {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := w.f.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	evs, ended, err := w.parse(buf[:n])
	if ended || err != nil {
		t.Fatalf("parse: ended %v, %v", ended, err)
	}
	return evs
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A directory moved away and back shows its files created again.
func TestWatchReportsADirectoryMovedBack(t *testing.T) {
	root := t.TempDir()
	away := t.TempDir()
	w, err := newWatcher(fileTarget{path: root, root: true}, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	read := func() []agentproto.FileEvent { t.Helper(); return readEvents(t, w) }
	d := filepath.Join(root, "d")
	ok(t, os.Mkdir(d, 0o755))
	ok(t, os.WriteFile(filepath.Join(d, "f"), nil, 0o644))
	read() // d made, and the walk reports d/f
	ok(t, os.Rename(d, filepath.Join(away, "d")))
	read()
	ok(t, os.Rename(filepath.Join(away, "d"), d))
	found := false
	for _, ev := range read() {
		found = found || (ev.Type == pandastack.FileEventCreate && ev.Name == "d/f")
	}
	if !found {
		t.Fatal("d/f not reported when its directory came back")
	}
}
