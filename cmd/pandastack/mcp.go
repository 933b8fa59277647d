package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/pandastack/pandastack/internal/mcpserver"
)

// mcpCmd serves the Model Context Protocol on stdin/stdout for one client
// session, calling the API at PANDASTACK_API. Logs go to stderr: stdout
// carries the protocol.
func mcpCmd(args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	tpl := fs.String("template", mcpserver.DefaultTemplate, "template of the session's sandbox and of create_sandbox without one")
	ttl := fs.Duration("session-ttl", mcpserver.DefaultSessionTTL, "TTL of the session's sandbox, pushed ahead on each use")
	level := fs.String("log-level", "info", "stderr log level: debug, info, warn or error")
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if _, err := wholeSeconds("--session-ttl", *ttl); err != nil || *ttl <= 0 {
		return fmt.Errorf("--session-ttl %v: give a positive whole number of seconds, such as 15m", *ttl)
	}
	switch *level {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", *level)
	}
	c, _, err := cliClient()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := mcpserver.New(mcpserver.Config{
		Client: c, Log: newLogger(*level, os.Stderr), Template: *tpl, SessionTTL: *ttl, Version: version,
	})
	err = srv.Serve(ctx, mcpserver.StdioTransport(os.Stdin, os.Stdout))
	if ctx.Err() != nil {
		return nil // a signal ended the session; its sandbox is already killed
	}
	return err
}
