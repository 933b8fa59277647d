package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// firstKey runs ensureFirstKey on an empty store, its output on a terminal
// or not, and returns what it printed, the key file's secret and the
// prefix the store keeps (what `pandastack keys ls` shows).
func firstKey(t *testing.T, terminal bool) (out, secret, prefix, keyPath string) {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{DataDir: dir}
	s, _, err := openStore(t.Context(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keyPath = filepath.Join(dir, "api-key")
	var b bytes.Buffer
	if err := ensureFirstKey(t.Context(), s, keyPath, &b, terminal); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := s.ListAPIKeys(t.Context())
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys after a first start: %v, %v", keys, err)
	}
	return b.String(), strings.TrimSpace(string(raw)), keys[0].Prefix, keyPath
}

// A first start whose output goes to a log (systemd's journal, a pod's
// log) does not put the key there: it names the key by its prefix and
// says where to read it. It printed the whole key, for anyone who reads
// the logs.
func TestFirstKeyNotPrintedToALog(t *testing.T) {
	out, secret, prefix, keyPath := firstKey(t, false)
	if !strings.HasPrefix(secret, "pds_") {
		t.Fatalf("key file holds %.6q…, want a key", secret)
	}
	if strings.Contains(out, secret) || strings.Contains(out, secret[len(prefix):]) {
		t.Errorf("the key is in the output:\n%s", out)
	}
	if !strings.Contains(out, prefix) || !strings.Contains(out, "export PANDASTACK_API_KEY=$(cat "+keyPath+")") {
		t.Errorf("the output does not name the key's prefix %s and how to read it from %s:\n%s", prefix, keyPath, out)
	}
}

// On a terminal, the key is printed once, as before.
func TestFirstKeyPrintedOnATerminal(t *testing.T) {
	out, secret, _, keyPath := firstKey(t, true)
	if !strings.Contains(out, "export PANDASTACK_API_KEY="+secret) || !strings.Contains(out, keyPath) {
		t.Errorf("the output does not show the key and its file:\n%s", out)
	}
}
