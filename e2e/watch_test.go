package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
)

// TestWatchDir: a directory watch in a real sandbox reports what commands
// do there (create, write, rename, chmod, remove, a new subdirectory and
// what is made in it), goes on across a snapshot of the sandbox, ends when
// the caller stops it, and is refused for a file, a bad query and another
// project.
func TestWatchDir(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 300})
	mustExec := func(cmd string) {
		t.Helper()
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: cmd})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %+v %v", cmd, res, err)
		}
	}
	mustExec("mkdir -p /home/user/w && echo x > /home/user/file")

	wctx, stop := context.WithCancel(ctx)
	events := make(chan client.FileEvent, 256)
	ended := make(chan error, 1)
	go func() {
		ended <- c.WatchDir(wctx, sb.ID, "w", true, func(ev client.FileEvent) error {
			events <- ev
			return nil
		})
	}()
	var seen []string
	wait := func(want ...string) {
		t.Helper()
		left := map[string]bool{}
		for _, w := range want {
			left[w] = true
		}
		deadline := time.After(20 * time.Second)
		for len(left) > 0 {
			select {
			case ev := <-events:
				k := ev.Type + " " + ev.Name
				if ev.IsDir {
					k += "/"
				}
				seen = append(seen, k)
				delete(left, k)
			case err := <-ended:
				t.Fatalf("the watch ended (%v) while waiting for %v; saw %q", err, left, seen)
			case <-deadline:
				t.Fatalf("still waiting for %v; saw %q", left, seen)
			}
		}
	}
	wait("watching /")
	mustExec("cd /home/user/w && echo hi > a.txt && echo more >> a.txt && chmod 600 a.txt && mv a.txt b.txt && rm b.txt")
	wait("create a.txt", "write a.txt", "chmod a.txt", "rename a.txt", "create b.txt", "remove b.txt")
	mustExec("mkdir -p /home/user/w/x/y && echo z > /home/user/w/x/y/f")
	wait("create x/", "create x/y/", "create x/y/f")

	// A snapshot of the watched sandbox: the watch goes on.
	if _, err := c.CreateSnapshot(ctx, sb.ID, nil); err != nil {
		t.Fatalf("snapshot while watched: %v", err)
	}
	mustExec("echo after > /home/user/w/x/y/after")
	wait("create x/y/after")

	t.Logf("events: %q", seen)
	stop()
	select {
	case err := <-ended:
		if err != nil {
			t.Errorf("a watch its caller stopped: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not end when its caller stopped it")
	}

	for _, bad := range []struct {
		client *client.Client
		path   string
		code   string
	}{
		{c, "/home/user/file", "invalid_request"},
		{c, "/home/user/nothere", "not_found"},
		{c, "/proc", "invalid_request"},
		{client.New(s.url, s.newKey("watch-other")), "/home/user/w", "not_found"},
	} {
		err := bad.client.WatchDir(ctx, sb.ID, bad.path, false, func(ev client.FileEvent) error {
			return fmt.Errorf("an event of a watch that should be refused: %+v", ev)
		})
		if !client.IsCode(err, bad.code) {
			t.Errorf("watch of %s: %v, want %s", bad.path, err, bad.code)
		}
	}
}

// A watch open when serve stops ends at once with an error that says so
// (it held the shutdown for its whole 10 s of grace before).
func TestWatchEndsWithTheServer(t *testing.T) {
	s := startServer(t, "", "PANDASTACK_POOL_SIZE=0", "PANDASTACK_WARM=0")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	c := s.client()
	sb := newSandboxNoCleanup(t, s)
	type end struct {
		err error
		at  time.Time
	}
	ended := make(chan end, 1)
	live := make(chan struct{})
	go func() {
		err := c.WatchDir(context.Background(), sb.ID, "/home/user", false, func(ev client.FileEvent) error {
			if ev.Type == "watching" {
				close(live)
			}
			return nil
		})
		ended <- end{err, time.Now()}
	}()
	select {
	case <-live:
	case e := <-ended:
		t.Fatalf("the watch ended before it started: %v", e.err)
	case <-time.After(20 * time.Second):
		t.Fatal("the watch did not start")
	}
	start := time.Now()
	s.stop()
	select {
	case e := <-ended:
		if !client.IsCode(e.err, "sandbox_unavailable") {
			t.Errorf("the watch's end at shutdown: %v, want sandbox_unavailable", e.err)
		}
		// When the watch ended, not when serve was done stopping the
		// sandbox after it (slow on a loaded host): a watch that held the
		// shutdown ended with its 10 s of grace.
		if d := e.at.Sub(start); d > 8*time.Second {
			t.Errorf("the watch ended %s into the shutdown, want at once", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not end with the server")
	}
}

// newSandboxNoCleanup creates a sandbox the test's server stop ends
// (serve runs with --kill-on-exit in the tests).
func newSandboxNoCleanup(t *testing.T, s *server) *client.Sandbox {
	t.Helper()
	sb, err := s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}
