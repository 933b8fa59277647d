package main

import (
	"flag"
	"strings"
	"testing"
)

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
