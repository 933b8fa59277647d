// Command pandastack-agent is the in-sandbox agent: PID 1 of every sandbox,
// serving the host over its stdin and stdout (see internal/agentproto). It is
// built static (CGO_ENABLED=0) and mounted read-only at /.pandastack/agent.
package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("agent", version)
	agent.KeepAdminToItself(log)
	// A host that goes away breaks stdout; writes must fail, not kill PID 1.
	// Notify rather than Ignore: an ignored signal stays ignored in children.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	cfg := agent.Config{Version: version, BootedAt: time.Now().UTC(), Log: log, Contexts: agent.NewContexts(), Processes: agent.NewProcesses(), Hosts: "/etc/hosts", Hostname: "/etc/hostname", Names: &agent.NameFiles{}}
	if os.Getpid() == 1 {
		cfg.Reaper = agent.StartReaper(log)
		agent.FreezeUserOnKill()
	}
	agent.LimitProcesses(log)
	log.Info("agent started", "pid", os.Getpid(), "uid", os.Geteuid())
	err := agentproto.Serve(os.Stdin, os.Stdout, func(epoch uint32, conn io.ReadWriteCloser) {
		agent.ServeSession(cfg, epoch, conn)
	})
	if err != io.EOF {
		log.Error("reading the host channel failed; exiting", "err", err)
		os.Exit(1)
	}
	log.Info("host channel closed; exiting")
}
