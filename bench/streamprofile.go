package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/runtime/gvisor"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// StreamProfile counts the system calls made in the sandbox per MiB of exec
// output streamed to the host (section stream-profile).
type StreamProfile struct {
	Server string `json:"server"` // "this" or "baseline"
	MiB    int    `json:"mib"`    // output streamed while counting
	// PerMiB is the calls per MiB of output, all tasks of the sandbox.
	PerMiB float64 `json:"syscalls_per_mib"`
	// Tasks are the calls per MiB of each task by name: the agent, the
	// command's processes (yes, head, the shell), the idle kernels.
	Tasks []SyscallCount `json:"tasks"`
	// Calls are the calls per MiB by task and system call, most first.
	Calls []SyscallCount `json:"calls"`
}

// streamProfileMiB is the output streamed under strace: every call is
// logged, so far less than the stream section's GiB.
const streamProfileMiB = 16

// streamProfile restores a code-interpreter sandbox of s with runsc's
// --strace on, runs `yes | head -c 16 MiB` through its agent as the server
// does (binary frames over the channel), and counts the calls the sandbox
// made meanwhile. Under --strace every call is slower; the counts, not
// the times, are the point.
func (b *bench) streamProfile(ctx context.Context, s *server, name string) error {
	src, done, err := profileSource(ctx, s, "stream-profile")
	if err != nil {
		return err
	}
	defer done()
	tmp, cleanup, err := profileTemp("pandastack-bench-stream-", "-"+name)
	if err != nil {
		return err
	}
	defer cleanup()
	logDir := filepath.Join(tmp, "logs")
	rt, err := gvisor.New(gvisor.Config{Runsc: s.runsc, StateDir: filepath.Join(tmp, "state"), AgentPath: src.agent, DebugLogDir: logDir, Strace: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer rt.Close()
	id := pandastack.NewID("sbx")
	spec := pandastack.RuntimeSpec{ID: id, RootFS: src.man.RootFS, CPU: src.man.CPU, MemoryMB: src.man.MemoryMB, PIDs: 1024, Lazy: true,
		Env: []string{"PANDASTACK_SANDBOX_ID=" + id}}
	rwc, err := rt.Restore(ctx, spec, filepath.Join(src.snapDir, "image"))
	if err != nil {
		return fmt.Errorf("stream profile: restore: %w", err)
	}
	defer rt.Stop(context.Background(), id)
	c, err := sandbox.DialAgent(ctx, id, rwc, true)
	if err != nil {
		return fmt.Errorf("stream profile: %w", err)
	}
	defer c.Close()

	exec := func(mib int) error {
		var n int
		exit, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "yes | head -c " + strconv.Itoa(mib<<20), TimeoutMS: 600_000}, func(ev agentproto.ExecEvent) error {
			if ev.Type == "stdout" {
				n += len(ev.Data)
			}
			return nil
		})
		if err == nil && (exit.ExitCode != 0 || n != mib<<20) {
			err = fmt.Errorf("exit %d, %d bytes of %d", exit.ExitCode, n, mib<<20)
		}
		return err
	}
	if err := exec(1); err != nil { // warm-up: the agent's first exec
		return fmt.Errorf("stream profile: warm-up: %w", err)
	}
	boot, err := filepath.Glob(filepath.Join(logDir, "*boot*"))
	if err != nil || len(boot) != 1 {
		return fmt.Errorf("stream profile: want one boot log in %s, found %v", logDir, boot)
	}
	size := func() (int64, error) {
		fi, err := os.Stat(boot[0])
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	time.Sleep(200 * time.Millisecond) // let the calls around the warm-up settle
	from, err := size()
	if err != nil {
		return err
	}
	if err := exec(streamProfileMiB); err != nil {
		return fmt.Errorf("stream profile: %w", err)
	}
	to, err := size()
	if err != nil {
		return err
	}
	rp, err := countSyscalls(boot[0], from, to, -1, nil, streamProfileMiB)
	if err != nil {
		return err
	}
	p := StreamProfile{Server: name, MiB: streamProfileMiB, PerMiB: rp.PerRun, Tasks: rp.Threads, Calls: rp.Calls}
	b.rep.StreamProfile = append(b.rep.StreamProfile, p)
	fmt.Fprintf(os.Stderr, "  %s: %.0f system calls in the sandbox per MiB of exec output\n", name, p.PerMiB)
	for _, t := range p.Tasks {
		fmt.Fprintf(os.Stderr, "    %-28s %8.1f\n", t.Thread, t.PerRun)
	}
	for i, cl := range p.Calls {
		if i == 25 {
			break
		}
		fmt.Fprintf(os.Stderr, "    %-28s %-18s %8.1f  %8.0f µs under strace\n", cl.Thread, cl.Syscall, cl.PerRun, cl.USPerRun)
	}
	return nil
}

// streamProfiles profiles this revision's sandbox and, with -baseline, the
// other revision's.
func (b *bench) streamProfiles(ctx context.Context) error {
	if err := b.streamProfile(ctx, b.noPool, "this"); err != nil {
		return err
	}
	if b.baselineNoPool != nil {
		return b.streamProfile(ctx, b.baselineNoPool, "baseline")
	}
	return nil
}
