package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/client"
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
	c, keyFrom, err := cliClient()
	if err != nil {
		return err
	}
	// SIGHUP too: a client in a terminal that closes takes `pandastack mcp`
	// with it (one process group); the session's sandbox is killed as on
	// SIGTERM, not left to its TTL. Unless it was started to ignore it
	// (nohup), which a handler would undo.
	stopOn := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stopOn = append(stopOn, syscall.SIGHUP)
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopOn...)
	defer stop()
	// A client that read stderr and went away (crashed, force-quit) leaves
	// the log line written as the session ends no reader: with SIGPIPE
	// caught, the write fails and the sandbox is still killed. (Caught,
	// not ignored, as in serve.)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	log := newLogger(*level, os.Stderr)
	if err := checkMCPSettings(ctx, c, *tpl); err != nil {
		// A key or template that cannot work fails now, where the MCP
		// client shows it, not in every tool call after a start that
		// looked fine. A server not up yet may come: only a warning.
		var ue *url.Error
		if !errors.As(err, &ue) {
			return explainAPI(err, c, keyFrom)
		}
		log.Warn("the PandaStack server does not answer yet; tools fail until it does", "err", explainAPI(err, c, keyFrom))
	}
	srv := mcpserver.New(mcpConfig(c, keyFrom, log, *tpl, *ttl))
	err = srv.Serve(ctx, mcpserver.StdioTransport(os.Stdin, os.Stdout))
	if ctx.Err() != nil {
		return nil // a signal ended the session; its sandbox is already killed
	}
	return err
}

// mcpConfig is the MCP server's configuration for c, whose key came from
// keyFrom: its tools' errors are explained as the CLI's are.
func mcpConfig(c *client.Client, keyFrom string, log *slog.Logger, tpl string, ttl time.Duration) mcpserver.Config {
	return mcpserver.Config{
		Client: c, Log: log, Template: tpl, SessionTTL: ttl, Version: version,
		Explain: func(err error) error { return explainAPI(err, c, keyFrom) },
	}
}

// checkMCPSettings asks the server for its templates: the key works, and
// the session's template is one it has built.
func checkMCPSettings(ctx context.Context, c *client.Client, tpl string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := c.ListTemplates(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, t := range list {
		if t.Name == tpl {
			return nil
		}
		names = append(names, t.Name)
	}
	return fmt.Errorf("--template %s: the server has no such template built (built: %s)", tpl, strings.Join(names, ", "))
}
