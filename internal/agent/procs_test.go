//go:build linux

package agent_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// output reads a background process's output stream.
func (st *stack) output(t *testing.T, pid int, follow bool) (stdout string, exit *agentproto.ExecEvent) {
	t.Helper()
	path := "/v1/processes/" + strconv.Itoa(pid) + "/output"
	if follow {
		path += "?follow=1"
	}
	resp := st.request(t, t.Context(), http.MethodGet, path, nil, nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("output: %d %s", resp.StatusCode, b)
	}
	dec := json.NewDecoder(resp.Body)
	var b strings.Builder
	for {
		var ev agentproto.ExecEvent
		if err := dec.Decode(&ev); err == io.EOF {
			return b.String(), exit
		} else if err != nil {
			t.Fatal(err)
		}
		if exit != nil {
			t.Fatalf("event %q after exit", ev.Type)
		}
		switch ev.Type {
		case "stdout":
			b.Write(ev.Data)
		case "exit":
			exit = &ev
		}
	}
}

func TestBackgroundProcess(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		var p agentproto.Process
		st.call(t, http.MethodPost, "/v1/processes", nil, jsonBody(t, agentproto.ExecRequest{Cmd: "echo started; read line; echo got $line; echo done"}), http.StatusOK, &p)
		if p.PID <= 0 || !p.Running || p.Cmd == "" {
			t.Fatalf("started: %+v", p)
		}
		// The output so far, without waiting for the end.
		for {
			out, exit := st.output(t, p.PID, false)
			if exit != nil {
				t.Fatalf("ended before its input: %q %+v", out, exit)
			}
			if out == "started\n" {
				break
			}
		}
		var list []agentproto.Process
		st.call(t, http.MethodGet, "/v1/processes", nil, nil, http.StatusOK, &list)
		if len(list) != 1 || list[0].PID != p.PID || !list[0].Running {
			t.Fatalf("list: %+v", list)
		}
		st.call(t, http.MethodPost, "/v1/processes/"+strconv.Itoa(p.PID)+"/stdin", nil, jsonBody(t, agentproto.StdinRequest{Data: []byte("hello\n")}), http.StatusNoContent, nil)
		out, exit := st.output(t, p.PID, true)
		if out != "started\ngot hello\ndone\n" || exit == nil || exit.ExitCode != 0 {
			t.Fatalf("followed: %q, exit %+v", out, exit)
		}
		st.call(t, http.MethodGet, "/v1/processes", nil, nil, http.StatusOK, &list)
		if len(list) != 1 || list[0].Running || list[0].ExitCode == nil || *list[0].ExitCode != 0 {
			t.Fatalf("list after the end: %+v", list)
		}
		st.callError(t, http.MethodPost, "/v1/processes/"+strconv.Itoa(p.PID)+"/stdin", nil, jsonBody(t, agentproto.StdinRequest{Data: []byte("x")}), http.StatusConflict, "conflict")

		// Kill.
		st.call(t, http.MethodPost, "/v1/processes", nil, jsonBody(t, agentproto.ExecRequest{Cmd: "echo up; sleep 600"}), http.StatusOK, &p)
		st.call(t, http.MethodPost, "/v1/processes/"+strconv.Itoa(p.PID)+"/kill", nil, nil, http.StatusNoContent, nil)
		// Once the kill answered, the process is ended for any look.
		st.call(t, http.MethodGet, "/v1/processes", nil, nil, http.StatusOK, &list)
		for _, q := range list {
			if q.PID == p.PID && (q.Running || q.Signal != "SIGKILL") {
				t.Fatalf("listed right after its kill: %+v", q)
			}
		}
		if _, exit := st.output(t, p.PID, true); exit == nil || exit.Signal != "SIGKILL" {
			t.Fatalf("killed: exit %+v", exit)
		}
		// Timeout.
		st.call(t, http.MethodPost, "/v1/processes", nil, jsonBody(t, agentproto.ExecRequest{Cmd: "sleep 600", TimeoutMS: 200}), http.StatusOK, &p)
		if _, exit := st.output(t, p.PID, true); exit == nil || !exit.TimedOut {
			t.Fatalf("timed out: exit %+v", exit)
		}
		// Bad input.
		st.callError(t, http.MethodGet, "/v1/processes/999999/output", nil, nil, http.StatusNotFound, "not_found")
		st.callError(t, http.MethodPost, "/v1/processes/abc/kill", nil, nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/processes", nil, jsonBody(t, agentproto.ExecRequest{Argv: []string{"no-such-program"}}), http.StatusBadRequest, "command_not_found")
	})
}

// TestBackgroundOutputKeepsTheLatest checks that a process writing more
// than the agent keeps loses its oldest output, and says how much.
func TestBackgroundOutputKeepsTheLatest(t *testing.T) {
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	var p agentproto.Process
	// 6 MiB of lines, then a marker.
	st.call(t, http.MethodPost, "/v1/processes", nil, jsonBody(t, agentproto.ExecRequest{Cmd: "yes 0123456789abcdef | head -c 6291456; echo; echo LAST"}), http.StatusOK, &p)
	var list []agentproto.Process
	for len(list) == 0 || list[0].Running {
		time.Sleep(50 * time.Millisecond)
		st.call(t, http.MethodGet, "/v1/processes", nil, nil, http.StatusOK, &list)
	}
	// Read only now: a reader following from the start would get it all.
	out, exit := st.output(t, p.PID, false)
	if exit == nil || exit.ExitCode != 0 || !strings.HasSuffix(out, "\nLAST\n") || len(out) > 4<<20 || len(out) < 3<<20 {
		t.Fatalf("kept %d bytes ending %q, exit %+v", len(out), out[max(0, len(out)-20):], exit)
	}
	if len(list) != 1 || list[0].OutputDropped+int64(len(out)) != 6291456+len64("\nLAST\n") {
		t.Fatalf("dropped %d + kept %d", list[0].OutputDropped, len(out))
	}
	// The stream says where the output it never got was dropped: first.
	resp := st.request(t, t.Context(), http.MethodGet, "/v1/processes/"+strconv.Itoa(p.PID)+"/output", nil, nil)
	defer resp.Body.Close()
	var first agentproto.ExecEvent
	if err := json.NewDecoder(resp.Body).Decode(&first); err != nil || first.Type != "stderr" || !strings.Contains(string(first.Data), "output dropped here") {
		t.Fatalf("the stream of a process whose output was dropped begins with %+v, %v; want the note", first, err)
	}
}

func len64(s string) int64 { return int64(len(s)) }

// Input given with the start that the process does not take is reported
// on its stderr, with how much of it did reach it: the start had answered
// already, and the process would read a cut input as whole.
func TestBackgroundStartInputNotTaken(t *testing.T) {
	defer agent.SetStdinWait(200 * time.Millisecond)()
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	var p agentproto.Process
	st.call(t, http.MethodPost, "/v1/processes", nil, jsonBody(t, agentproto.ExecRequest{Cmd: "sleep 1", Stdin: make([]byte, 1<<20)}), http.StatusOK, &p)
	resp := st.request(t, t.Context(), http.MethodGet, "/v1/processes/"+strconv.Itoa(p.PID)+"/output?follow=1", nil, nil)
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	var stderr strings.Builder
	for {
		var ev agentproto.ExecEvent
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("output ended without the exit: %v", err)
		}
		if ev.Type == "stderr" {
			stderr.Write(ev.Data)
		}
		if ev.Type == "exit" {
			break
		}
	}
	if !strings.Contains(stderr.String(), "of the 1048576 bytes of input given with the start reached the process") {
		t.Fatalf("stderr %q, want the note on the input not taken", stderr.String())
	}
}
