package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
)

// cliClient builds an API client from PANDASTACK_API and PANDASTACK_API_KEY,
// falling back to the key file of the local data directory. keyFrom says
// where the key came from, for errors (explainAPI).
func cliClient() (c *client.Client, keyFrom string, err error) {
	base := os.Getenv("PANDASTACK_API")
	if base != "" && !strings.Contains(base, "://") {
		return nil, "", fmt.Errorf("PANDASTACK_API=%q: want the server's URL, such as http://%s", base, base)
	}
	// The routes' own /v1 is the client's to add.
	base = strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1")
	key, keyFrom := strings.TrimSpace(os.Getenv("PANDASTACK_API_KEY")), "PANDASTACK_API_KEY"
	if key == "" {
		cfg := defaultConfig()
		if v := os.Getenv("PANDASTACK_DATA_DIR"); v != "" {
			cfg.DataDir = v
		}
		b, err := os.ReadFile(cfg.keyPath())
		if err != nil {
			return nil, "", fmt.Errorf("no API key: set PANDASTACK_API_KEY (could not read %s: %v)", cfg.keyPath(), err)
		}
		key, keyFrom = strings.TrimSpace(string(b)), cfg.keyPath()
	}
	return client.New(base, key), keyFrom, nil
}

// isDial reports whether err is a failure to connect (not one of a
// connection that broke later).
func isDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// hinted is an error with a message that says more than the error under
// it, which it keeps (exit codes and codes are read from that one).
type hinted struct {
	msg string
	err error
}

func (h hinted) Error() string { return h.msg }
func (h hinted) Unwrap() error { return h.err }

// explainAPI adds to an API call's error what tells a wrong server or key
// from a failure: the URL the CLI used, and where its key came from.
func explainAPI(err error, c *client.Client, keyFrom string) error {
	var ae *client.Error
	var ue *url.Error
	switch {
	case err == nil || c == nil || errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &ae) && ae.Status == http.StatusUnauthorized:
		return hinted{fmt.Sprintf("%v (the key from %s, sent to %s)", err, keyFrom, c.BaseURL), err}
	case errors.As(err, &ae) && ae.Code == "http_error":
		return hinted{fmt.Sprintf("%s answered HTTP %d, not as a PandaStack server does; is PANDASTACK_API right? (it said %.120q)", c.BaseURL, ae.Status, ae.Message), err}
	case errors.As(err, &ue) && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return hinted{fmt.Sprintf("%s answered plain HTTP: PANDASTACK_API should start with http://, not https://", c.BaseURL), err}
	case errors.As(err, &ue) && isDial(err):
		return hinted{fmt.Sprintf("cannot reach the PandaStack server at %s: %v; is `pandastack serve` running there? (PANDASTACK_API, default %s)", c.BaseURL, ue.Err, client.DefaultURL), err}
	}
	return err
}

type kvFlag map[string]string

func (k kvFlag) String() string { return "" }
func (k kvFlag) Set(s string) error {
	key, val, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	k[key] = val
	return nil
}

func sandboxCmd(args []string) error {
	if len(args) == 0 || isHelp(args[0]) {
		return verbsHelp(args, "usage: pandastack sandbox create|ls|exec|kill-processes|pause|resume|kill ... (pandastack sandbox VERB -h for its flags)")
	}
	verb, args := args[0], args[1:]
	if !slices.Contains([]string{"create", "ls", "list", "exec", "kill", "rm", "pause", "resume", "kill-processes"}, verb) {
		return badUsage{fmt.Sprintf("sandbox: unknown verb %q; want create, ls, exec, kill-processes, pause, resume or kill", verb)}
	}
	if (verb == "pause" || verb == "resume") && len(args) == 1 && isHelp(args[0]) {
		fmt.Printf("usage: pandastack sandbox %s ID\n\nPause checkpoints the sandbox to disk and frees its memory; resume brings it back as it was.\n", verb)
		return nil
	}
	if verb == "kill-processes" && len(args) == 1 && isHelp(args[0]) {
		fmt.Println("usage: pandastack sandbox kill-processes ID\n\nKills every process of the sandbox user but the code contexts' kernels, which keep their state:\nthe way out of a fork bomb or of processes left running.")
		return nil
	}
	if (verb == "kill" || verb == "rm") && len(args) == 1 && isHelp(args[0]) {
		fmt.Println("usage: pandastack sandbox kill ID...\n\nKills each sandbox named (its files and memory are gone; snapshots stay) and reports those it could not.")
		return nil
	}
	// Asking a verb for its flags needs no key: the flags answer first.
	var c *client.Client
	var keyFrom string
	if !asksHelp(args) {
		var err error
		if c, keyFrom, err = cliClient(); err != nil {
			return err
		}
	}
	return explainAPI(sandboxVerb(verb, args, c, keyFrom), c, keyFrom)
}

// sandboxVerb runs one verb of pandastack sandbox with c.
func sandboxVerb(verb string, args []string, c *client.Client, keyFrom string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	switch verb {
	case "create":
		fs := flag.NewFlagSet("sandbox create", flag.ContinueOnError)
		tpl := fs.String("template", "base", "template name")
		snap := fs.String("snapshot", "", "restore this snapshot (snap_…) instead: its template, resources, env, files and kernels")
		ttl := durationFlag(fs, "ttl", "time to live, e.g. 10m or 600 (seconds) (default: the server's)")
		cpu := fs.Int("cpu", 0, "CPUs (default: the template's)")
		mem := fs.Int("memory-mb", 0, "memory in MiB (default: the template's)")
		disk := fs.Int("disk-mb", 0, "its own disk in MiB (default: the template's)")
		idle := durationFlag(fs, "idle-timeout", "suspend it to disk after this long idle, e.g. 10m; 0 never (default: the server's)")
		autoResume := fs.Bool("auto-resume", false, "while paused, any request resumes it instead of answering conflict")
		md, env := kvFlag{}, kvFlag{}
		fs.Var(md, "metadata", "KEY=VALUE metadata (repeatable)")
		fs.Var(env, "env", "KEY=VALUE environment variable (repeatable)")
		netMode := fs.String("network", "", "internet or none (default: the server's --network-default; with --allow-out, none: only those are reachable)")
		var allowOut, denyOut listFlag
		fs.Var(&allowOut, "allow-out", "IP, CIDR, domain or *.domain always reachable (repeatable)")
		fs.Var(&denyOut, "deny-out", "IP or CIDR never reachable unless in --allow-out (repeatable; needs --network internet)")
		if err := parseFlags(fs, args, false); err != nil {
			return err
		}
		pol, err := cliNetwork(*netMode, allowOut, denyOut)
		if err != nil {
			return err
		}
		if *ttl <= 0 && flagGiven(fs, "ttl") {
			return fmt.Errorf("--ttl %v: give a positive time to live, such as 90s or 10m, or leave --ttl out for the server's default", *ttl)
		}
		ttlSeconds, err := wholeSeconds("--ttl", *ttl)
		if err != nil {
			return err
		}
		var idleSeconds *int64
		if flagGiven(fs, "idle-timeout") {
			if *idle < 0 {
				return fmt.Errorf("--idle-timeout %v: give a positive time, such as 10m, after which an idle sandbox is suspended to disk, or 0 to never suspend it", *idle)
			}
			s, err := wholeSeconds("--idle-timeout", *idle)
			if err != nil {
				return err
			}
			idleSeconds = &s
		}
		var sb *client.Sandbox
		if *snap != "" {
			for _, name := range []string{"template", "cpu", "memory-mb", "disk-mb", "env"} {
				if flagGiven(fs, name) {
					return fmt.Errorf("--%s with --snapshot: a restore takes its template, CPUs, memory, disk and env from the snapshot; leave --%s out", name, name)
				}
			}
			sb, err = c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{
				SnapshotID: *snap, TTLSeconds: ttlSeconds, Metadata: md, AutoResume: *autoResume, IdleTimeoutSeconds: idleSeconds, Network: pol,
			})
		} else {
			sb, err = c.CreateSandbox(ctx, client.CreateSandboxRequest{
				Template: *tpl, TTLSeconds: ttlSeconds, Metadata: md, Env: env, CPU: *cpu, MemoryMB: *mem, DiskMB: *disk,
				IdleTimeoutSeconds: idleSeconds, AutoResume: *autoResume, Network: pol,
			})
		}
		if err != nil {
			return err
		}
		fmt.Println(sb.ID)
		fmt.Fprintf(os.Stderr, "template %s, expires %s\n", sb.Template, sb.ExpiresAt.Local().Format(time.RFC3339))
	case "ls", "list":
		fs := flag.NewFlagSet("sandbox ls", flag.ContinueOnError)
		state := fs.String("state", "", "starting, running, paused, stopped (a comma list) or all; default: starting, running and paused")
		md := kvFlag{}
		fs.Var(md, "metadata", "KEY=VALUE filter (repeatable)")
		if err := parseFlags(fs, args, false); err != nil {
			return err
		}
		list, err := c.ListSandboxes(ctx, md, *state)
		if err != nil {
			return err
		}
		fmt.Printf("%-22s %-18s %-15s %-22s %s\n", "ID", "TEMPLATE", "STATE", "EXPIRES", "METADATA")
		for _, sb := range list {
			keys := make([]string, 0, len(sb.Metadata))
			for k, v := range sb.Metadata {
				keys = append(keys, printableMeta(k)+"="+printableMeta(v))
			}
			sort.Strings(keys)
			fmt.Printf("%-22s %-18s %-15s %-22s %s\n", sb.ID, sb.Template, stateWithReason(sb), sb.ExpiresAt.Local().Format(time.RFC3339), strings.Join(keys, ","))
		}
	case "exec":
		fs := flag.NewFlagSet("sandbox exec", flag.ContinueOnError)
		timeout := durationFlag(fs, "timeout", "kill the command after this long, e.g. 5m or 300 (seconds) (default: the server's, 60s)")
		cwd := fs.String("cwd", "", "working directory (default /home/user)")
		withStdin := fs.Bool("stdin", false, "send this command's standard input (read to its end first; text) to the command")
		if err := parseFlags(fs, args, true); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) > 0 && rest[0] == "--" {
			rest = rest[1:]
		}
		if len(rest) < 2 {
			return badUsage{"usage: pandastack sandbox exec [flags] ID -- COMMAND [ARGS...]"}
		}
		id := rest[0]
		argv := rest[1:]
		if argv[0] == "--" {
			argv = argv[1:]
		} else if name, _, _ := strings.Cut(strings.TrimLeft(argv[0], "-"), "="); strings.HasPrefix(argv[0], "-") && (fs.Lookup(name) != nil || isHelp(argv[0])) {
			// A flag of exec's own after the id: it would run as the
			// command ("command not found", 127).
			return badUsage{fmt.Sprintf("sandbox exec: the flag %s goes before the sandbox id (pandastack sandbox exec [flags] %s -- COMMAND)", argv[0], id)}
		}
		req := client.ExecRequest{Cwd: *cwd, TimeoutSeconds: timeout.Seconds()}
		if len(argv) == 1 {
			req.Cmd = argv[0] // one argument: a shell string, so pipes and globs work
		} else {
			req.Argv = argv
		}
		if *withStdin {
			var err error
			if req.Stdin, err = readStdin(); err != nil {
				return err
			}
		}
		// Binary frames: the output's bytes as they are, streamed.
		res, err := c.ExecPipe(ctx, id, req, os.Stdout, os.Stderr)
		if err != nil && ctx.Err() != nil {
			// Ctrl-C: the hang-up stops the command in the sandbox; exit
			// as a shell does for a command ended by SIGINT.
			fmt.Fprintln(os.Stderr, "pandastack: interrupted")
			os.Exit(130)
		}
		if err != nil {
			// As docker exec does, so that a script tells the command's own
			// failure from the CLI's: 127 no such program, 126 not
			// runnable, 125 anything else (the sandbox, the server, the
			// connection); the command's own status is never one of these
			// unless it chose it.
			fmt.Fprintln(os.Stderr, "pandastack:", explainAPI(err, c, keyFrom))
			os.Exit(execErrorCode(err))
		}
		if code := execExitCode(res); code != 0 {
			os.Exit(code)
		}
	case "kill-processes":
		if len(args) != 1 || strings.HasPrefix(args[0], "-") {
			return badUsage{"usage: pandastack sandbox kill-processes ID"}
		}
		k, err := c.KillAllProcesses(ctx, args[0])
		if err != nil {
			return err
		}
		noun := "processes"
		if k.Killed == 1 {
			noun = "process"
		}
		fmt.Printf("killed %d %s; the kernels and their state are kept\n", k.Killed, noun)
		if k.Remaining > 0 {
			return fmt.Errorf("%d processes were still forking at the end: run it again", k.Remaining)
		}
	case "pause", "resume":
		if len(args) != 1 || strings.HasPrefix(args[0], "-") {
			return badUsage{fmt.Sprintf("usage: pandastack sandbox %s ID", verb)}
		}
		do := c.Pause
		if verb == "resume" {
			do = c.Resume
		}
		sb, err := do(ctx, args[0])
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "%s %s\n", sb.ID, sb.State)
	case "kill", "rm":
		if len(args) == 0 || slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "-") || a == "" }) {
			return badUsage{"usage: pandastack sandbox kill ID..."}
		}
		// Every sandbox named is tried; the errors are reported together.
		var errs []error
		for _, id := range args {
			if err := c.KillSandbox(ctx, id); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return err
		}
	default:
		return badUsage{fmt.Sprintf("sandbox: unknown verb %q; want create, ls, exec or kill", verb)}
	}
	return nil
}

// printableMeta is a metadata key or value for sandbox ls: printable,
// and quoted too where it could read as more than one entry.
func printableMeta(s string) string {
	if strings.ContainsAny(s, ",=\"") {
		return strconv.Quote(s)
	}
	return printable(s)
}

// asksHelp reports whether a verb's arguments ask for its flags: -h among
// the flags before the first other argument (`exec ID -- ls -h` does not;
// nor, conservatively, `--cwd /tmp -h`, whose -h the flags answer once
// the key is found).
func asksHelp(args []string) bool {
	for _, a := range args {
		if isHelp(a) {
			return true
		}
		if a == "--" || !strings.HasPrefix(a, "-") {
			return false
		}
	}
	return false
}

// execErrorCode is the exit status of `sandbox exec` when the command did
// not run (or its run was cut off): docker exec's.
func execErrorCode(err error) int {
	switch {
	case client.IsCode(err, "command_not_found"):
		return 127
	case client.IsCode(err, "permission_denied"):
		return 126
	default:
		return 125
	}
}

// stateWithReason is a sandbox's state for a listing, with why the server
// suspended it: "paused (idle)", "paused (memory)".
func stateWithReason(sb client.Sandbox) string {
	if sb.State == "paused" && sb.PauseReason != "" {
		return string(sb.State) + " (" + sb.PauseReason + ")"
	}
	return string(sb.State)
}
