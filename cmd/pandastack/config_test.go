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

// Malformed PANDASTACK_* values used to be ignored silently; serve must
// refuse to start on them, naming each one.
func TestMalformedEnvironmentIsRefused(t *testing.T) {
	for env, val := range map[string]string{
		"PANDASTACK_MAX_CPU":          "two",
		"PANDASTACK_DEFAULT_TTL":      "5 minutes",
		"PANDASTACK_WARM":             "yes please",
		"PANDASTACK_KILL_ON_EXIT":     "maybe",
		"PANDASTACK_MAX_UPLOAD_BYTES": "4G",
		"PANDASTACK_POOL_SIZE":        "-",
		// These two were dropped without a word.
		"PANDASTACK_SNAPSHOT_CACHE_MAX_BYTES": "lots",
		"PANDASTACK_NETWORK_ALLOW_PRIVATE":    "172.16.0.0/12,x",
	} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, val)
			cfg := defaultConfig()
			cfg.bind(flag.NewFlagSet("serve", flag.ContinueOnError))
			err := cfg.validate()
			if err == nil || !strings.Contains(err.Error(), env) || !strings.Contains(err.Error(), val) {
				t.Fatalf("%s=%q: validate = %v, want an error naming it", env, val, err)
			}
		})
	}
	t.Run("log level", func(t *testing.T) {
		t.Setenv("PANDASTACK_LOG_LEVEL", "loud")
		cfg := defaultConfig()
		cfg.bind(flag.NewFlagSet("serve", flag.ContinueOnError))
		if err := cfg.validate(); err == nil || !strings.Contains(err.Error(), "loud") {
			t.Fatalf("validate = %v", err)
		}
	})
	t.Run("well-formed values pass", func(t *testing.T) {
		for env, val := range map[string]string{"PANDASTACK_MAX_CPU": "2", "PANDASTACK_DEFAULT_TTL": "5m", "PANDASTACK_WARM": "0", "PANDASTACK_KILL_ON_EXIT": "true"} {
			t.Setenv(env, val)
		}
		cfg := defaultConfig()
		cfg.bind(flag.NewFlagSet("serve", flag.ContinueOnError))
		if err := cfg.validate(); err != nil || cfg.Warm || !cfg.KillOnExit {
			t.Fatalf("validate = %v (warm %v, kill on exit %v)", err, cfg.Warm, cfg.KillOnExit)
		}
	})
}

// A negative count or size is refused, naming the flag: it would not mean
// none or no limit (an exec output cap of -1 emptied every exec's answer).
func TestNegativeSettingsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--exec-output-cap", "-1"},
		{"--max-upload-bytes", "-5"},
		{"--pool-size", "-3"},
		{"--prepared-creates", "-2"},
		{"--max-restores", "-1"},
		{"--snapshot-cache-max-bytes", "-1"},
		{"--public-domain", "http://sandboxes.example.com"},
		{"--metrics-listen", "127.0.0.1:8080"}, // the API's own address
	} {
		if _, err := bindWith(t, nil, args...); err == nil || !strings.Contains(err.Error(), args[0]) {
			t.Errorf("%v: %v, want a refusal naming the flag", args, err)
		}
	}
	for _, args := range [][]string{{"--pool-size", "0"}, {"--max-restores", "0"}, {"--exec-output-cap", "0"}, {"--public-domain", "sandboxes.example.com"}, {"--metrics-listen", "127.0.0.1:9464"}} {
		if _, err := bindWith(t, nil, args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	t.Run("from the environment", func(t *testing.T) {
		if _, err := bindWith(t, map[string]string{"PANDASTACK_POOL_SIZE": "-3"}); err == nil || !strings.Contains(err.Error(), "--pool-size") {
			t.Errorf("PANDASTACK_POOL_SIZE=-3: %v, want a refusal", err)
		}
	})
}

// The node id is made once and kept in the data dir; bad node settings are
// refused at start.
func TestNodeSettings(t *testing.T) {
	dir := t.TempDir()
	cfg, err := bindWith(t, nil, "--listen", "127.0.0.1:9000")
	if err != nil {
		t.Fatal(err)
	}
	n1, err := cfg.Nodes.node(dir, cfg.Listen, false)
	if err != nil {
		t.Fatal(err)
	}
	n2, err := cfg.Nodes.node(dir, cfg.Listen, true)
	if err != nil || n2.ID != n1.ID || !strings.HasPrefix(n1.ID, "node_") {
		t.Fatalf("node ids %q then %q (%v); want one stable id", n1.ID, n2.ID, err)
	}
	if n1.URL != "http://127.0.0.1:9000" || n1.PlaceRestores || !n2.PlaceRestores || n1.PlaceLocal {
		t.Errorf("node settings = %+v", n1)
	}
	cfg, err = bindWith(t, map[string]string{"PANDASTACK_NODE_ID": "edge-1"}, "--advertise-url", "http://10.0.0.5:8080/", "--placement", "local")
	if err != nil {
		t.Fatal(err)
	}
	n, err := cfg.Nodes.node(dir, cfg.Listen, false)
	if err != nil || n.ID != "edge-1" || n.URL != "http://10.0.0.5:8080" || !n.PlaceLocal {
		t.Errorf("node from flags = %+v, %v", n, err)
	}
	for _, args := range [][]string{
		{"--node-id", "no spaces"}, {"--advertise-url", "10.0.0.5:8080"}, {"--placement", "random"},
		{"--node-heartbeat", "10s", "--node-grace", "15s"},
	} {
		if _, err := bindWith(t, nil, args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

// --max-disk-mb bounds disk_mb; it may not be below the smallest disk or
// the default one.
func TestMaxDiskMB(t *testing.T) {
	cfg, err := bindWith(t, map[string]string{"PANDASTACK_MAX_DISK_MB": "4096"})
	if err != nil || cfg.Sandbox.MaxDiskMB != 4096 {
		t.Fatalf("max disk %d, %v", cfg.Sandbox.MaxDiskMB, err)
	}
	for _, args := range [][]string{{"--max-disk-mb", "32"}, {"--max-disk-mb", "1024", "--disk-mb", "2048"}} {
		if _, err := bindWith(t, nil, args...); err == nil || !strings.Contains(err.Error(), "max-disk-mb") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// --public-url is a scheme and a host, which token URLs are made on; a
// trailing slash is dropped, anything more is refused.
func TestPublicURL(t *testing.T) {
	cfg, err := bindWith(t, map[string]string{"PANDASTACK_PUBLIC_URL": "https://sandboxes.example.com/"})
	if err != nil || cfg.API.PublicURL != "https://sandboxes.example.com" {
		t.Fatalf("public URL %q, %v", cfg.API.PublicURL, err)
	}
	for _, v := range []string{"sandboxes.example.com", "ftp://sandboxes.example.com", "https://", "https://sandboxes.example.com/api", "https://u:p@sandboxes.example.com", "https://sandboxes.example.com?x=1"} {
		if _, err := bindWith(t, nil, "--public-url", v); err == nil || !strings.Contains(err.Error(), "public-url") {
			t.Errorf("%s: %v", v, err)
		}
	}
}
