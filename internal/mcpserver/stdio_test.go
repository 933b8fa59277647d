package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestStdioSurvivesBadLines: lines that are not JSON-RPC messages, or are
// too long, each get a JSON-RPC error and the session goes on (the SDK's
// own transport ended it, and with it the session's sandbox).
func TestStdioSurvivesBadLines(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	w := &lockedWriter{w: outW}
	tr := &mcp.IOTransport{Reader: filterMessages(inR, w, 1024), Writer: w, MaxLineLength: -1}
	srv := mcp.NewServer(&mcp.Implementation{Name: "t", Version: "0"}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Run(ctx, tr) }()

	answers := make(chan map[string]any, 16)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("the server wrote a line that is not JSON: %q", sc.Text())
			}
			answers <- m
		}
	}()
	send := func(line string) { inW.Write([]byte(line + "\n")) }
	next := func() map[string]any {
		select {
		case m := <-answers:
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no answer")
			return nil
		}
	}

	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"0"}}}`)
	if m := next(); m["id"] != 1.0 || m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	for _, tc := range []struct {
		line string
		id   any
		code float64
	}{
		{"hello", nil, -32700},
		{"42", nil, -32600},
		{"[]", nil, -32600},
		{`[1]`, nil, -32600},
		{`{"id":2,"method":"ping"}`, 2.0, -32600},
		{`{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`, nil, -32600},
		{`{"jsonrpc":"2.0","id":3,"method":"ping"} trailing`, nil, -32700},
		{`{"jsonrpc":"2.0","id":"x"}`, "x", -32600},
		{`{"JSONRPC":"2.0","id":5,"method":"ping"}`, 5.0, -32600},
		{`{"jsonrpc":"2.0","id":6,"error":"oops"}`, 6.0, -32600},
		{`{"jsonrpc":"2.0","id":1e400,"method":"ping"}`, nil, -32600},
		{`[{"jsonrpc":"2.0","id":7,"method":"ping"}]`, nil, -32600},
		{`{"jsonrpc":"2.0","id":8,"method":"ping","params":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`, nil, -32600},
		{`{"jsonrpc":"2.0","id":4,"method":"ping","params":"` + strings.Repeat("a", 2000) + `"}`, nil, -32600},
	} {
		send(tc.line)
		m := next()
		e, _ := m["error"].(map[string]any)
		if m["jsonrpc"] != "2.0" || m["id"] != tc.id || e == nil || e["code"] != tc.code || e["message"] == "" || strings.Contains(fmt.Sprint(e["message"]), "Go ") {
			t.Errorf("%.60s: %v; want error %v for id %v", tc.line, m, tc.code, tc.id)
		}
	}
	send("")
	send(`{"jsonrpc":"2.0","id":9,"method":"ping"}`)
	if m := next(); m["id"] != 9.0 || m["result"] == nil {
		t.Fatalf("a ping after the bad lines: %v", m)
	}
	select {
	case err := <-served:
		t.Fatalf("the session ended: %v", err)
	default:
	}
	inW.Close() // the client hangs up: the session ends
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the session did not end at the end of its input")
	}
}
