//go:build linux

package agent_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// watchStream opens a watch and returns its events as they come.
func watchStream(t *testing.T, st *stack, ctx context.Context, kv ...string) <-chan agentproto.FileEvent {
	t.Helper()
	resp := st.request(t, ctx, http.MethodGet, "/v1/files/watch", q(kv...), nil)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		t.Fatalf("watch: status %d", resp.StatusCode)
	}
	out := make(chan agentproto.FileEvent, 256)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var ev agentproto.FileEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("bad line %q: %v", sc.Bytes(), err)
				return
			}
			out <- ev
		}
	}()
	return out
}

// expect reads events until one of each wanted type and name has come (in
// any order, others between them allowed).
func expect(t *testing.T, evs <-chan agentproto.FileEvent, want ...agentproto.FileEvent) []agentproto.FileEvent {
	t.Helper()
	var seen []agentproto.FileEvent
	left := map[agentproto.FileEvent]bool{}
	for _, w := range want {
		left[w] = true
	}
	timeout := time.After(10 * time.Second)
	for len(left) > 0 {
		select {
		case ev, ok := <-evs:
			if !ok {
				t.Fatalf("the stream ended; still waiting for %v; saw %v", left, seen)
			}
			seen = append(seen, ev)
			delete(left, agentproto.FileEvent{Type: ev.Type, Name: ev.Name, IsDir: ev.IsDir})
		case <-timeout:
			t.Fatalf("still waiting for %v; saw %v", left, seen)
		}
	}
	return seen
}

func TestWatchDirectory(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		dir := filepath.Join(cfg.Home, "w")
		must(t, os.MkdirAll(dir, 0o755))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		evs := watchStream(t, st, ctx, "path", "w", "recursive", "true")
		if first := <-evs; first.Type != pandastack.FileEventWatching || first.Path != dir || !first.IsDir {
			t.Fatalf("first line %+v, want watching %s", first, dir)
		}
		f := filepath.Join(dir, "a.txt")
		must(t, os.WriteFile(f, []byte("one"), 0o644))
		expect(t, evs, agentproto.FileEvent{Type: "create", Name: "a.txt"}, agentproto.FileEvent{Type: "write", Name: "a.txt"})
		os.Chmod(f, 0o600)
		os.Rename(f, filepath.Join(dir, "b.txt"))
		os.Remove(filepath.Join(dir, "b.txt"))
		expect(t, evs, agentproto.FileEvent{Type: "chmod", Name: "a.txt"}, agentproto.FileEvent{Type: "rename", Name: "a.txt"},
			agentproto.FileEvent{Type: "create", Name: "b.txt"}, agentproto.FileEvent{Type: "remove", Name: "b.txt"})
		// A directory made with its contents at once: they are reported
		// too, and followed from then on.
		os.MkdirAll(filepath.Join(dir, "x", "y"), 0o755)
		os.WriteFile(filepath.Join(dir, "x", "y", "f"), []byte("1"), 0o644)
		expect(t, evs, agentproto.FileEvent{Type: "create", Name: "x", IsDir: true}, agentproto.FileEvent{Type: "create", Name: "x/y", IsDir: true})
		time.Sleep(100 * time.Millisecond)
		os.WriteFile(filepath.Join(dir, "x", "y", "g"), []byte("2"), 0o644)
		expect(t, evs, agentproto.FileEvent{Type: "create", Name: "x/y/g"})
		// The watched directory removed: its event, then the end.
		os.RemoveAll(dir)
		seen := expect(t, evs, agentproto.FileEvent{Type: "remove", IsDir: true})
		if last := seen[len(seen)-1]; last.Path != dir {
			t.Errorf("the last remove is of %s, want the watched directory", last.Path)
		}
		select {
		case ev, ok := <-evs:
			if ok {
				t.Errorf("after the directory went: %+v, want the end", ev)
			}
		case <-time.After(5 * time.Second):
			t.Error("the stream did not end with its directory")
		}
	})
}

// An upload shows in a watch as one change of the file: a create, then a
// write when another upload replaces it; never its temp file.
func TestWatchUploads(t *testing.T) {
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	st.call(t, http.MethodPut, "/v1/files", q("path", "up/sub/keep"), strings.NewReader(""), http.StatusOK, nil) // the user's directories
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := watchStream(t, st, ctx, "path", "up", "recursive", "true")
	<-evs
	st.call(t, http.MethodPut, "/v1/files", q("path", "up/sub/a.txt"), strings.NewReader("one"), http.StatusOK, nil)
	st.call(t, http.MethodPut, "/v1/files", q("path", "up/sub/a.txt"), strings.NewReader("two"), http.StatusOK, nil)
	st.call(t, http.MethodDelete, "/v1/files", q("path", "up/sub/keep"), nil, http.StatusNoContent, nil) // a marker: everything before it has come
	seen := expect(t, evs, agentproto.FileEvent{Type: "remove", Name: "sub/keep"})
	var got []string
	for _, ev := range seen {
		got = append(got, ev.Type+" "+ev.Name)
	}
	want := []string{"create sub/a.txt", "write sub/a.txt", "remove sub/keep"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

func TestWatchRefusals(t *testing.T) {
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	must(t, os.WriteFile(filepath.Join(cfg.Home, "file"), []byte("x"), 0o644))
	for _, c := range []struct {
		kv     []string
		status int
	}{
		{[]string{"path", "nothere"}, http.StatusNotFound},
		{[]string{"path", "file"}, http.StatusBadRequest},
		{[]string{"path", ".", "recursive", "maybe"}, http.StatusBadRequest},
		{[]string{"path", "/proc"}, http.StatusBadRequest},
		{[]string{"path", ".", "depth", "1"}, http.StatusBadRequest},
	} {
		resp := st.request(t, context.Background(), http.MethodGet, "/v1/files/watch", q(c.kv...), nil)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%v: %d, want %d", c.kv, resp.StatusCode, c.status)
		}
	}
	// Not recursive: a subdirectory's changes are not reported.
	must(t, os.MkdirAll(filepath.Join(cfg.Home, "sub"), 0o755))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := watchStream(t, st, ctx, "path", ".")
	<-evs
	os.WriteFile(filepath.Join(cfg.Home, "sub", "deep"), []byte("x"), 0o644)
	must(t, os.WriteFile(filepath.Join(cfg.Home, "top"), []byte("x"), 0o644))
	seen := expect(t, evs, agentproto.FileEvent{Type: "create", Name: "top"})
	for _, ev := range seen {
		if ev.Name == "sub/deep" {
			t.Errorf("a change below a watch without recursive: %+v", ev)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A watch through a symlink follows the directory it points to, beneath
// too; a tree moved in whole reports what it holds up to a bound, then an
// overflow (a million files moved in must not fill the agent's memory).
func TestWatchLinkAndBigTree(t *testing.T) {
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	real := filepath.Join(cfg.Home, "real")
	must(t, os.MkdirAll(filepath.Join(real, "sub"), 0o755))
	must(t, os.Symlink(real, filepath.Join(cfg.Home, "link")))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evs := watchStream(t, st, ctx, "path", "link", "recursive", "true")
	if first := <-evs; first.Path != real {
		t.Fatalf("watching %s, want the link's target %s", first.Path, real)
	}
	must(t, os.WriteFile(filepath.Join(real, "sub", "deep"), []byte("x"), 0o644))
	expect(t, evs, agentproto.FileEvent{Type: "create", Name: "sub/deep"})

	big := filepath.Join(cfg.Home, "big")
	must(t, os.MkdirAll(filepath.Join(big, "d"), 0o755))
	for i := range 1500 {
		must(t, os.WriteFile(filepath.Join(big, "d", strconv.Itoa(i)), nil, 0o644))
	}
	must(t, os.Rename(big, filepath.Join(real, "big")))
	seen := expect(t, evs, agentproto.FileEvent{Type: "create", Name: "big", IsDir: true}, agentproto.FileEvent{Type: "overflow"})
	creates := 0
	for _, ev := range seen {
		if ev.Type == "create" {
			creates++
		}
	}
	if creates > 1002 { // the tree, sub/deep, and at most 1000 of what big holds
		t.Errorf("%d creates for a tree of 1501 moved in, want at most 1000 of its entries then an overflow", creates)
	}
	// Still followed past the bound.
	must(t, os.WriteFile(filepath.Join(real, "big", "d", "new"), nil, 0o644))
	expect(t, evs, agentproto.FileEvent{Type: "create", Name: "big/d/new"})
}

// At most maxWatches watches at once (64): one more is refused while they
// run, and a watch whose caller hung up frees its slot.
func TestWatchSlots(t *testing.T) {
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var streams []<-chan agentproto.FileEvent
	for range 64 {
		evs := watchStream(t, st, ctx, "path", ".")
		<-evs
		streams = append(streams, evs)
	}
	resp := st.request(t, context.Background(), http.MethodGet, "/v1/files/watch", q("path", "."), nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("a 65th watch: %d, want 409", resp.StatusCode)
	}
	cancel()
	for _, evs := range streams {
		for range evs {
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := st.request(t, context.Background(), http.MethodGet, "/v1/files/watch", q("path", "."), nil)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the 64 ended a watch still answers %d", resp.StatusCode)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
