package agent

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestHelloListsReadyContexts: the hello names the contexts whose kernel
// has started, oldest first, so the host can run in them without asking;
// one still starting is left out (a run in it would be refused).
func TestHelloListsReadyContexts(t *testing.T) {
	cs := NewContexts()
	cs.ctxs["ctx_default_python"] = &codeContext{info: agentproto.Context{ID: "ctx_default_python"}, kernel: &jupyter.Kernel{}, created: 1}
	cs.ctxs["ctx_b"] = &codeContext{info: agentproto.Context{ID: "ctx_b"}, kernel: &jupyter.Kernel{}, created: 3}
	cs.ctxs["ctx_a"] = &codeContext{info: agentproto.Context{ID: "ctx_a"}, kernel: &jupyter.Kernel{}, created: 2}
	cs.ctxs["ctx_starting"] = &codeContext{info: agentproto.Context{ID: "ctx_starting"}, created: 4}
	h := NewServer(Config{Home: t.TempDir(), Contexts: cs}, 1).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello", nil))
	var out agentproto.Hello
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
		t.Fatalf("hello: %d %s", rec.Code, rec.Body)
	}
	if want := []string{"ctx_default_python", "ctx_a", "ctx_b"}; !slices.Equal(out.Contexts, want) {
		t.Fatalf("hello lists contexts %q, want %q", out.Contexts, want)
	}

	// No context: the field is left out, as an older agent's.
	h = NewServer(Config{Home: t.TempDir()}, 1).Handler()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello", nil))
	var raw map[string]any
	if json.Unmarshal(rec.Body.Bytes(), &raw) != nil || raw["contexts"] != nil {
		t.Fatalf("hello of an agent without contexts: %s", rec.Body)
	}
}

// TestHelloHoldsSpares: a hello with hold_spares=1 ends every hold (and a
// release for a suspend) and leaves one, which one DELETE ends; a hello
// without it leaves none.
func TestHelloHoldsSpares(t *testing.T) {
	cs := NewContexts()
	sp := &cs.spares
	sp.kick = make(chan struct{}, 1)
	sp.held, sp.released = 3, true
	h := NewServer(Config{Home: t.TempDir(), Contexts: cs}, 1).Handler()
	call := func(method, path string, want int) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		if rec.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, rec.Code, rec.Body, want)
		}
	}
	state := func() (int, bool, int) {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		return sp.held, sp.released, len(sp.kick)
	}
	call("GET", "/v1/hello?hold_spares=1", http.StatusOK)
	if held, released, kicks := state(); held != 1 || released || kicks != 0 {
		t.Fatalf("after a hello with hold_spares: held %d, released %v, %d wake-ups; want 1, false, 0", held, released, kicks)
	}
	call("DELETE", "/v1/contexts/spares/hold", http.StatusNoContent)
	if held, _, kicks := state(); held != 0 || kicks != 1 {
		t.Fatalf("after the host's DELETE: held %d, %d wake-ups; want 0 and 1", held, kicks)
	}
	<-sp.kick
	sp.mu.Lock()
	sp.held = 2
	sp.mu.Unlock()
	call("GET", "/v1/hello", http.StatusOK)
	if held, _, kicks := state(); held != 0 || kicks != 1 {
		t.Fatalf("after a plain hello: held %d, %d wake-ups; want 0 and 1", held, kicks)
	}
}

// TestHelloDoesTheSetup: a hello asked for the host's setup writes the
// resolver (replacing a symlink there rather than writing through it) and
// reports the CA marker; an address that is not one is refused; a plain
// hello touches neither and reports no marker, as an older agent's.
func TestHelloDoesTheSetup(t *testing.T) {
	dir := t.TempDir()
	resolv, marker, stub := filepath.Join(dir, "etc", "resolv.conf"), filepath.Join(dir, "ca.sha256"), filepath.Join(dir, "stub")
	os.MkdirAll(filepath.Dir(resolv), 0o755)
	os.WriteFile(stub, []byte("nameserver 127.0.0.53\n"), 0o644)
	if err := os.Symlink(stub, resolv); err != nil {
		t.Fatal(err)
	}
	h := NewServer(Config{Home: t.TempDir(), ResolvConf: resolv, CAMarker: marker}, 1).Handler()
	hello := func(query string, want int) agentproto.Hello {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello"+query, nil))
		var out agentproto.Hello
		if rec.Code != want || (want == http.StatusOK && json.Unmarshal(rec.Body.Bytes(), &out) != nil) {
			t.Fatalf("hello%s: %d %s, want %d", query, rec.Code, rec.Body, want)
		}
		return out
	}
	out := hello("", http.StatusOK)
	if out.Resolver != "" || out.CAMarker != nil || !out.HasFeature(agentproto.FeatureRunCreates) {
		t.Fatalf("plain hello: resolver %q, marker %v, features %q", out.Resolver, out.CAMarker, out.Features)
	}
	if fi, err := os.Lstat(resolv); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("a plain hello changed the resolver: %v %v", fi, err)
	}

	out = hello("?resolver=10.11.0.1&ca_marker=1", http.StatusOK)
	if out.Resolver != "10.11.0.1" || out.CAMarker == nil || *out.CAMarker != "" {
		t.Fatalf("setup hello without a marker: resolver %q, marker %v", out.Resolver, out.CAMarker)
	}
	if b, err := os.ReadFile(resolv); err != nil || string(b) != agentproto.ResolvConf("10.11.0.1") {
		t.Fatalf("resolv.conf: %q %v", b, err)
	}
	if b, _ := os.ReadFile(stub); string(b) != "nameserver 127.0.0.53\n" {
		t.Fatalf("the symlink's target was written through: %q", b)
	}
	if fi, _ := os.Stat(resolv); fi.Mode().Perm() != 0o644 {
		t.Fatalf("resolv.conf mode %v, want 0644", fi.Mode().Perm())
	}

	os.WriteFile(marker, []byte("abc123\n"), 0o644)
	if out = hello("?ca_marker=1", http.StatusOK); out.CAMarker == nil || *out.CAMarker != "abc123" {
		t.Fatalf("marker: %v", out.CAMarker)
	}

	hello("?resolver=10.11.0.1%0Anameserver+1.1.1.1", http.StatusBadRequest)
	if b, _ := os.ReadFile(resolv); string(b) != agentproto.ResolvConf("10.11.0.1") {
		t.Fatalf("a refused hello changed resolv.conf: %q", b)
	}
	if ents, _ := os.ReadDir(filepath.Dir(resolv)); len(ents) != 1 {
		t.Fatalf("temp files left beside resolv.conf: %v", ents)
	}
}

// TestHelloWritesTheNameFiles: every hello makes the sandbox's name and
// localhost resolve: a missing /etc/hosts is written, one the agent wrote
// for another name (a restored image's) is rewritten, a template's own is
// kept; /etc/hostname says the sandbox's name, not the build host's.
func TestHelloWritesTheNameFiles(t *testing.T) {
	name, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	hosts, hostname := filepath.Join(dir, "hosts"), filepath.Join(dir, "hostname")
	os.WriteFile(hostname, []byte("buildhost\n"), 0o644)
	names := &NameFiles{}
	h := NewServer(Config{Home: t.TempDir(), Hosts: hosts, Hostname: hostname, Names: names}, 1).Handler()
	hello := func() {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("hello: %d %s", rec.Code, rec.Body)
		}
		names.wait(t.Context()) // what an exec or a run waits for
	}
	read := func(p string) string {
		b, _ := os.ReadFile(p)
		return string(b)
	}

	hello()
	got := read(hosts)
	if !strings.Contains(got, "127.0.0.1\tlocalhost\n") || !strings.Contains(got, "::1\tlocalhost") || !strings.Contains(got, "\t"+name+"\n") {
		t.Fatalf("/etc/hosts:\n%s", got)
	}
	if got := read(hostname); got != name+"\n" {
		t.Fatalf("/etc/hostname %q, want %q", got, name+"\n")
	}

	// Restored from an image made by a sandbox of another name, whose user
	// added a line of their own: the agent's block is rewritten, the
	// user's line kept.
	own := "10.0.0.9\tdb.internal\n"
	os.WriteFile(hosts, []byte(hostsFile("sbx-other")+own), 0o644)
	os.WriteFile(hostname, []byte("sbx-other\n"), 0o644)
	hello()
	if read(hosts) != hostsFile(name)+own || read(hostname) != name+"\n" {
		t.Fatalf("after a restore: hosts\n%s\nhostname %q", read(hosts), read(hostname))
	}

	os.WriteFile(hosts, []byte(own), 0o644)
	hello()
	if read(hosts) != own {
		t.Fatalf("the template's /etc/hosts was replaced:\n%s", read(hosts))
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Fatalf("temp files left: %v", ents)
	}
}

// A command waits for the name files the last hello is writing: the
// first command of a new sandbox finds localhost resolving.
func TestExecWaitsForTheNameFiles(t *testing.T) {
	release := make(chan struct{})
	names := &NameFiles{}
	names.begin(func() { <-release })()
	h := NewServer(Config{Home: t.TempDir(), Names: names}, 1).Handler()
	done := make(chan int, 1)
	go func() {
		b, _ := json.Marshal(agentproto.ExecRequest{Cmd: "true", Root: true})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/exec", bytes.NewReader(b)))
		if rec.Code != http.StatusOK {
			t.Logf("%s", rec.Body)
		}
		done <- rec.Code
	}()
	select {
	case code := <-done:
		t.Fatalf("exec answered %d while the name files were being written", code)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case code := <-done:
		if code != http.StatusOK {
			t.Fatalf("exec after the names: %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("exec still waiting after the name files were written")
	}
}

// TestRestoredGivesContextsTheID: a hello naming the sandbox's id (a
// fork's child, a restore from a snapshot) marks every context whose
// kernel had another id as having this one (the cell that sets it is
// queued; these kernels have no process to run it), and leaves the others.
func TestRestoredGivesContextsTheID(t *testing.T) {
	cs := NewContexts()
	cs.spares.log = func(string, ...any) {}
	old := &codeContext{info: agentproto.Context{ID: "ctx_old", Language: "python"}, kernel: &jupyter.Kernel{}, sandboxID: "sbx_parent"}
	bash := &codeContext{info: agentproto.Context{ID: "ctx_bash", Language: "bash"}, kernel: &jupyter.Kernel{}, sandboxID: "sbx_parent"}
	cur := &codeContext{info: agentproto.Context{ID: "ctx_cur", Language: "python"}, kernel: &jupyter.Kernel{}, sandboxID: "sbx_child"}
	starting := &codeContext{info: agentproto.Context{ID: "ctx_starting", Language: "python"}}
	for _, cc := range []*codeContext{old, bash, cur, starting} {
		cs.ctxs[cc.info.ID] = cc
	}
	cs.Restored("", true) // no id: ids are left alone
	if old.sandboxID != "sbx_parent" {
		t.Fatalf("a hello without an id changed a context's to %q", old.sandboxID)
	}
	cs.Restored("sbx_child", false)
	for _, cc := range []*codeContext{old, bash, cur} {
		if cc.sandboxID != "sbx_child" {
			t.Errorf("context %s has id %q after the hello, want sbx_child", cc.info.ID, cc.sandboxID)
		}
	}
	if starting.sandboxID != "" {
		t.Errorf("a context still starting got id %q (its kernel will start with the agent's)", starting.sandboxID)
	}
}
