package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/client"
)

// ndjsonEvents decodes an NDJSON body.
func ndjsonEvents(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var evs []map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	for dec.More() {
		var ev map[string]any
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("NDJSON %q: %v", body, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// stdoutOf joins the stdout events and returns the exit event, if any.
func stdoutOf(evs []map[string]any) (string, map[string]any) {
	var b strings.Builder
	var exit map[string]any
	for _, ev := range evs {
		switch ev["type"] {
		case "stdout":
			b.WriteString(ev["data"].(string))
		case "exit":
			exit = ev
		}
	}
	return b.String(), exit
}

// TestBackgroundCommands starts commands with background: true, reads
// their output while they run and after, feeds one stdin and kills one.
func TestBackgroundCommands(t *testing.T) {
	s := sharedServer(t)
	sb := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 600})
	base := "/v1/sandboxes/" + sb.ID

	status, body := rawCall(t, s, "POST", base+"/exec", `{"cmd": "echo ready; read name; echo hello $name; sleep 0.2; echo bye", "background": true}`)
	var p struct {
		PID     int    `json:"pid"`
		Running bool   `json:"running"`
		Cmd     string `json:"cmd"`
	}
	if status != 200 || json.Unmarshal(body, &p) != nil || p.PID <= 0 || !p.Running || !strings.Contains(p.Cmd, "echo ready") {
		t.Fatalf("background exec: %d %s", status, body)
	}
	out := base + "/processes/" + strconv.Itoa(p.PID)

	// Without follow: what there is so far, no exit.
	for {
		status, body = rawCall(t, s, "GET", out+"/output", "")
		if status != 200 {
			t.Fatalf("output: %d %s", status, body)
		}
		got, exit := stdoutOf(ndjsonEvents(t, body))
		if exit != nil {
			t.Fatalf("ended before its input: %s", body)
		}
		if got == "ready\n" {
			break
		}
	}
	status, body = rawCall(t, s, "GET", base+"/processes", "")
	if status != 200 || !strings.Contains(string(body), `"pid":`+strconv.Itoa(p.PID)) || !strings.Contains(string(body), `"running":true`) {
		t.Fatalf("list: %d %s", status, body)
	}
	if status, body = rawCall(t, s, "POST", out+"/stdin", `{"data": "panda\n"}`); status != 204 {
		t.Fatalf("stdin: %d %s", status, body)
	}
	// Following: to the end, from the start.
	status, body = rawCall(t, s, "GET", out+"/output?follow=true", "")
	got, exit := stdoutOf(ndjsonEvents(t, body))
	if status != 200 || got != "ready\nhello panda\nbye\n" || exit == nil || exit["exit_code"] != 0.0 {
		t.Fatalf("followed output: %d %s", status, body)
	}

	// Kill.
	status, body = rawCall(t, s, "POST", base+"/exec", `{"cmd": "echo up; sleep 600", "background": true}`)
	if status != 200 || json.Unmarshal(body, &p) != nil {
		t.Fatalf("background exec: %d %s", status, body)
	}
	out = base + "/processes/" + strconv.Itoa(p.PID)
	if status, body = rawCall(t, s, "POST", out+"/kill", ""); status != 204 {
		t.Fatalf("kill: %d %s", status, body)
	}
	_, body = rawCall(t, s, "GET", out+"/output?follow=1", "")
	if got, exit := stdoutOf(ndjsonEvents(t, body)); got != "up\n" && got != "" || exit == nil || exit["signal"] != "SIGKILL" {
		t.Fatalf("killed process output: %s", body)
	}
	if status, body = rawCall(t, s, "POST", out+"/stdin", `{"data": "x"}`); status != 409 {
		t.Fatalf("stdin to an ended process: %d %s", status, body)
	}

	// Another project sees none of it.
	otherKey := s.newKey("other-processes")
	for _, c := range []struct{ method, path, body string }{
		{"GET", base + "/processes", ""},
		{"GET", out + "/output", ""},
		{"POST", out + "/stdin", `{"data": "x"}`},
		{"POST", out + "/kill", ""},
		{"POST", base + "/exec", `{"cmd": "true", "background": true}`},
	} {
		if status, code, _ := api(t, s, otherKey, c.method, c.path, c.body); status != 404 || code != "not_found" {
			t.Errorf("other project %s %s: %d %s", c.method, c.path, status, code)
		}
	}

	// Bad input.
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", base + "/processes/999999/output", "", 404},
		{"GET", base + "/processes/abc/output", "", 400},
		{"GET", out + "/output?follow=maybe", "", 400},
		{"POST", out + "/stdin", `{"data": 1}`, 400},
		{"POST", base + "/exec", `{"argv": ["no-such-program"], "background": true}`, 400},
		{"GET", "/v1/sandboxes/sbx_nope/processes", "", 404},
	} {
		if status, body := rawCall(t, s, c.method, c.path, c.body); status != c.status {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, status, body, c.status)
		}
	}

	// A sandbox killed with a background process running leaves nothing,
	// and whoever follows its output learns why it ended.
	status, body = rawCall(t, s, "POST", base+"/exec", `{"cmd": "echo up; sleep 600 & sleep 600", "background": true}`)
	if status != 200 || json.Unmarshal(body, &p) != nil {
		t.Fatalf("background exec: %d %s", status, body)
	}
	req, _ := http.NewRequest("GET", s.url+base+"/processes/"+strconv.Itoa(p.PID)+"/output?follow=1", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	if !lines.Scan() || !strings.Contains(lines.Text(), `"stdout"`) {
		t.Fatalf("followed output: %d %q %v", resp.StatusCode, lines.Text(), lines.Err())
	}
	if err := s.client().KillSandbox(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	var last string
	for lines.Scan() {
		last = lines.Text()
	}
	if !strings.Contains(last, `"type":"error"`) || !strings.Contains(last, `"sandbox_stopped"`) || !strings.Contains(last, "was killed") {
		t.Fatalf("output followed through a kill ended with %q (%v), want an error saying the sandbox was killed", last, lines.Err())
	}
	s.assertGone(t, sb.ID)
}

// TestProcessLimitIsAConflict: once the sandbox user has as many
// processes as it may, starting one more is a 409 conflict that says so
// (it was a 500 internal error), and ending one makes room again.
func TestProcessLimitIsAConflict(t *testing.T) {
	s := sharedServer(t)
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	base := "/v1/sandboxes/" + sb.ID
	var pid int
	status, body := 0, []byte(nil)
	for i := 0; ; i++ {
		status, body = rawCall(t, s, "POST", base+"/exec", `{"cmd": "sleep 600", "background": true}`)
		if status != 200 || i == 1000 {
			break
		}
		var p struct {
			PID int `json:"pid"`
		}
		json.Unmarshal(body, &p)
		pid = p.PID
	}
	if status != 409 || !strings.Contains(string(body), `"conflict"`) || !strings.Contains(string(body), "as many processes as it may") {
		t.Fatalf("a background exec at the process limit: %d %s, want 409 conflict saying so", status, body)
	}
	if status, body = rawCall(t, s, "POST", base+"/exec", `{"cmd": "echo hi"}`); status != 409 {
		t.Fatalf("exec at the process limit: %d %s, want 409", status, body)
	}
	if status, body = rawCall(t, s, "POST", base+"/processes/"+strconv.Itoa(pid)+"/kill", ""); status != 204 {
		t.Fatalf("kill: %d %s", status, body)
	}
	if status, body = rawCall(t, s, "POST", base+"/exec", `{"cmd": "echo room"}`); status != 200 || !strings.Contains(string(body), "room") {
		t.Fatalf("exec after one process was killed: %d %s", status, body)
	}
}

// TestKillAllProcesses is the way out of a fork bomb and of stray
// processes in one call: every process of the sandbox user ends but the
// kernels, which keep their state (a shell context's variables too), and
// the sandbox runs commands again at once.
func TestKillAllProcesses(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})
	base := "/v1/sandboxes/" + sb.ID
	run := func(language, code string) *pandastack.Execution {
		t.Helper()
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Language: language, Code: code, TimeoutSeconds: 60})
		if err != nil || ex.Error != nil {
			t.Fatalf("%s %q: %+v %v", language, code, ex, err)
		}
		return ex
	}
	run("python", "import subprocess\nx = 41\nchild = subprocess.Popen(['sleep', '603'])")
	run("bash", "kept=41")
	status, body := rawCall(t, s, "POST", base+"/exec", `{"cmd": "sleep 601", "background": true}`)
	var sleeper struct {
		PID int `json:"pid"`
	}
	if status != 200 || json.Unmarshal(body, &sleeper) != nil {
		t.Fatalf("background exec: %d %s", status, body)
	}
	// A daemon that left the command's tree, and a fork bomb.
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "setsid sleep 602 </dev/null >/dev/null 2>&1 &"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("daemon: %+v %v", res, err)
	}
	if status, body := rawCall(t, s, "POST", base+"/exec", `{"cmd": "f(){ f|f& }; f; sleep 600", "background": true}`); status != 200 {
		t.Fatalf("bomb: %d %s", status, body)
	}
	// Counted with no fork of the user's (the agent starts python3 as
	// root, then drops to the user), which the bomb's fill would refuse.
	count := client.ExecRequest{Argv: []string{"python3", "-c", "import os; print(sum(n.isdigit() for n in os.listdir('/proc')))"}}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		res, err := c.Exec(ctx, sb.ID, count)
		if err == nil {
			if n, _ := strconv.Atoi(strings.TrimSpace(res.Stdout)); n > 200 {
				break
			}
		}
		if time.Now().After(end) {
			t.Fatalf("the bomb did not take 200 processes in 30 s: %+v %v", res, err)
		}
	}

	began := time.Now()
	status, body = rawCall(t, s, "POST", base+"/processes/kill", "")
	t.Logf("kill all: %s in %v", body, time.Since(began).Round(time.Millisecond))
	var k struct{ Killed, Remaining int }
	if status != 200 || json.Unmarshal(body, &k) != nil || k.Killed < 100 || k.Remaining != 0 {
		t.Fatalf("kill all: %d %s", status, body)
	}
	// Commands run again at once, and nothing of before is left.
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 60[0-9]' || true`})
	if err != nil || res.Stdout != "0\n" {
		t.Fatalf("sleeps left after the kill: %+v %v", res, err)
	}
	_, body = rawCall(t, s, "GET", base+"/processes/"+strconv.Itoa(sleeper.PID)+"/output", "")
	if _, exit := stdoutOf(ndjsonEvents(t, body)); exit == nil || exit["signal"] != "SIGKILL" {
		t.Fatalf("the background process after the kill: %s", body)
	}
	if ex := run("python", "print(x + 1, child.wait())"); ex.Stdout != "42 -9\n" {
		t.Fatalf("the Python kernel after the kill: %q, want its state and its child killed", ex.Stdout)
	}
	if ex := run("bash", "echo $((kept + 1))"); ex.Stdout != "42\n" {
		t.Fatalf("the bash context after the kill: %q, want its shell's variable", ex.Stdout)
	}
	// Nothing to kill: none killed.
	if status, body = rawCall(t, s, "POST", base+"/processes/kill", ""); status != 200 || json.Unmarshal(body, &k) != nil || k.Killed != 0 {
		t.Fatalf("kill all again: %d %s", status, body)
	}
	if status, code, _ := api(t, s, s.newKey("other-kill-all"), "POST", base+"/processes/kill", ""); status != 404 || code != "not_found" {
		t.Errorf("other project's kill all: %d %s", status, code)
	}
	if status, body = rawCall(t, s, "POST", base+"/processes/kill", `{"all": true}`); status != 400 {
		t.Errorf("kill all with a body: %d %s", status, body)
	}
}
