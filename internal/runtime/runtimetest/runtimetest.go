// Package runtimetest is the conformance suite every pandastack.Runtime
// driver passes. It boots real sandboxes with the real agent and talks to it
// over the channel the driver returns. Only drivers' tests import it.
package runtimetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Env is what the suite needs from a driver's test.
type Env struct {
	// New returns a fresh runtime; the suite stops every sandbox it starts.
	New func(t *testing.T) pandastack.Runtime
	// RootFS is a root filesystem with /bin/sh, head, tail, sleep, id, dd, wc,
	// md5sum and a /home/user directory.
	RootFS string
}

// Run runs the suite.
func Run(t *testing.T, env Env) {
	tests := []struct {
		name string
		fn   func(*testing.T, Env)
	}{
		{"StartHelloStop", testStartHelloStop},
		{"AttachNewEpoch", testAttach},
		{"StopIsIdempotent", testStopIdempotent},
		{"FailedStartLeavesNothing", testFailedStart},
		{"DuplicateID", testDuplicateID},
		{"MemoryLimit", testMemoryLimit},
		{"DiskOfItsOwn", testDisk},
		{"ConcurrentStarts", testConcurrent},
		{"ContextDoesNotOwnSandbox", testContextDoesNotOwn},
		{"CheckpointRestoreFork", testCheckpointRestore},
		{"PauseResume", testPauseResume},
		{"LazyRestore", testLazyRestore},
		{"RestoreCorrupt", testRestoreCorrupt},
		{"PreparedRestore", testPreparedRestore},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, env) })
	}
}

func newID() string { return fmt.Sprintf("sbx_rt%08x", rand.Uint32()) }

// session is a minimal host side of the agent protocol.
type session struct {
	sess *yamux.Session
	http *http.Client
}

func dial(t *testing.T, rwc io.ReadWriteCloser) *session {
	t.Helper()
	epoch := rand.Uint32() | 1
	sess, err := yamux.Client(agentproto.HostConn(rwc, epoch), agentproto.MuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	s := &session{sess: sess, http: &http.Client{Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return sess.Open() },
	}}}
	// As long as a start may take: the agent answers once the sandbox runs,
	// which a loaded host delays.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://agent/v1/hello", nil)
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	defer resp.Body.Close()
	var h agentproto.Hello
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("hello: %v", err)
	}
	if h.Epoch != epoch || h.ProtocolVersion != agentproto.ProtocolVersion {
		t.Fatalf("hello = %+v, want epoch %d", h, epoch)
	}
	return s
}

func (s *session) close() { s.sess.Close() }

// exec runs a shell command through the agent and returns stdout and the exit event.
// seesMemory checks that the sandbox sees mb MiB of memory in all
// (/proc/meminfo's MemTotal), whatever the host allows it beyond.
func (s *session) seesMemory(t *testing.T, mb int) {
	t.Helper()
	out, _ := s.exec(t, "head -1 /proc/meminfo")
	if f := strings.Fields(out); len(f) != 3 || f[1] != strconv.Itoa(mb<<10) {
		t.Fatalf("a sandbox of %d MiB: /proc/meminfo says %q, want MemTotal %d kB", mb, out, mb<<10)
	}
}

func (s *session) exec(t *testing.T, cmd string) (string, agentproto.ExecEvent) {
	t.Helper()
	out, ev, err := s.tryExec(cmd)
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return out, ev
}

func (s *session) tryExec(cmd string) (string, agentproto.ExecEvent, error) {
	b, _ := json.Marshal(agentproto.ExecRequest{Cmd: cmd, TimeoutMS: 120000})
	resp, err := s.http.Post("http://agent/v1/exec", "application/json", bytes.NewReader(b))
	if err != nil {
		return "", agentproto.ExecEvent{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		return "", agentproto.ExecEvent{}, fmt.Errorf("%s %s", resp.Status, body)
	}
	var out strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev agentproto.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return "", ev, err
		}
		switch ev.Type {
		case "stdout":
			out.Write(ev.Data)
		case "exit":
			return out.String(), ev, nil
		}
	}
	return out.String(), agentproto.ExecEvent{}, fmt.Errorf("stream ended without exit (%v)", sc.Err())
}

func start(t *testing.T, rt pandastack.Runtime, spec pandastack.RuntimeSpec) io.ReadWriteCloser {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rwc, err := rt.Start(ctx, spec)
	if err != nil {
		t.Fatalf("start %s: %v", spec.ID, err)
	}
	t.Cleanup(func() { rt.Stop(context.Background(), spec.ID) })
	return rwc
}

func assertGone(t *testing.T, rt pandastack.Runtime, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := rt.State(ctx, id); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("State after Stop: %v, want not_found", err)
	}
	if _, err := rt.Stats(ctx, id); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("Stats after Stop: %v, want not_found (processes left?)", err)
	}
	ids, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ids {
		if x == id {
			t.Errorf("List after Stop still has %s", id)
		}
	}
	if pids := pgrep(id); len(pids) > 0 {
		t.Errorf("host processes of %s left: %v", id, pids)
	}
}

// pgrep returns host pids whose command line mentions s.
func pgrep(s string) []string {
	out, _ := exec.Command("pgrep", "-f", s).Output()
	return strings.Fields(string(out))
}

func testStartHelloStop(t *testing.T, env Env) {
	rt := env.New(t)
	id := newID()
	ctx := context.Background()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS, Env: []string{"HELLO=world"}})
	s := dial(t, rwc)
	defer s.close()
	out, ev := s.exec(t, `echo "$HELLO $(id -u)"`)
	if out != "world 1000\n" || ev.ExitCode != 0 {
		t.Fatalf("exec = %q %+v", out, ev)
	}
	if st, err := rt.State(ctx, id); err != nil || st != pandastack.RuntimeRunning {
		t.Fatalf("State = %v %v", st, err)
	}
	if !rt.Alive(id) {
		t.Fatal("Alive = false for a running sandbox")
	}
	ids, err := rt.List(ctx)
	if err != nil || !contains(ids, id) {
		t.Fatalf("List = %v %v, want %s in it", ids, err, id)
	}
	stats, err := rt.Stats(ctx, id)
	if err != nil || stats.PSSBytes < 1<<20 || len(stats.PIDs) == 0 {
		t.Fatalf("Stats = %+v %v", stats, err)
	}
	if stats.CPUNanos == 0 || stats.CPUNanos < -1 {
		t.Fatalf("Stats.CPUNanos = %d: a booted sandbox has used CPU (or say -1 for unknown)", stats.CPUNanos)
	}
	if stats.MemoryBytes != -1 && stats.MemoryBytes < 1<<20 {
		t.Fatalf("Stats.MemoryBytes = %d: a booted sandbox holds memory (or say -1 for unknown)", stats.MemoryBytes)
	}
	// With resources set, the CPU time is measured.
	id2 := newID()
	s2 := dial(t, start(t, rt, pandastack.RuntimeSpec{ID: id2, RootFS: env.RootFS, CPU: 1, MemoryMB: 256}))
	s2.exec(t, "true")
	s2.close()
	st, err := rt.Stats(ctx, id2)
	if err != nil || st.CPUNanos <= 0 {
		t.Fatalf("Stats of a sandbox with a CPU limit = %+v %v; want its CPU time", st, err)
	}
	// A runtime that reads the CPU time or memory alone reads what Stats
	// does.
	if ru, ok := rt.(pandastack.RuntimeUsage); ok {
		if n, err := ru.CPUNanos(ctx, id2); err != nil || n < st.CPUNanos {
			t.Fatalf("CPUNanos = %d %v after Stats said %d", n, err, st.CPUNanos)
		}
		if n, err := ru.MemoryBytes(ctx, id2); err != nil || (st.MemoryBytes != -1) != (n != -1) || n != -1 && n < 1<<20 {
			t.Fatalf("MemoryBytes = %d %v; Stats said %d", n, err, st.MemoryBytes)
		}
		if _, err := ru.CPUNanos(ctx, newID()); !pandastack.IsCode(err, pandastack.ENotFound) {
			t.Fatalf("CPUNanos of an unknown sandbox: %v, want not_found", err)
		}
		if _, err := ru.MemoryBytes(ctx, newID()); !pandastack.IsCode(err, pandastack.ENotFound) {
			t.Fatalf("MemoryBytes of an unknown sandbox: %v, want not_found", err)
		}
	}
	// A runtime that counts its host's out-of-memory kills counts none in
	// a sandbox that never came near its limit, and cannot tell of an
	// unknown one.
	if ro, ok := rt.(pandastack.RuntimeOOMKills); ok {
		if n := ro.OOMKills(id2); n != 0 {
			t.Fatalf("OOMKills of a sandbox far under its limit = %d, want 0", n)
		}
		if n := ro.OOMKills(newID()); n != -1 {
			t.Fatalf("OOMKills of an unknown sandbox = %d, want -1", n)
		}
	}
	rt.Stop(ctx, id2)
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if rt.Alive(id) {
		t.Fatal("Alive = true after Stop")
	}
	assertGone(t, rt, id)
}

func testAttach(t *testing.T, env Env) {
	rt := env.New(t)
	id := newID()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS})
	s1 := dial(t, rwc)
	if out, _ := s1.exec(t, "echo one > /tmp/x; cat /tmp/x"); out != "one\n" {
		t.Fatalf("first session: %q", out)
	}
	s1.close()
	rwc2, err := rt.Attach(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	s2 := dial(t, rwc2)
	defer s2.close()
	if out, _ := s2.exec(t, "cat /tmp/x"); out != "one\n" {
		t.Fatalf("after attach: %q, want the same sandbox", out)
	}
	if _, err := rt.Attach(context.Background(), "sbx_unknown"); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("Attach unknown: %v", err)
	}
}

func testStopIdempotent(t *testing.T, env Env) {
	rt := env.New(t)
	ctx := context.Background()
	if err := rt.Stop(ctx, "sbx_neverexisted"); err != nil {
		t.Fatalf("Stop unknown: %v", err)
	}
	id := newID()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS})
	rwc.Close()
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	assertGone(t, rt, id)
}

func testFailedStart(t *testing.T, env Env) {
	rt := env.New(t)
	id := newID()
	_, err := rt.Start(context.Background(), pandastack.RuntimeSpec{ID: id, RootFS: filepath.Join(os.TempDir(), "no-such-rootfs")})
	if err == nil {
		rt.Stop(context.Background(), id)
		t.Fatal("Start with a missing rootfs succeeded")
	}
	assertGone(t, rt, id)
}

func testDuplicateID(t *testing.T, env Env) {
	rt := env.New(t)
	id := newID()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS})
	if _, err := rt.Start(context.Background(), pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS}); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("second Start with the same id: %v, want conflict", err)
	}
	s := dial(t, rwc) // the first one is untouched
	defer s.close()
	if out, _ := s.exec(t, "echo alive"); out != "alive\n" {
		t.Fatalf("first sandbox: %q", out)
	}
}

func testMemoryLimit(t *testing.T, env Env) {
	rt := env.New(t)
	id := newID()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS, MemoryMB: 128})
	s := dial(t, rwc)
	defer s.close()
	s.seesMemory(t, 128)
	if out, _ := s.exec(t, "head -c 20000000 /dev/zero | tail -c 20000000 | wc -c"); strings.TrimSpace(out) != "20000000" {
		t.Fatalf("20 MB in a 128 MB sandbox: %q", out)
	}
	// tail keeps a newline-free input whole in memory: 400 MB in a 128 MB
	// sandbox must not succeed. Either a process of the command is killed
	// (then wc may still count what reached it, and exit 0) or the sandbox
	// is; on gVisor the host's cgroup limits the whole sandbox, and its OOM
	// killer takes a task before the sentry.
	start := time.Now()
	out, ev, err := s.tryExec("head -c 400000000 /dev/zero | tail -c 400000000 | wc -c")
	t.Logf("over-allocation ended after %s: out=%q exit=%+v err=%v", time.Since(start), out, ev, err)
	if err == nil && strings.TrimSpace(out) == "400000000" {
		t.Fatalf("allocating 400 MB in a 128 MB sandbox succeeded: %q", out)
	}
	if ro, ok := rt.(pandastack.RuntimeOOMKills); ok && err == nil {
		if n := ro.OOMKills(id); n == 0 {
			t.Fatalf("the sandbox lives after the over-allocation failed, and OOMKills = 0, want the host's kill counted (or -1: cannot tell)")
		}
	}
	if err != nil {
		// The whole sandbox was killed: the runtime must see it and say why.
		deadline := time.Now().Add(10 * time.Second)
		for rt.Alive(id) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if rt.Alive(id) {
			t.Fatal("the channel died but Alive still says true")
		}
		if r := rt.DeathReason(id); r != pandastack.ReasonOutOfMemory {
			t.Fatalf("DeathReason = %q, want %s", r, pandastack.ReasonOutOfMemory)
		}
	}
}

func testConcurrent(t *testing.T, env Env) {
	rt := env.New(t)
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := newID()
			rwc, err := rt.Start(context.Background(), pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS})
			if err != nil {
				t.Errorf("start %d: %v", i, err)
				return
			}
			defer rt.Stop(context.Background(), id)
			s := dial(t, rwc)
			defer s.close()
			want := fmt.Sprintf("n%d\n", i)
			if out, _ := s.exec(t, "echo n"+fmt.Sprint(i)); out != want {
				t.Errorf("sandbox %d: %q", i, out)
			}
		}(i)
	}
	wg.Wait()
}

func testContextDoesNotOwn(t *testing.T, env Env) {
	rt := env.New(t)
	id := newID()
	ctx, cancel := context.WithCancel(context.Background())
	rwc, err := rt.Start(ctx, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Stop(context.Background(), id)
	cancel()
	time.Sleep(200 * time.Millisecond)
	s := dial(t, rwc)
	defer s.close()
	if out, _ := s.exec(t, "echo still here"); out != "still here\n" {
		t.Fatalf("after the start context ended: %q", out)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A sandbox's disk is not its memory (issue 11 item 11): a file larger than
// the sandbox's memory fits on a larger disk, a full disk is ENOSPC to the
// writer (in /tmp too) and the sandbox lives on, and the disk's content and
// size come back with a restore.
func testDisk(t *testing.T, env Env) {
	rt := env.New(t)
	ctx := context.Background()
	id := newID()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS, MemoryMB: 128, DiskMB: 256})
	s := dial(t, rwc)
	defer s.close()
	if out, ev := s.exec(t, "head -c 200000000 /dev/zero > /home/user/big && wc -c < /home/user/big"); strings.TrimSpace(out) != "200000000" {
		t.Fatalf("200 MB onto a 256 MB disk of a 128 MB sandbox: %q, %+v", out, ev)
	}
	for _, p := range []string{"/home/user/more", "/tmp/more"} {
		out, ev, err := s.tryExec("dd if=/dev/zero of=" + p + " bs=1M count=100 2>&1; echo exit=$?")
		if err != nil {
			t.Fatalf("filling the disk through %s killed the sandbox: %v", p, err)
		}
		if !strings.Contains(out, "No space left on device") || strings.Contains(out, "exit=0") {
			t.Fatalf("filling the disk through %s: %q %+v, want ENOSPC", p, out, ev)
		}
		s.exec(t, "rm -f "+p)
	}
	if !rt.Alive(id) {
		t.Fatal("the sandbox died of a full disk")
	}
	s.exec(t, "rm /home/user/big && head -c 150000000 /dev/zero > /home/user/f")
	img := t.TempDir()
	if err := rt.Checkpoint(ctx, id, img, true); err != nil {
		t.Fatal(err)
	}
	cid := newID()
	crwc, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: cid, RootFS: env.RootFS, MemoryMB: 128}, img)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Stop(context.Background(), cid) })
	k := dial(t, crwc)
	defer k.close()
	if out, _ := k.exec(t, "wc -c < /home/user/f"); strings.TrimSpace(out) != "150000000" {
		t.Fatalf("the restored disk holds %q bytes of f", out)
	}
	if out, _, _ := k.tryExec("dd if=/dev/zero of=/home/user/g bs=1M count=150 2>&1; echo exit=$?"); !strings.Contains(out, "No space left on device") {
		t.Fatalf("the restored disk is not its 256 MB: writing 150 MB more gave %q", out)
	}
}

func testCheckpointRestore(t *testing.T, env Env) {
	rt := env.New(t)
	ctx := context.Background()
	id := newID()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS})
	parent := dial(t, rwc)
	defer parent.close()
	parent.exec(t, "echo before > /home/user/f; echo tmp > /tmp/t")
	img := t.TempDir()
	t0 := time.Now()
	if err := rt.Checkpoint(ctx, id, img, true); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint with leave-running took %s", time.Since(t0))
	// The parent keeps running, with its session.
	if out, _ := parent.exec(t, "cat /home/user/f; echo after > /home/user/f"); out != "before\n" {
		t.Fatalf("parent after checkpoint: %q", out)
	}
	// Two children from one image: each has the state at checkpoint time
	// and is independent afterwards.
	var kids []*session
	for i := 0; i < 2; i++ {
		cid := newID()
		t0 := time.Now()
		crwc, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: cid, RootFS: env.RootFS}, img)
		if err != nil {
			t.Fatalf("restore %d: %v", i, err)
		}
		t.Cleanup(func() { rt.Stop(context.Background(), cid) })
		k := dial(t, crwc)
		t.Logf("restore %d until hello took %s", i, time.Since(t0))
		defer k.close()
		kids = append(kids, k)
	}
	for i, k := range kids {
		if out, _ := k.exec(t, "cat /home/user/f /tmp/t"); out != "before\ntmp\n" {
			t.Fatalf("child %d sees %q", i, out)
		}
		k.exec(t, fmt.Sprintf("echo child%d > /home/user/f", i))
	}
	for i, k := range kids {
		if out, _ := k.exec(t, "cat /home/user/f"); out != fmt.Sprintf("child%d\n", i) {
			t.Fatalf("child %d not independent: %q", i, out)
		}
	}
	if out, _ := parent.exec(t, "cat /home/user/f"); out != "after\n" {
		t.Fatalf("parent changed by children: %q", out)
	}
}

func testPauseResume(t *testing.T, env Env) {
	rt := env.New(t)
	ctx := context.Background()
	id := newID()
	rwc := start(t, rt, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS})
	s := dial(t, rwc)
	s.exec(t, "echo kept > /home/user/f")
	s.close()
	img := t.TempDir()
	if err := rt.Checkpoint(ctx, id, img, false); err != nil {
		t.Fatal(err)
	}
	assertGone(t, rt, id)
	// A checkpoint of a sandbox that is gone fails saying so.
	if err := rt.Checkpoint(ctx, id, t.TempDir(), true); !pandastack.IsCode(err, pandastack.ENotFound) && !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("checkpoint of a paused sandbox: %v, want not_found or unavailable", err)
	}
	rwc2, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS}, img)
	if err != nil {
		t.Fatal(err)
	}
	s2 := dial(t, rwc2)
	defer s2.close()
	if out, _ := s2.exec(t, "cat /home/user/f"); out != "kept\n" {
		t.Fatalf("after resume: %q", out)
	}
}

// testLazyRestore checks a restore that lets the sandbox run while its
// memory still loads (RuntimeSpec.Lazy): the image's directory may go once
// Restore returns, a checkpoint taken right after it holds all of the
// memory, and both sandboxes see the 64 MiB file in memory they had.
func testLazyRestore(t *testing.T, env Env) {
	rt := env.New(t)
	ctx := context.Background()
	id := newID()
	spec := pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS, MemoryMB: 256}
	s := dial(t, start(t, rt, spec))
	want, _ := s.exec(t, "head -c 67108864 /dev/urandom > /dev/shm/r && md5sum < /dev/shm/r")
	s.close()
	if len(want) < 32 {
		t.Fatalf("writing 64 MiB to /dev/shm: %q", want)
	}
	img := t.TempDir()
	if err := rt.Checkpoint(ctx, id, img, false); err != nil {
		t.Fatal(err)
	}
	assertGone(t, rt, id)
	spec.Lazy = true
	rwc, err := rt.Restore(ctx, spec, img)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(img); err != nil {
		t.Fatal(err)
	}
	// Taken at once: the pages may still be loading.
	img2 := t.TempDir()
	if err := rt.Checkpoint(ctx, id, img2, true); err != nil {
		t.Fatalf("checkpoint right after a lazy restore: %v", err)
	}
	s = dial(t, rwc)
	if got, _ := s.exec(t, "md5sum < /dev/shm/r"); got != want {
		t.Fatalf("lazily restored, its image gone: /dev/shm/r sums to %q, want %q", got, want)
	}
	s.close()
	kid := newID()
	t.Cleanup(func() { rt.Stop(context.Background(), kid) })
	rwc, err = rt.Restore(ctx, pandastack.RuntimeSpec{ID: kid, RootFS: env.RootFS, MemoryMB: 256}, img2)
	if err != nil {
		t.Fatal(err)
	}
	k := dial(t, rwc)
	defer k.close()
	if got, _ := k.exec(t, "md5sum < /dev/shm/r"); got != want {
		t.Fatalf("restored from a checkpoint taken during a lazy load: /dev/shm/r sums to %q, want %q", got, want)
	}
}

func testRestoreCorrupt(t *testing.T, env Env) {
	rt := env.New(t)
	id := newID()
	_, err := rt.Restore(context.Background(), pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS}, t.TempDir())
	if !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
		t.Fatalf("restore from an empty dir: %v, want snapshot_corrupt", err)
	}
	assertGone(t, rt, id)
}

// restoreKept restores spec from img (what testPreparedRestore
// checkpointed) and checks the sandbox has the file and the memory (256
// MiB) it was taken with.
func restoreKept(t *testing.T, rt pandastack.Runtime, spec pandastack.RuntimeSpec, img, what string) {
	t.Helper()
	rwc, err := rt.Restore(context.Background(), spec, img)
	if err != nil {
		t.Fatalf("restore %s: %v", what, err)
	}
	s := dial(t, rwc)
	if out, _ := s.exec(t, "cat /home/user/f"); out != "kept\n" {
		t.Fatalf("restored %s: %q", what, out)
	}
	s.seesMemory(t, 256)
	s.close()
}

// testPreparedRestore checks pandastack.RuntimePreparer, for a driver that
// has it: a restore into a sandbox prepared for it brings the state back;
// a prepared sandbox is stopped (not running) until then, and Stop removes
// it; a restore with another spec than the one prepared still works; a
// second Prepare of the id is a conflict; a prepared sandbox renamed
// (Rename) restores and runs under its new id alone; one whose host
// processes died restores afresh; a failed Prepare leaves nothing.
func testPreparedRestore(t *testing.T, env Env) {
	rt := env.New(t)
	rp, ok := rt.(pandastack.RuntimePreparer)
	if !ok {
		t.Skip("the driver has no Prepare (optional)")
	}
	ctx := context.Background()
	id := newID()
	spec := pandastack.RuntimeSpec{ID: id, RootFS: env.RootFS, MemoryMB: 256}
	s := dial(t, start(t, rt, spec))
	s.exec(t, "echo kept > /home/user/f")
	s.close()
	img := t.TempDir()
	if err := rt.Checkpoint(ctx, id, img, false); err != nil {
		t.Fatal(err)
	}
	assertGone(t, rt, id)

	// Prepared, it holds the id but does not run; a second Prepare conflicts.
	if err := rp.Prepare(ctx, spec, img); err != nil {
		t.Fatalf("prepare: %v", err)
	}
	if st, err := rt.State(ctx, id); err != nil || st != pandastack.RuntimeStopped {
		t.Fatalf("state of a prepared sandbox: %v %v, want stopped", st, err)
	}
	if err := rp.Prepare(ctx, spec, img); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("second prepare: %v, want conflict", err)
	}
	restoreKept(t, rt, spec, img, "into the prepared sandbox")
	if st, err := rt.State(ctx, id); err != nil || st != pandastack.RuntimeRunning {
		t.Fatalf("state after a prepared restore: %v %v", st, err)
	}

	// Prepared for one spec, restored with another: a fresh restore.
	kid := newID()
	t.Cleanup(func() { rt.Stop(context.Background(), kid) })
	if err := rp.Prepare(ctx, pandastack.RuntimeSpec{ID: kid, RootFS: env.RootFS, MemoryMB: 512}, img); err != nil {
		t.Fatal(err)
	}
	restoreKept(t, rt, pandastack.RuntimeSpec{ID: kid, RootFS: env.RootFS, MemoryMB: 256}, img, "with another spec than prepared")
	if err := rt.Stop(ctx, kid); err != nil {
		t.Fatal(err)
	}
	assertGone(t, rt, kid)

	// Prepared under one id, renamed to another and restored as that: the
	// state comes back, every call names it by the new id, nothing answers
	// to the old one, and a pause (checkpoint, not left running) leaves
	// nothing of either.
	standby, renamed := newID(), newID()
	t.Cleanup(func() { rt.Stop(context.Background(), renamed) })
	if err := rp.Prepare(ctx, pandastack.RuntimeSpec{ID: standby, RootFS: env.RootFS, MemoryMB: 256}, img); err != nil {
		t.Fatal(err)
	}
	if err := rp.Rename(ctx, newID(), renamed); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("rename of an id never prepared: %v, want not_found", err)
	}
	if err := rp.Rename(ctx, standby, id); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("rename to an id the runtime holds: %v, want conflict", err)
	}
	if err := rp.Rename(ctx, standby, renamed); err != nil {
		t.Fatalf("rename: %v", err)
	}
	if st, err := rt.State(ctx, renamed); err != nil || st != pandastack.RuntimeStopped {
		t.Fatalf("state of a renamed prepared sandbox: %v %v, want stopped", st, err)
	}
	if _, err := rt.State(ctx, standby); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("state of the old id after a rename: %v, want not_found", err)
	}
	restoreKept(t, rt, pandastack.RuntimeSpec{ID: renamed, RootFS: env.RootFS, MemoryMB: 256}, img, "into a renamed prepared sandbox")
	if st, err := rt.State(ctx, renamed); err != nil || st != pandastack.RuntimeRunning || !rt.Alive(renamed) {
		t.Fatalf("state of the renamed sandbox: %v %v, alive %v", st, err, rt.Alive(renamed))
	}
	if st, err := rt.Stats(ctx, renamed); err != nil || len(st.PIDs) == 0 || st.PSSBytes == 0 {
		t.Fatalf("stats of the renamed sandbox: %+v %v", st, err)
	}
	ids, err := rt.List(ctx)
	if err != nil || !slices.Contains(ids, renamed) || slices.Contains(ids, standby) {
		t.Fatalf("List after a rename: %v %v, want %s and not %s", ids, err, renamed, standby)
	}
	if c, err := rt.Attach(ctx, renamed); err != nil {
		t.Fatalf("attach to the renamed sandbox: %v", err)
	} else {
		c.Close()
	}
	if err := rt.Checkpoint(ctx, renamed, t.TempDir(), false); err != nil {
		t.Fatalf("pause of the renamed sandbox: %v", err)
	}
	assertGone(t, rt, renamed)
	assertGone(t, rt, standby)

	// Prepared, then its host processes died (the host's OOM killer, a
	// crash): the restore still brings the state back, afresh.
	dead := newID()
	t.Cleanup(func() { rt.Stop(context.Background(), dead) })
	if err := rp.Prepare(ctx, pandastack.RuntimeSpec{ID: dead, RootFS: env.RootFS, MemoryMB: 256}, img); err != nil {
		t.Fatal(err)
	}
	pids := pgrep(dead)
	if len(pids) == 0 {
		t.Fatalf("no host process of the prepared sandbox %s to kill", dead)
	}
	for _, pid := range pids {
		exec.Command("kill", "-9", pid).Run()
	}
	restoreKept(t, rt, pandastack.RuntimeSpec{ID: dead, RootFS: env.RootFS, MemoryMB: 256}, img, "after its prepared sandbox died")
	if err := rt.Stop(ctx, dead); err != nil {
		t.Fatal(err)
	}
	assertGone(t, rt, dead)

	// Prepared and never restored: Stop removes it.
	other := newID()
	if err := rp.Prepare(ctx, pandastack.RuntimeSpec{ID: other, RootFS: env.RootFS}, img); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, other); err != nil {
		t.Fatal(err)
	}
	assertGone(t, rt, other)

	// No image: refused, nothing left.
	bad := newID()
	if err := rp.Prepare(ctx, pandastack.RuntimeSpec{ID: bad, RootFS: env.RootFS}, t.TempDir()); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
		t.Fatalf("prepare from an empty dir: %v, want snapshot_corrupt", err)
	}
	assertGone(t, rt, bad)
}
