package main

import (
	"errors"
	"flag"
	"io"
	"net"
	"net/url"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/client"
)

func TestExecExitCode(t *testing.T) {
	for _, tc := range []struct {
		res  client.ExecResult
		want int
	}{
		{client.ExecResult{ExitCode: 0}, 0},
		{client.ExecResult{ExitCode: 3}, 3},
		{client.ExecResult{ExitCode: 300}, 255},
		{client.ExecResult{ExitCode: -1}, 1},
		{client.ExecResult{ExitCode: -1, Signal: "SIGKILL"}, 137},
		{client.ExecResult{ExitCode: -1, Signal: "SIGTERM"}, 143},
		{client.ExecResult{ExitCode: -1, Signal: "SIG34"}, 162},
		{client.ExecResult{ExitCode: -1, Signal: "SIGWHAT"}, 1},
		{client.ExecResult{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}, 124},
	} {
		if got := execExitCode(&tc.res); got != tc.want {
			t.Errorf("%+v: exit %d, want %d", tc.res, got, tc.want)
		}
	}
}

func TestWholeSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, time.Second: 1, 10 * time.Minute: 600} {
		if got, err := wholeSeconds("--ttl", d); err != nil || got != want {
			t.Errorf("%v: %d %v", d, got, err)
		}
	}
	for d, says := range map[time.Duration]string{
		500 * time.Millisecond:  "whole number of seconds",
		1500 * time.Millisecond: "whole number of seconds",
		-time.Second:            "is negative",
	} {
		if _, err := wholeSeconds("--ttl", d); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%v: %v, want a refusal saying %q", d, err, says)
		}
	}
}

// Every verb exits as the README says: 2 for a command line pandastack
// cannot parse (an unknown verb or flag, an argument missing or one too
// many), 1 for one it parses but cannot carry out. None of these reach a
// server or a store.
func TestCommandLineExitCodes(t *testing.T) {
	t.Setenv("PANDASTACK_API", "http://127.0.0.1:1") // refused, if anything got that far
	t.Setenv("PANDASTACK_API_KEY", "pds_test")
	t.Setenv("PANDASTACK_DATA_DIR", t.TempDir()) // no store in it
	t.Setenv("PANDASTACK_STORE", "")
	for _, tc := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"frob"}, 2, `unknown command "frob"`},
		{[]string{"sandbox"}, 2, "usage: pandastack sandbox"},
		{[]string{"sandbox", "frob"}, 2, "unknown verb"},
		{[]string{"sandbox", "create", "base"}, 2, `unexpected argument "base"`},
		{[]string{"sandbox", "create", "--ttl", "10x"}, 2, ""},
		{[]string{"sandbox", "ls", "--nope"}, 2, ""},
		{[]string{"sandbox", "exec"}, 2, "usage: pandastack sandbox exec"},
		{[]string{"sandbox", "exec", "sbx_x"}, 2, "usage: pandastack sandbox exec"},
		{[]string{"sandbox", "exec", "sbx_x", "--cwd", "/tmp"}, 2, "goes before the sandbox id"},
		{[]string{"sandbox", "kill-processes"}, 2, "usage: pandastack sandbox kill-processes ID"},
		{[]string{"sandbox", "pause"}, 2, "usage: pandastack sandbox pause ID"},
		{[]string{"sandbox", "resume", "sbx_a", "sbx_b"}, 2, "usage: pandastack sandbox resume ID"},
		{[]string{"sandbox", "kill"}, 2, "usage: pandastack sandbox kill ID..."},
		{[]string{"keys"}, 2, "usage: pandastack keys"},
		{[]string{"keys", "revoke"}, 2, "keys revoke: give one key"},
		{[]string{"keys", "revoke", "key_a", "key_b"}, 2, "keys revoke: give one key"},
		{[]string{"keys", "list", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"template", "build"}, 2, "template build: give one template name"},
		{[]string{"template", "ls", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"nodes", "forget"}, 2, "usage: pandastack nodes forget ID"},
		{[]string{"nodes", "ls", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"mcp", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"serve", "extra"}, 2, `unexpected argument "extra"`},
		// Parsed, but asking for what cannot be.
		{[]string{"sandbox", "create", "--ttl", "-5"}, 1, "--ttl -5s: give a positive time to live"},
		{[]string{"sandbox", "create", "--ttl", "0"}, 1, "--ttl 0s: give a positive time to live"},
		{[]string{"sandbox", "create", "--ttl", "1.5s"}, 1, "give a whole number of seconds"},
		{[]string{"sandbox", "create", "--idle-timeout", "-1"}, 1, "--idle-timeout -1s: give a positive time, such as 10m, after which an idle sandbox is suspended to disk, or 0 to never suspend it"},
		{[]string{"sandbox", "create", "--snapshot", "snap_x", "--template", "base"}, 1,
			"--template with --snapshot: a restore takes its template, CPUs, memory, disk and env from the snapshot; leave --template out"},
		{[]string{"keys", "revoke", "key_a"}, 1, "no PandaStack store"},
		{[]string{"nodes", "forget", "node-a"}, 1, "no PandaStack store"},
	} {
		err := run(tc.args[0], tc.args[1:])
		if code := exitCode(err); code != tc.code || err != nil && !strings.Contains(err.Error(), tc.says) {
			t.Errorf("pandastack %s: exit %d (%v), want %d saying %q", strings.Join(tc.args, " "), code, err, tc.code, tc.says)
		}
	}
	for _, args := range [][]string{{"version"}, {"sandbox", "pause", "-h"}} {
		if err := run(args[0], args[1:]); exitCode(err) != 0 {
			t.Errorf("pandastack %s: %v, want exit 0", strings.Join(args, " "), err)
		}
	}
}

func TestFlagGiven(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Duration("ttl", 0, "")
	fs.Int("cpu", 0, "")
	if err := fs.Parse([]string{"--ttl", "0s"}); err != nil {
		t.Fatal(err)
	}
	if !flagGiven(fs, "ttl") || flagGiven(fs, "cpu") {
		t.Errorf("given: ttl %v, cpu %v; want true, false", flagGiven(fs, "ttl"), flagGiven(fs, "cpu"))
	}
}

func TestParseFlagsRefusesStrayArguments(t *testing.T) {
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("sandbox create", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Duration("ttl", 0, "")
		return fs
	}
	if err := parseFlags(newFS(), []string{"--ttl", "1m"}, false); err != nil {
		t.Fatal(err)
	}
	if err := parseFlags(newFS(), []string{"code-interpreter", "--ttl", "1m"}, false); err == nil {
		t.Error("a stray argument was accepted (and the flags after it dropped)")
	}
	if err := parseFlags(newFS(), []string{"ID", "--", "ls"}, true); err != nil {
		t.Errorf("positional arguments where they are expected: %v", err)
	}
	if err := parseFlags(newFS(), []string{"-h"}, false); err != errHelp {
		t.Errorf("-h: %v, want errHelp", err)
	}
	var out strings.Builder
	fs := newFS()
	fs.SetOutput(&out)
	if err := parseFlags(fs, []string{"--ttl", "soon"}, false); err != errUsage || !strings.Contains(out.String(), `invalid value "soon" for flag -ttl`) ||
		!strings.HasSuffix(out.String(), "Run 'pandastack "+fs.Name()+" -h' for its flags.\n") || strings.Contains(out.String(), "Usage of") {
		t.Errorf("a bad value: %v, said %q; want the error and where the flags are, not all of them", err, out.String())
	}
	if err := parseFlags(newFS(), []string{"--nope"}, false); err != errUsage {
		t.Errorf("an unknown flag: %v, want errUsage", err)
	}
}

// `template build NAME --force`, as the usage writes it: flags after the
// name count; after "--" everything is a name.
func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		force bool
		dir   string
		pos   string
	}{
		{[]string{"base", "--force"}, true, "", "base"},
		{[]string{"--force", "base"}, true, "", "base"},
		{[]string{"key_1", "--data-dir", "/d", "key_2"}, false, "/d", "key_1 key_2"},
		{[]string{"a", "--", "--force"}, false, "", "a --force"},
		{nil, false, "", ""},
	} {
		fs := flag.NewFlagSet("template build", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		force := fs.Bool("force", false, "")
		dir := fs.String("data-dir", "", "")
		if err := parseInterspersed(fs, tc.args); err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if *force != tc.force || *dir != tc.dir || strings.Join(fs.Args(), " ") != tc.pos {
			t.Errorf("%q: force %v dir %q args %q", tc.args, *force, *dir, fs.Args())
		}
	}
	fs := flag.NewFlagSet("template build", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := parseInterspersed(fs, []string{"base", "--nope"}); err == nil {
		t.Error("an unknown flag after the name was accepted")
	}
}

func TestPrintable(t *testing.T) {
	if got := printable("ci key é"); got != "ci key é" {
		t.Errorf("plain name: %q", got)
	}
	if got := printable("\x1b[2Jfake\nrow"); strings.ContainsAny(got, "\x1b\n") {
		t.Errorf("control characters reach the terminal: %q", got)
	}
}

// -h of a command that binds every setting lists only what it reads.
func TestShowOnly(t *testing.T) {
	fs := flag.NewFlagSet("keys create", flag.ContinueOnError)
	var out strings.Builder
	fs.SetOutput(&out)
	fs.String("project", "default", "project of the key")
	fs.Duration("idle-timeout", 0, "a serve setting")
	showOnly(fs, "project")
	if err := parseFlags(fs, []string{"-h"}, false); err != errHelp {
		t.Fatalf("-h: %v", err)
	}
	if !strings.Contains(out.String(), "-project") || strings.Contains(out.String(), "idle-timeout") {
		t.Errorf("usage:\n%s", out.String())
	}
	if err := parseFlags(fs, []string{"--idle-timeout", "5s"}, false); err != nil {
		t.Errorf("a setting left out of the usage no longer parses: %v", err)
	}
}

// The CLI's policy is never more open than its flags say: --allow-out
// alone reaches only those, and --deny-out needs --network internet.
func TestCLINetwork(t *testing.T) {
	for _, tc := range []struct {
		mode            string
		allow, deny     []string
		want            *pandastack.NetworkPolicy
		wantErrContains string
	}{
		{"", nil, nil, nil, ""},
		{"", []string{"api.example.com"}, nil, &pandastack.NetworkPolicy{AllowOut: []string{"api.example.com"}}, ""},
		{"internet", nil, []string{"198.51.100.0/24"}, &pandastack.NetworkPolicy{AllowInternetAccess: true, DenyOut: []string{"198.51.100.0/24"}}, ""},
		{"none", nil, nil, &pandastack.NetworkPolicy{}, ""},
		{"", nil, []string{"198.51.100.0/24"}, nil, "--deny-out needs --network internet"},
		{"none", nil, []string{"198.51.100.0/24"}, nil, "--deny-out needs --network internet"},
		{"open", nil, nil, nil, "--network must be internet or none"},
	} {
		got, err := cliNetwork(tc.mode, tc.allow, tc.deny)
		if tc.wantErrContains != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrContains) {
				t.Errorf("%q %v %v: err %v", tc.mode, tc.allow, tc.deny, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q %v %v: %v", tc.mode, tc.allow, tc.deny, err)
			continue
		}
		if tc.want != nil {
			w := tc.want.Normalized()
			tc.want = &w
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q %v %v: %+v, want %+v", tc.mode, tc.allow, tc.deny, got, tc.want)
		}
	}
}

// Metadata reaches the terminal escaped when it holds control characters,
// and quoted when it could be read as another entry or another split of
// key and value.
func TestPrintableMeta(t *testing.T) {
	for in, want := range map[string]string{
		"suite":                     "suite",
		"b=c":                       `"b=c"`,
		"café":                      "café",
		"\x1b]0;pwned\a\x1b[31mred": `"\x1b]0;pwned\a\x1b[31mred"`,
		"a\nfake row":               `"a\nfake row"`,
		"a,b=c":                     `"a,b=c"`,
		"\xff":                      `"\xff"`,
		"abc\u202edef":              `"abc\u202edef"`,
		"a\u2028b":                  `"a\u2028b"`,
	} {
		if got := printableMeta(in); got != want {
			t.Errorf("printableMeta(%q) = %s, want %s", in, got, want)
		}
	}
}

// --stdin takes what fits the server's 8 MiB JSON body, escapes counted,
// and says so, with the way out, past it.
func TestReadStdinFitsTheServer(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"7 MiB of text", strings.Repeat("a", 7<<20), true},
		{"9 MiB of text", strings.Repeat("a", 9<<20), false},
		// Each control character is six bytes as JSON (\u0001).
		{"2 MiB of control characters", strings.Repeat("\x01", 2<<20), false},
	} {
		f, err := os.CreateTemp(t.TempDir(), "stdin")
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(c.in)
		f.Seek(0, 0)
		old := os.Stdin
		os.Stdin = f
		got, err := readStdin()
		os.Stdin = old
		f.Close()
		if c.ok && (err != nil || got != c.in) {
			t.Errorf("%s: %v", c.name, err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), "8 MiB") || !strings.Contains(err.Error(), "upload large input as a file")) {
			t.Errorf("%s: %v, want the limit named", c.name, err)
		}
	}
}

func TestAsksHelp(t *testing.T) {
	for args, want := range map[string]bool{
		"-h": true, "--metadata=a=b -h": true, "--help": true,
		// A flag's value ends the scan (the key is then needed, and the
		// flags still answer -h).
		"--metadata a=b -h": false,
		"sbx_x -- ls -h":    false, "sbx_x ls -h": false, "": false, "--cwd /tmp": false,
	} {
		if got := asksHelp(strings.Fields(args)); got != want {
			t.Errorf("asksHelp(%q) = %v, want %v", args, got, want)
		}
	}
}

// An API call's error says which server and which key the CLI used.
func TestExplainAPI(t *testing.T) {
	c := client.New("https://127.0.0.1:8080", "pds_x")
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&url.Error{Op: "Get", URL: "https://127.0.0.1:8080/v1/sandboxes", Err: errors.New("http: server gave HTTP response to HTTPS client")}, "answered plain HTTP: PANDASTACK_API should start with http://"},
		{&url.Error{Op: "Get", URL: "https://127.0.0.1:8080/v1/sandboxes", Err: &net.OpError{Op: "dial", Err: errors.New("connection refused")}}, "cannot reach the PandaStack server at https://127.0.0.1:8080"},
		{&client.Error{Status: 401, Code: "unauthorized", Message: "unknown API key"}, "(the key from PANDASTACK_API_KEY, sent to https://127.0.0.1:8080)"},
		{&client.Error{Status: 501, Code: "http_error", Message: "<html>not here</html>"}, "answered HTTP 501, not as a PandaStack server does"},
	} {
		got := explainAPI(tc.err, c, "PANDASTACK_API_KEY")
		if !strings.Contains(got.Error(), tc.want) || !errors.Is(got, tc.err) {
			t.Errorf("explainAPI(%v) = %q, want %q, wrapping the error", tc.err, got, tc.want)
		}
	}
	// A connection that broke mid-way is not "cannot reach".
	broken := &url.Error{Op: "Post", URL: "x", Err: &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}}
	if got := explainAPI(broken, c, "PANDASTACK_API_KEY"); got != error(broken) {
		t.Errorf("a broken connection: %q, want it as it was", got)
	}
}

// A store URL from the environment shows in -h without its password.
func TestHelpHidesTheStorePassword(t *testing.T) {
	t.Setenv("PANDASTACK_STORE", "postgres://u:S3CRETpw@db/ps")
	c := defaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	c.bind(fs)
	var out strings.Builder
	fs.SetOutput(&out)
	fs.PrintDefaults()
	if strings.Contains(out.String(), "S3CRETpw") || !strings.Contains(out.String(), "postgres://u:") {
		t.Errorf("-h shows the store as:\n%s", out.String())
	}
	if c.Store != "postgres://u:S3CRETpw@db/ps" {
		t.Errorf("the store the server uses: %q", c.Store)
	}
}
