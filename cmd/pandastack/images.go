package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/imagestore/s3"
)

// openImages opens the snapshot store cfg.SnapshotStore names, with a
// description for the log (no credentials).
//
//	""                  a local directory, <data dir>/snapshots (the default)
//	file:///abs/path    a local directory elsewhere (shared storage, say)
//	s3://bucket/prefix  S3-compatible object storage: endpoint from
//	                    PANDASTACK_S3_ENDPOINT, credentials from AWS_ACCESS_KEY_ID
//	                    and AWS_SECRET_ACCESS_KEY, region from AWS_REGION
//	                    (us-east-1); a local cache in <data dir>/snapshot-cache
func openImages(ctx context.Context, cfg *Config) (pandastack.ImageStore, string, error) {
	ref := cfg.SnapshotStore
	switch {
	case ref == "":
		return imagestore.NewLocal(cfg.snapshotDir()), "local " + cfg.snapshotDir(), nil
	case strings.HasPrefix(ref, "file://"):
		path := strings.TrimPrefix(ref, "file://")
		if !filepath.IsAbs(path) {
			return nil, "", fmt.Errorf("--snapshot-store %s: give an absolute path, e.g. file:///srv/pandastack/snapshots", ref)
		}
		// Copies a dead server left, from another filesystem; an hour
		// without a write tells them from one under way elsewhere.
		imagestore.SweepCopies(path, time.Hour)
		return imagestore.NewLocal(path), "local " + path, nil
	case strings.HasPrefix(ref, "s3://"):
		bucket, prefix, err := s3.ParseURL(ref)
		if err != nil {
			return nil, "", err
		}
		endpoint := os.Getenv("PANDASTACK_S3_ENDPOINT")
		if endpoint == "" {
			return nil, "", fmt.Errorf("--snapshot-store %s: set PANDASTACK_S3_ENDPOINT to the object storage's URL, e.g. http://127.0.0.1:7070", ref)
		}
		s, err := s3.New(ctx, s3.Config{
			Endpoint: endpoint, Bucket: bucket, Prefix: prefix, Region: os.Getenv("AWS_REGION"),
			AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"), SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY"),
			CacheDir: cfg.snapshotCacheDir(), CacheMaxBytes: cfg.SnapshotCacheMaxBytes,
		})
		if err != nil {
			return nil, "", err
		}
		return s, s.String(), nil
	default:
		scheme, _, _ := strings.Cut(ref, ":")
		return nil, "", fmt.Errorf("--snapshot-store: unknown kind %q; want empty (a directory in the data dir), file:///path or s3://bucket/prefix", scheme)
	}
}
