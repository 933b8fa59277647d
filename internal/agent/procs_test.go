//go:build linux

package agent_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

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
