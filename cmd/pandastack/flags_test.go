package main

import (
	"flag"
	"io"
	"testing"
	"time"

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
	for _, d := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, -time.Second} {
		if _, err := wholeSeconds("--ttl", d); err == nil {
			t.Errorf("%v accepted", d)
		}
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
	if err := parseFlags(newFS(), []string{"--nope"}, false); err != errUsage {
		t.Errorf("an unknown flag: %v, want errUsage", err)
	}
}
