package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/mcpserver"
)

// A tool of `pandastack mcp` called while the API server is down says so
// as the CLI does, with what to check, not as Go's transport error
// (`Post "http://…": dial tcp …: connection refused`).
func TestMCPToolsExplainAnUnreachableServer(t *testing.T) {
	// A port bound but not listening: a connection to it is refused, and
	// nothing else can take it while the test runs.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	down := fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv := mcpserver.New(mcpConfig(client.New(down, "pds_test"), "PANDASTACK_API_KEY", log, mcpserver.DefaultTemplate, time.Minute))
	st, ct := mcp.NewInMemoryTransports()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "cli-test", Version: "0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cs.Close()
		<-served
	}()
	for _, p := range []*mcp.CallToolParams{
		{Name: "run_code", Arguments: map[string]any{"code": "1"}}, // the session's sandbox is made first
		{Name: "list_snapshots", Arguments: map[string]any{}},
	} {
		res, err := cs.CallTool(context.Background(), p)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		var txt string
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				txt += tc.Text
			}
		}
		t.Logf("%s: %s", p.Name, txt)
		if !res.IsError || !strings.HasPrefix(txt, "cannot reach the PandaStack server at "+down+": dial tcp") ||
			!strings.HasSuffix(txt, "is `pandastack serve` running there? (PANDASTACK_API, default "+client.DefaultURL+")") {
			t.Errorf("%s with the server down: isError %v, %q", p.Name, res.IsError, txt)
		}
	}
}
