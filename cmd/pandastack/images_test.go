package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/testutil"
)

// Each --snapshot-store form opens the store it names; bad ones say why.
func TestOpenImages(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir}
	_, desc, err := openImages(t.Context(), &cfg)
	if err != nil || desc != "local "+filepath.Join(dir, "snapshots") {
		t.Errorf("default: %q, %v", desc, err)
	}
	cfg.SnapshotStore = "file:///srv/snaps"
	if _, desc, err := openImages(t.Context(), &cfg); err != nil || desc != "local /srv/snaps" {
		t.Errorf("file:///: %q, %v", desc, err)
	}
	for ref, want := range map[string]string{
		"file://relative/path": "absolute path",
		"gs://bucket":          `unknown kind "gs"`,
		"s3://":                "s3://bucket",
		"s3://bucket/p":        "PANDASTACK_S3_ENDPOINT",
	} {
		cfg.SnapshotStore = ref
		t.Setenv("PANDASTACK_S3_ENDPOINT", "")
		if _, _, err := openImages(t.Context(), &cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want it to say %q", ref, err, want)
		}
	}

	// s3:// reaches a real S3-compatible server with the usual variables.
	srv := testutil.StartS3(t)
	bucket := srv.NewBucket(t)
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	cfg.SnapshotStore = "s3://" + bucket + "/snaps"
	s, desc, err := openImages(t.Context(), &cfg)
	if err != nil || s == nil || !strings.HasPrefix(desc, "s3://"+bucket+"/snaps") || strings.Contains(desc, srv.SecretKey) {
		t.Fatalf("s3://: %q, %v", desc, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "snapshot-cache")); err != nil {
		t.Errorf("no cache dir in the data dir: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	if _, _, err := openImages(t.Context(), &cfg); err == nil {
		t.Errorf("s3:// with a wrong secret opened")
	}
	cfg.SnapshotStore = "s3://absent-bucket"
	if _, _, err := openImages(t.Context(), &cfg); err == nil || !strings.Contains(err.Error(), "absent-bucket") {
		t.Errorf("s3:// of a missing bucket: %v", err)
	}
}
