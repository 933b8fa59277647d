package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/client"
)

var (
	// errHelp: -h printed the usage; the command succeeded.
	errHelp = errors.New("help requested")
	// errUsage: the flag package already printed what was wrong, and the
	// usage; main exits 2 without saying it again.
	errUsage = errors.New("usage error")
)

// parseFlags parses args into fs. Without positional, an argument left
// over is refused: the flag package stops at the first one, so every flag
// after it would be dropped unseen.
func parseFlags(fs *flag.FlagSet, args []string, positional bool) error {
	if asksHelp(args) && fs.Output() == io.Writer(os.Stderr) {
		fs.SetOutput(os.Stdout) // asked for: the answer, not an error (| less, | grep)
	}
	if !slices.ContainsFunc(args, isHelp) {
		// A mistake gets its error and where the flags are, not every
		// flag (serve's run to 6 KB, which buried the error).
		fs.Usage = func() { fmt.Fprintf(fs.Output(), "Run 'pandastack %s -h' for its flags.\n", fs.Name()) }
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return errUsage
	}
	if !positional && fs.NArg() > 0 {
		return badUsage{fmt.Sprintf("%s: unexpected argument %q: it takes flags only (see pandastack %s -h)", fs.Name(), fs.Arg(0), fs.Name())}
	}
	return nil
}

// parseInterspersed parses args into fs with flags before, between and
// after the positional arguments (`template build NAME --force`); after
// "--" everything is positional. For commands whose positional arguments
// are never a command line of their own.
func parseInterspersed(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := parseFlags(fs, args, true); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	return fs.Parse(append([]string{"--"}, pos...))
}

// printable is s for a terminal: as it is, or quoted with its control
// characters escaped (a name stored before they were refused).
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, unsafeOnTerminal) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// unsafeOnTerminal: control characters, and the invisible ones that
// change how a line reads (bidi overrides, zero widths, line separators).
func unsafeOnTerminal(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// showOnly makes -h of fs list only the named flags: a command that binds
// every setting of serve (Config.bind) but reads a few of them. The others
// still parse, as their environment variables do.
func showOnly(fs *flag.FlagSet, names ...string) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of %s:\n", fs.Name())
		shown := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		shown.SetOutput(fs.Output())
		fs.VisitAll(func(f *flag.Flag) {
			for _, n := range names {
				if f.Name == n {
					shown.Var(f.Value, f.Name, f.Usage)
					shown.Lookup(f.Name).DefValue = f.DefValue
				}
			}
		})
		shown.PrintDefaults()
	}
}

func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

// verbsHelp answers a command given no verb (an error) or asking for help
// (the usage on stdout, success).
func verbsHelp(args []string, usage string) error {
	if len(args) == 0 {
		return badUsage{usage} // no verb: a command line it cannot parse (2)
	}
	fmt.Println(usage)
	return errHelp
}

// flagGiven reports whether the command line set flag name.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// durationFlag defines a duration flag that also takes plain seconds
// ("600"), as the API's *_seconds fields and the server's variables do.
func durationFlag(fs *flag.FlagSet, name string, usage string) *time.Duration {
	d := new(time.Duration)
	fs.Func(name, usage, func(s string) error {
		v, err := parseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as 90s or 10m, or seconds")
		}
		*d = v
		return nil
	})
	return d
}

// wholeSeconds turns a duration flag into the API's seconds, refusing
// what the API cannot say (0 stays 0: the server's default). Callers that
// know what their flag's 0 and negatives mean say so first; a negative
// that gets here is refused for its sign, not for a fraction it lacks.
func wholeSeconds(flagName string, d time.Duration) (int64, error) {
	if d < 0 {
		return 0, fmt.Errorf("%s %v is negative: give a time such as 90s or 10m", flagName, d)
	}
	if d%time.Second != 0 {
		return 0, fmt.Errorf("%s %v: give a whole number of seconds, such as 90s or 10m", flagName, d)
	}
	return int64(d / time.Second), nil
}

// maxStdin is what `sandbox exec --stdin` sends at most: the server takes
// JSON bodies of up to 8 MiB, and the input goes in one as a string, JSON
// escapes included; the rest is room for the request's other fields.
const maxStdin = 8<<20 - 64<<10

// readStdin reads this process's standard input for `sandbox exec --stdin`.
func readStdin() (string, error) {
	b, err := io.ReadAll(io.LimitReader(os.Stdin, maxStdin+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("--stdin: %w", err)
	case len(b) > maxStdin:
		return "", errTooMuchStdin
	case !utf8.Valid(b):
		return "", errors.New("--stdin: the input is not UTF-8 text; upload binary input as a file and read it from there")
	case jsonLen(string(b)) > maxStdin:
		return "", errTooMuchStdin
	}
	return string(b), nil
}

// execExitCode is the exit code of `sandbox exec` for a command's result,
// as a shell would give it: the command's own, 128+N for one killed by
// signal N, 124 for a timeout (as timeout(1)). It says why on stderr when
// the command did not exit by itself.
func execExitCode(res *client.ExecResult) int {
	switch {
	case res.TimedOut:
		fmt.Fprintln(os.Stderr, "pandastack: the command timed out and was killed")
		return 124
	case res.Signal != "":
		fmt.Fprintf(os.Stderr, "pandastack: the command was killed by %s\n", res.Signal)
		if n := unix.SignalNum(res.Signal); n > 0 {
			return 128 + int(n)
		}
		if n, err := strconv.Atoi(strings.TrimPrefix(res.Signal, "SIG")); err == nil && n > 0 && n < 128 {
			return 128 + n // a real-time signal, named by number ("SIG34")
		}
		return 1
	case res.ExitCode < 0:
		return 1 // no exit status (the agent could not wait for it): a failure
	}
	return min(res.ExitCode, 255)
}

var errTooMuchStdin = errors.New("--stdin: over the server's limit of 8 MiB per request (as JSON text); upload large input as a file and read it from there")

// jsonLen is the length of s as a JSON string.
func jsonLen(s string) int {
	b, _ := json.Marshal(s)
	return len(b)
}
