package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func bindWith(t *testing.T, env map[string]string, args ...string) (Config, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg := defaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.bind(fs)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	return cfg, cfg.validate()
}

// Malformed PANDASTACK_* values are refused at start, naming the variable.
func TestMalformedEnvIsRefused(t *testing.T) {
	for env, val := range map[string]string{
		"PANDASTACK_MAX_FORK":         "lots",
		"PANDASTACK_IDLE_TIMEOUT":     "soon",
		"PANDASTACK_WARM":             "maybe",
		"PANDASTACK_MAX_UPLOAD_BYTES": "4G",
	} {
		_, err := bindWith(t, map[string]string{env: val})
		if err == nil || !strings.Contains(err.Error(), env) || !strings.Contains(err.Error(), val) {
			t.Errorf("%s=%s: %v", env, val, err)
		}
	}
}

func TestEnvAndFlags(t *testing.T) {
	cfg, err := bindWith(t, map[string]string{"PANDASTACK_IDLE_TIMEOUT": "90", "PANDASTACK_WARM": "false", "PANDASTACK_MAX_FORK": "4"}, "--max-fork", "8")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Sandbox.IdleTimeout != 90*time.Second || cfg.Warm || cfg.Sandbox.MaxFork != 8 {
		t.Fatalf("idle %s, warm %v, max fork %d", cfg.Sandbox.IdleTimeout, cfg.Warm, cfg.Sandbox.MaxFork)
	}
}

// The defaults are the packages' own.
func TestDefaults(t *testing.T) {
	cfg, err := bindWith(t, nil)
	if err != nil || cfg.Sandbox.IdleTimeout != 300*time.Second || cfg.Sandbox.DefaultTTL != 300*time.Second || cfg.API.ExecOutputCap != 4<<20 {
		t.Fatalf("defaults: %+v %v", cfg.Sandbox, err)
	}
	if _, err := bindWith(t, nil, "--idle-timeout", "-1s"); err == nil {
		t.Fatal("a negative idle timeout was accepted")
	}
}
