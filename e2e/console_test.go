package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pandastack/pandastack/client"
)

// readTerm reads the terminal until prev and its output since contain want
// (or, with want "", until the shell exits), and returns both.
func readTerm(t *testing.T, term *client.Terminal, prev, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out strings.Builder
	out.WriteString(prev)
	for {
		p, err := term.Read(ctx)
		if errors.Is(err, io.EOF) && want == "" {
			return out.String()
		}
		if err != nil {
			t.Fatalf("terminal read (waiting for %q; output so far %q): %v", want, out.String(), err)
		}
		out.Write(p)
		if want != "" && strings.Contains(out.String(), want) {
			return out.String()
		}
	}
}

func TestTerminal(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 600})

	term, err := c.OpenTerminal(ctx, sb.ID, 100, 30)
	if err != nil {
		t.Fatalf("open terminal: %v\n%s", err, tail(s.out.String(), 20))
	}
	type_ := func(keys string) {
		if err := term.Write(ctx, []byte(keys)); err != nil {
			t.Fatal(err)
		}
	}
	// A real terminal, a shell that evaluates, the sandbox user.
	type_("PS1='e2e> '; echo A$((6*7))B; tty; stty size; id -un | sed s/^/who:/\r")
	out := readTerm(t, term, "", "A42B")
	out = readTerm(t, term, out, "who:user")
	for _, want := range []string{"/dev/pts/", "30 100", "who:user"} {
		if !strings.Contains(out, want) {
			t.Errorf("terminal output %q lacks %q", out, want)
		}
	}
	// Resized at the next prompt: readline reads the size and writes it
	// back as it takes the terminal for a new line, so a resize landing in
	// between is undone (internal/agent's TestPTYShell met it under load).
	readTerm(t, term, out[strings.LastIndex(out, "who:user"):], "e2e> ")
	if err := term.Resize(ctx, 120, 40); err != nil {
		t.Fatal(err)
	}
	type_("stty size\r")
	readTerm(t, term, "", "40 120")

	// An open terminal is work in flight: no snapshot meanwhile.
	if st, code, _ := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", "{}"); st != http.StatusConflict || code != "conflict" {
		t.Errorf("snapshot with a terminal open: %d %s, want 409 conflict", st, code)
	}
	type_("exit 7\r")
	readTerm(t, term, "", "")
	if term.ExitCode == nil || *term.ExitCode != 7 {
		t.Errorf("exit code %v, want 7", term.ExitCode)
	}
	term.Close()

	// Hanging up kills what the shell started.
	term, err = c.OpenTerminal(ctx, sb.ID, 80, 24)
	if err != nil {
		t.Fatal(err)
	}
	type_("sleep 987654 & echo bg$((1+1))\r")
	readTerm(t, term, "", "bg2")
	term.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c "sleep 98765[4]"`})
		if err == nil && strings.TrimSpace(res.Stdout) == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal's background job outlived the hang-up: %+v %v", res, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The session released the sandbox: a snapshot now works.
	if st, _, msg := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", "{}"); st != http.StatusCreated {
		t.Errorf("snapshot after the terminal closed: %d %s", st, msg)
	}

	// A snapshot right after a close is not refused: it waits for the
	// session's teardown (the agent killing the shell and its jobs).
	for i := range 3 {
		term, err = c.OpenTerminal(ctx, sb.ID, 80, 24)
		if err != nil {
			t.Fatal(err)
		}
		type_("sleep 987655 & echo up$((1+1))\r")
		readTerm(t, term, "", "up2")
		term.Close()
		if st, _, msg := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", "{}"); st != http.StatusCreated {
			t.Errorf("snapshot right after a terminal's close (%d): %d %s", i, st, msg)
		}
	}

	// A terminal whose sandbox stops under it says so.
	doomed := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 600})
	term, err = c.OpenTerminal(ctx, doomed.ID, 80, 24)
	if err != nil {
		t.Fatal(err)
	}
	type_("echo up$((2+2))\r")
	readTerm(t, term, "", "up4")
	if err := c.KillSandbox(ctx, doomed.ID); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	for {
		_, err := term.Read(rctx)
		if err == nil {
			continue
		}
		if !client.IsCode(err, "sandbox_stopped") || !strings.Contains(err.Error(), "was killed") {
			t.Errorf("a terminal of a sandbox killed under it: %v, want sandbox_stopped saying it was killed", err)
		}
		break
	}
	term.Close()

	// Bad input, and other projects.
	if st, code, _ := api(t, s, s.key, "GET", "/v1/sandboxes/"+sb.ID+"/pty", ""); st != 400 || code != "invalid_request" {
		t.Errorf("pty without a WebSocket upgrade: %d %s, want 400 invalid", st, code)
	}
	if _, err := c.OpenTerminal(ctx, sb.ID, 0, 24); !client.IsCode(err, "invalid_request") {
		t.Errorf("cols 0: %v, want invalid", err)
	}
	other := client.New(s.url, s.newKey("terminal-other"))
	if _, err := other.OpenTerminal(ctx, sb.ID, 80, 24); !client.IsCode(err, "not_found") {
		t.Errorf("another project's terminal: %v, want not_found", err)
	}
	if _, err := client.New(s.url, "pds_nope").OpenTerminal(ctx, sb.ID, 80, 24); !client.IsCode(err, "unauthorized") {
		t.Errorf("unknown key: %v, want unauthorized", err)
	}
}

type historyEntry struct {
	Kind       string   `json:"kind"`
	Command    string   `json:"command"`
	Code       string   `json:"code"`
	Language   string   `json:"language"`
	Running    bool     `json:"running"`
	Stdout     string   `json:"stdout"`
	Text       string   `json:"text"`
	Results    []string `json:"results"`
	ExitCode   *int     `json:"exit_code"`
	Failure    string   `json:"failure"`
	Background bool     `json:"background"`
	PID        int      `json:"pid"`
	Error      *struct {
		Name      string `json:"name"`
		Traceback string `json:"traceback"`
	} `json:"error"`
}

// GET …/stats counts what the sandbox's code uses: memory a cell holds and
// CPU a cell burns, which run in processes the sentry's own figures miss.
func TestStatsCountTheSandboxsCode(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600, MemoryMB: 1024})
	type stats struct {
		MemoryBytes int64   `json:"memory_bytes"`
		CPUSeconds  float64 `json:"cpu_seconds"`
	}
	get := func() stats {
		var st stats
		if code, body := rawJSON(t, s, "GET", "/v1/sandboxes/"+sb.ID+"/stats", "", &st); code != 200 {
			t.Fatalf("stats: %d %s", code, body)
		}
		return st
	}
	before := get()
	res, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "import time\nheld = b'\\x01' * (300 << 20)\nt = time.process_time()\nwhile time.process_time() - t < 2: pass\nlen(held) >> 20"})
	if err != nil || res.Text != "300" {
		t.Fatalf("the cell: %+v %v", res, err)
	}
	after := get()
	if grew := after.MemoryBytes - before.MemoryBytes; grew < 200<<20 {
		t.Errorf("memory_bytes grew by %d MiB (%d → %d) while a cell holds 300 MiB", grew>>20, before.MemoryBytes>>20, after.MemoryBytes>>20)
	}
	if grew := after.CPUSeconds - before.CPUSeconds; grew < 1.5 {
		t.Errorf("cpu_seconds grew by %.2f (%.2f → %.2f) over a cell that used 2 s of CPU", grew, before.CPUSeconds, after.CPUSeconds)
	}
}

func TestHistoryAndStats(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})

	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo from-exec; exit 3"}); err != nil {
		t.Fatal(err)
	}
	var bg struct{ PID int }
	if st, body := rawJSON(t, s, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd": "echo in-the-background", "background": true}`, &bg); st != 200 {
		t.Fatalf("background exec: %d %s", st, body)
	}
	if _, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "import matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()\n6 * 7"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "1 / 0"}); err != nil {
		t.Fatal(err)
	}
	term, err := c.OpenTerminal(ctx, sb.ID, 80, 24)
	if err != nil {
		t.Fatal(err)
	}
	term.Write(ctx, []byte("echo T$((6*7))T\r"))
	readTerm(t, term, "", "T42T")
	term.Close()

	var h struct{ History []historyEntry }
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, body := rawJSON(t, s, "GET", "/v1/sandboxes/"+sb.ID+"/history", "", &h); st != 200 {
			t.Fatalf("history: %d %s", st, body)
		}
		if len(h.History) > 0 && !h.History[0].Running {
			break // the terminal's entry ends once the server saw the hang-up
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal's entry still runs: %+v", h.History[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(h.History) != 5 {
		t.Fatalf("history has %d entries, want 5: %+v", len(h.History), h.History)
	}
	term0, zero, cell, back, ex := h.History[0], h.History[1], h.History[2], h.History[3], h.History[4]
	if term0.Kind != "terminal" || !strings.Contains(term0.Stdout, "T42T") || strings.Contains(term0.Stdout, "\x1b") {
		t.Errorf("newest entry = %+v, want the terminal with T42T in a plain transcript", term0)
	}
	// Closed by its client, not exited: no exit status (it said -1), no failure.
	if term0.ExitCode != nil || term0.Failure != "" {
		t.Errorf("a terminal its client closed: exit code %v, failure %q; want neither", term0.ExitCode, term0.Failure)
	}
	if zero.Kind != "code" || zero.Error == nil || zero.Error.Name != "ZeroDivisionError" || !strings.Contains(zero.Error.Traceback, "1 / 0") {
		t.Errorf("second entry = %+v, want the 1 / 0 cell with its ZeroDivisionError", zero)
	}
	if cell.Kind != "code" || cell.Language != "python" || cell.Text != "42" || len(cell.Results) == 0 || cell.Results[0] != "png" {
		t.Errorf("third entry = %+v, want the plotting cell: text 42, a png", cell)
	}
	if back.Kind != "exec" || back.Command != "echo in-the-background" || !back.Background || back.PID != bg.PID || back.Running || back.ExitCode != nil || back.Failure != "" {
		t.Errorf("fourth entry = %+v, want the background exec as it started, pid %d", back, bg.PID)
	}
	if ex.Kind != "exec" || ex.Command != "echo from-exec; exit 3" || ex.Stdout != "from-exec\n" || ex.ExitCode == nil || *ex.ExitCode != 3 {
		t.Errorf("oldest entry = %+v, want the exec with exit 3", ex)
	}

	var st struct {
		MemoryBytes      int64   `json:"memory_bytes"`
		MemoryLimitBytes int64   `json:"memory_limit_bytes"`
		CPUSeconds       float64 `json:"cpu_seconds"`
		CPULimit         int     `json:"cpu_limit"`
	}
	if code, body := rawJSON(t, s, "GET", "/v1/sandboxes/"+sb.ID+"/stats", "", &st); code != 200 {
		t.Fatalf("stats: %d %s", code, body)
	}
	if st.MemoryBytes < 10<<20 || st.MemoryLimitBytes != int64(sb.MemoryMB)<<20 || st.CPUSeconds <= 0 || st.CPULimit != sb.CPU {
		t.Errorf("stats = %+v for a sandbox of %d CPU, %d MiB that ran a kernel", st, sb.CPU, sb.MemoryMB)
	}

	// Another project sees neither; the history outlives a kill.
	otherKey := s.newKey("history-other")
	for _, p := range []string{"/history", "/stats"} {
		if code, ecode, _ := api(t, s, otherKey, "GET", "/v1/sandboxes/"+sb.ID+p, ""); code != 404 || ecode != "not_found" {
			t.Errorf("another project's %s: %d %s, want 404", p, code, ecode)
		}
	}
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if code, _ := rawJSON(t, s, "GET", "/v1/sandboxes/"+sb.ID+"/history", "", &h); code != 200 || len(h.History) != 5 {
		t.Errorf("history after kill: %d, %d entries", code, len(h.History))
	}
	if code, ecode, _ := api(t, s, s.key, "GET", "/v1/sandboxes/sbx_never/history", ""); code != 404 || ecode != "not_found" {
		t.Errorf("history of an unknown sandbox: %d %s, want 404", code, ecode)
	}
}

// A revoked key stops working everywhere: what it has open (a terminal, a
// streamed exec, a port token) ends too, at once when it is revoked through
// the API, within seconds when `pandastack keys revoke` does it beside the
// running server. The project's other keys go on.
func TestRevokedKeyEndsWhatItOpened(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	k1, k2, k3 := s.newKey("revoke-live"), s.newKey("revoke-live"), s.newKey("revoke-live")
	c1, c2, c3 := client.New(s.url, k1), client.New(s.url, k2), client.New(s.url, k3)
	sb, err := c2.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.KillSandbox(context.Background(), sb.ID)
	// ends reports when the terminal's reads stop.
	ends := func(term *client.Terminal) chan error {
		ch := make(chan error, 1)
		go func() {
			for {
				if _, err := term.Read(ctx); err != nil {
					ch <- err
					return
				}
			}
		}()
		return ch
	}
	within := func(what string, ch chan error) {
		t.Helper()
		select {
		case err := <-ch:
			if !strings.Contains(fmt.Sprint(err), "revoked") {
				t.Errorf("%s ended with %v, want the revocation", what, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s still open 30 s after its key was revoked", what)
		}
	}
	term1, err := c1.OpenTerminal(ctx, sb.ID, 80, 24)
	if err != nil {
		t.Fatal(err)
	}
	defer term1.Close()
	term1Done := ends(term1)
	execDone := make(chan error, 1)
	go func() {
		_, err := c1.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 120", TimeoutSeconds: 200}, func(client.ExecEvent) {})
		execDone <- err
	}()
	tok, err := c1.CreatePortToken(ctx, sb.ID, 8000, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	term3, err := c3.OpenTerminal(ctx, sb.ID, 80, 24)
	if err != nil {
		t.Fatal(err)
	}
	defer term3.Close()
	term3Done := ends(term3)
	// A streamed cell, which has printed a line.
	cell, err := c2.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.KillSandbox(context.Background(), cell.ID)
	if _, err := c2.RunCode(ctx, cell.ID, client.RunRequest{Code: "1"}); err != nil {
		t.Fatal(err)
	}
	printed, runDone := make(chan struct{}), make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := c1.RunStream(ctx, cell.ID, "ctx_default_python", client.RunRequest{Code: "import time\nprint('before', flush=True)\ntime.sleep(120)"}, func(ev client.CodeEvent) {
			if ev.Type == "stdout" {
				once.Do(func() { close(printed) })
			}
		})
		runDone <- err
	}()
	select {
	case <-printed:
	case err := <-runDone:
		t.Fatalf("the cell ended before it printed: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the cell printed nothing in 30 s")
	}
	watching, watchDone := make(chan struct{}), make(chan error, 1)
	go func() {
		var once sync.Once
		watchDone <- c1.WatchDir(ctx, sb.ID, "/home/user", false, func(ev client.FileEvent) error {
			once.Do(func() { close(watching) })
			return nil
		})
	}()
	select {
	case <-watching:
	case err := <-watchDone:
		t.Fatalf("the watch ended before it began: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the watch said nothing in 30 s")
	}
	time.Sleep(500 * time.Millisecond) // the exec is under way

	// Through the API, by another key of the project.
	var list struct {
		APIKeys []struct {
			ID     string `json:"id"`
			Prefix string `json:"prefix"`
		} `json:"api_keys"`
	}
	req, _ := http.NewRequest("GET", s.url+"/v1/api-keys", nil)
	req.Header.Set("Authorization", "Bearer "+k2)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	decodeJSON(t, resp, &list)
	id1 := ""
	for _, k := range list.APIKeys {
		if strings.HasPrefix(k1, k.Prefix) {
			id1 = k.ID
		}
	}
	if code, _, msg := api(t, s, k2, "DELETE", "/v1/api-keys/"+id1, ""); code != 204 {
		t.Fatalf("revoke %q: %d %s", id1, code, msg)
	}
	within("a terminal", term1Done)
	within("a streamed exec", execDone)
	within("a streamed cell", runDone)
	within("a directory watch", watchDone)
	resp, err = http.Get(tok.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("the port token of a revoked key: %d, want 401", resp.StatusCode)
	}
	// Beside the server, with the CLI.
	if _, errOut, err := s.cli("keys", "revoke", k3[:10]); err != nil {
		t.Fatalf("keys revoke: %v %s", err, errOut)
	}
	within("a terminal of a key revoked with the CLI", term3Done)
	if res, err := c2.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo still-mine"}); err != nil || strings.TrimSpace(res.Stdout) != "still-mine" {
		t.Errorf("the project's other key after the revokes: %+v %v", res, err)
	}
	// The history says why the terminals ended: no exit status, the
	// revocation. The server records a terminal's end just after its
	// socket closes: read until no terminal entry is running.
	var h struct{ History []historyEntry }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		req, _ = http.NewRequest("GET", s.url+"/v1/sandboxes/"+sb.ID+"/history", nil)
		req.Header.Set("Authorization", "Bearer "+k2)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		h.History = nil
		err = json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil {
			t.Fatalf("history: %d %v", resp.StatusCode, err)
		}
		if !slices.ContainsFunc(h.History, func(e historyEntry) bool { return e.Kind == "terminal" && e.Running }) || time.Now().After(deadline) {
			break
		}
	}
	terms := 0
	for _, e := range h.History {
		if e.Kind == "terminal" {
			terms++
			if e.ExitCode != nil || !strings.Contains(e.Failure, "revoked") {
				t.Errorf("a terminal whose key was revoked: exit code %v, failure %q; want the revocation", e.ExitCode, e.Failure)
			}
		}
	}
	if terms != 2 {
		t.Errorf("%d terminal entries, want 2", terms)
	}
	// The cell's entry keeps what it printed and says why it ended.
	req, _ = http.NewRequest("GET", s.url+"/v1/sandboxes/"+cell.ID+"/history", nil)
	req.Header.Set("Authorization", "Bearer "+k2)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	h.History = nil
	decodeJSON(t, resp, &h)
	i := slices.IndexFunc(h.History, func(e historyEntry) bool { return strings.Contains(e.Code, "before") })
	if i < 0 {
		t.Fatalf("no history entry of the cut cell: %+v", h.History)
	}
	if e := h.History[i]; !strings.Contains(e.Stdout, "before") || !strings.Contains(e.Failure, "revoked") || e.Error != nil {
		t.Errorf("the cell whose key was revoked: stdout %q, failure %q, error %+v; want its output and the revocation", e.Stdout, e.Failure, e.Error)
	}
}

func TestAPIKeysAndLineage(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	// A project of its own, so its key list is only this test's.
	admin := s.newKey("keys-test")
	var created struct {
		ID     string `json:"id"`
		Name   string `json:"name"`
		Prefix string `json:"prefix"`
		Secret string `json:"secret"`
	}
	req, _ := http.NewRequest("POST", s.url+"/v1/api-keys", strings.NewReader(`{"name":"ci"}`))
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	decodeJSON(t, resp, &created)
	if resp.StatusCode != 201 || !strings.HasPrefix(created.Secret, "pds_") || created.Name != "ci" || !strings.HasPrefix(created.Secret, created.Prefix) {
		t.Fatalf("create key: %d %+v", resp.StatusCode, created)
	}
	if code, _, _ := api(t, s, created.Secret, "GET", "/v1/sandboxes", ""); code != 200 {
		t.Fatalf("the new key does not work: %d", code)
	}
	// A key of scope sandboxes (for an agent) uses the API but cannot
	// manage the project's keys: it cannot make itself a lasting one.
	var agent struct {
		ID     string `json:"id"`
		Scope  string `json:"scope"`
		Secret string `json:"secret"`
	}
	req, _ = http.NewRequest("POST", s.url+"/v1/api-keys", strings.NewReader(`{"name":"agent","scope":"sandboxes"}`))
	req.Header.Set("Authorization", "Bearer "+admin)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	decodeJSON(t, resp, &agent)
	if resp.StatusCode != 201 || agent.Scope != "sandboxes" {
		t.Fatalf("create a key of scope sandboxes: %d %+v", resp.StatusCode, agent)
	}
	if code, _, _ := api(t, s, agent.Secret, "GET", "/v1/sandboxes", ""); code != 200 {
		t.Errorf("a key of scope sandboxes lists sandboxes: %d", code)
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/api-keys", ""}, {"POST", "/v1/api-keys", `{"name":"escape"}`}, {"DELETE", "/v1/api-keys/" + created.ID, ""},
	} {
		if code, ecode, msg := api(t, s, agent.Secret, c.method, c.path, c.body); code != 403 || ecode != "permission_denied" || !strings.Contains(msg, "scope") {
			t.Errorf("%s %s with a key of scope sandboxes: %d %s %q, want 403 permission_denied", c.method, c.path, code, ecode, msg)
		}
	}
	if code, ecode, msg := api(t, s, admin, "POST", "/v1/api-keys", `{"name":"x","scope":"root"}`); code != 400 || ecode != "invalid_request" || !strings.Contains(msg, "scope") {
		t.Errorf("a key of an unknown scope: %d %s %q", code, ecode, msg)
	}
	if _, errOut, err := s.cli("keys", "create", "--project", "keys-test", "--scope", "root"); err == nil || !strings.Contains(errOut, "scope") {
		t.Errorf("keys create --scope root: %v %q, want a refusal", err, errOut)
	}
	var list struct {
		APIKeys []struct {
			ID        string  `json:"id"`
			RevokedAt *string `json:"revoked_at"`
			Secret    string  `json:"secret"`
		} `json:"api_keys"`
	}
	req, _ = http.NewRequest("GET", s.url+"/v1/api-keys", nil)
	req.Header.Set("Authorization", "Bearer "+created.Secret)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	decodeJSON(t, resp, &list)
	if len(list.APIKeys) != 3 || list.APIKeys[1].ID != created.ID || list.APIKeys[2].ID != agent.ID || list.APIKeys[1].Secret != "" || list.APIKeys[2].Secret != "" {
		t.Errorf("the project's keys = %+v, want the admin key and the two new ones, no secrets", list.APIKeys)
	}
	// The shared project's key cannot revoke it; its own project can.
	if code, ecode, _ := api(t, s, s.key, "DELETE", "/v1/api-keys/"+created.ID, ""); code != 404 || ecode != "not_found" {
		t.Errorf("revoke from another project: %d %s, want 404", code, ecode)
	}
	if code, _, _ := api(t, s, admin, "DELETE", "/v1/api-keys/"+created.ID, ""); code != 204 {
		t.Errorf("revoke: %d, want 204", code)
	}
	if code, ecode, _ := api(t, s, created.Secret, "GET", "/v1/sandboxes", ""); code != 401 || ecode != "unauthorized" {
		t.Errorf("a revoked key: %d %s, want 401", code, ecode)
	}
	if code, ecode, _ := api(t, s, admin, "POST", "/v1/api-keys", `{"name":7}`); code != 400 || ecode != "invalid_request" {
		t.Errorf("bad key name: %d %s, want 400", code, ecode)
	}
	// A name with control characters would rewrite the operator's terminal
	// in `keys list`: refused by the API and by the CLI.
	if code, ecode, _ := api(t, s, admin, "POST", "/v1/api-keys", `{"name":"\u001b[2J\nkey_fake"}`); code != 400 || ecode != "invalid_request" {
		t.Errorf("a key name with escapes: %d %s, want 400", code, ecode)
	}
	for _, args := range [][]string{{"--project", "keys-test", "--name", "a\x1b]0;t\x07"}, {"--project", ""}} {
		if _, _, err := s.cli(append([]string{"keys", "create"}, args...)...); err == nil {
			t.Errorf("keys create %q succeeded", args)
		}
	}
	// An unknown id of 5000 bytes is not echoed whole; JSON answers are
	// never sniffed as a page.
	if code, _, msg := api(t, s, admin, "DELETE", "/v1/api-keys/"+strings.Repeat("k", 5000), ""); code != 404 || len(msg) > 200 {
		t.Errorf("revoke of a 5000-byte id: %d, a %d-byte message", code, len(msg))
	}
	if resp, err := http.Get(s.url + "/v1/nope/<script>"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("a JSON error answer without nosniff: %v", resp.Header)
		}
	}
	// keys list names each key's project; create takes the name or the id,
	// says when a name makes a new project, and refuses an id it does not know.
	out, _, err := s.cli("keys", "list")
	var projectID string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[len(f)-1] == "keys-test" {
			projectID = f[1]
		}
	}
	if err != nil || !strings.HasPrefix(projectID, "prj_") {
		t.Fatalf("keys list shows no key of project keys-test with its id: %v\n%s", err, out)
	}
	if _, errOut, err := s.cli("keys", "create", "--project", projectID, "--name", "by-id"); err != nil || strings.Contains(errOut, "Created project") {
		t.Errorf("keys create --project %s: %v %q, want a key in keys-test", projectID, err, errOut)
	}
	if _, errOut, err := s.cli("keys", "create", "--project", "keys-test-new-"+strings.ToLower(t.Name()[:4])); err != nil || !strings.Contains(errOut, "Created project") {
		t.Errorf("keys create with a new project's name: %v %q, want it to say it made the project", err, errOut)
	}
	if _, errOut, err := s.cli("keys", "create", "--project", "prj_nosuchproject00"); err == nil || !strings.Contains(errOut, "no project has the id") {
		t.Errorf("keys create --project prj_nosuchproject00: %v %q, want a refusal", err, errOut)
	}
	if out, _, _ := s.cli("keys", "list"); !regexp.MustCompile(`(?m)^key_\S+\s+` + projectID + `\s+\S+\s+by-id\s.*\skeys-test$`).MatchString(out) {
		t.Errorf("the key made by project id is not in keys-test:\n%s", out)
	}
	// A data dir that holds no store (not the server's) is refused, and
	// left as it was, rather than given a new store of its own.
	wrong := filepath.Join(t.TempDir(), "not-the-servers")
	for _, args := range [][]string{{"keys", "create"}, {"keys", "list"}, {"template", "gc", "--dry-run"}} {
		if out, errOut, err := s.cli(append(args, "--data-dir", wrong)...); err == nil || out != "" || !strings.Contains(errOut, "no PandaStack store at "+wrong) {
			t.Errorf("%v in a data dir without a store: %v %q %q", args, err, out, errOut)
		}
	}
	if _, err := os.Stat(wrong); !os.IsNotExist(err) {
		t.Errorf("keys made the data dir it refused: %v", err)
	}
	// So is a file that is not a store, left as it was.
	other := filepath.Join(t.TempDir(), "notes.db")
	if err := os.WriteFile(other, []byte("someone else's file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, err := s.cli("keys", "create", "--store", "sqlite://"+other); err == nil || out != "" || !strings.Contains(errOut, other+" is not a PandaStack store") {
		t.Errorf("keys create in a file that is not a store: %v %q %q", err, out, errOut)
	}
	if b, _ := os.ReadFile(other); string(b) != "someone else's file\n" {
		t.Errorf("keys changed the file it refused: %q", b)
	}

	// Lineage: a sandbox restored from a snapshot, and a fork of it.
	c := client.New(s.url, admin)
	parent, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, parent.ID)
	snap, err := c.CreateSnapshot(ctx, parent.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	restored, err := c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, restored.ID)
	kids, err := c.Fork(ctx, restored.ID, client.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, kids[0].ID)
	got := lineage(t, s, admin)
	want := []string{restored.ID + "<snapshot<" + snap.ID, kids[0].ID + "<fork<" + restored.ID}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("lineage = %v, want %v", got, want)
	}
	// Another project's lineage is its own.
	if other := lineage(t, s, s.key); strings.Contains(strings.Join(other, " "), restored.ID) {
		t.Errorf("the shared project sees this project's lineage: %v", other)
	}
}

func TestConsoleServed(t *testing.T) {
	s := sharedServer(t)
	resp, err := http.Get(s.url + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `<script type="module" src="/ui/app.js">`) {
		t.Fatalf("GET /: %d %.200s", resp.StatusCode, b)
	}
	// The API's own 404s keep their shape beside the console.
	if code, ecode, _ := api(t, s, s.key, "GET", "/v1/nothing", ""); code != 404 || ecode != "not_found" {
		t.Errorf("GET /v1/nothing: %d %s", code, ecode)
	}
}

func decodeJSON(t *testing.T, resp *http.Response, out any) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v: %s", resp.Request.URL, err, b)
	}
}

// TestTerminalClosedWithReasonOnShutdown: a serve that stops (without
// --kill-on-exit, whose kills close terminals with 4410) closes its open
// terminals with 1001 (going away) and a reason; they were dropped
// without a close frame, which a client took for the shell's end.
func TestTerminalClosedWithReasonOnShutdown(t *testing.T) {
	s := startServer(t, "", "PANDASTACK_POOL_SIZE=0", "PANDASTACK_KILL_ON_EXIT=0")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	term, err := c.OpenTerminal(ctx, sb.ID, 80, 24)
	if err != nil {
		t.Fatal(err)
	}
	term.Write(ctx, []byte("echo up$((3+3))\r"))
	readTerm(t, term, "", "up6")
	stopped := make(chan struct{})
	go func() { s.stop(); close(stopped) }()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := term.Read(rctx)
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || !strings.Contains(ce.Reason, "shutting down") {
			t.Fatalf("the terminal at the server's shutdown: %v, want a close 1001 saying the server is shutting down", err)
		}
		break
	}
	<-stopped
	s.start() // the sandbox kept running: end it
	if err := s.client().KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
