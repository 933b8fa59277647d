package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/pagecache"
)

func TestFirstResumeSteps(t *testing.T) {
	log := `time=1 level=INFO msg="sandbox created" sandbox=s1
time=2 level=DEBUG msg="sandbox resumed" sandbox=s2 verify_ms=9 restore_ms=99
time=3 level=DEBUG msg="sandbox resumed" sandbox=s1 verify_ms=0.5 restore_ms=210.25 agent_ms=12
time=4 level=DEBUG msg="sandbox resumed" sandbox=s1 verify_ms=1 restore_ms=300 agent_ms=13
`
	steps, order := firstResumeSteps(log, "s1")
	if len(order) != 3 || order[0] != "verify_ms" || order[2] != "agent_ms" {
		t.Fatalf("order %v", order)
	}
	if steps["restore_ms"] != 210.25 || steps["agent_ms"] != 12 {
		t.Errorf("steps %v, want the first s1 line's", steps)
	}
	if steps, order := firstResumeSteps(log, "s3"); len(steps) != 0 || len(order) != 0 {
		t.Errorf("no line of s3: %v %v", steps, order)
	}
}

// dropCache is measured against mincore itself: whatever share the file
// system lets go (a tmpfs keeps every page), it is what pagecache.Resident
// reads afterwards, and a file just written is cached in full.
func TestDropCache(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "image", "pages.img")
	os.MkdirAll(filepath.Dir(path), 0o700)
	data := make([]byte, 3*os.Getpagesize()+100)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, size, err := pagecache.Resident(f)
	if err != nil || size != int64(len(data)) || n != size {
		t.Fatalf("pagecache.Resident of a file just written: %d of %d, %v; want all of %d", n, size, err, len(data))
	}
	f.Sync()
	left, err := dropCache(dir)
	if err != nil {
		t.Fatal(err)
	}
	n, _, err = pagecache.Resident(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(n) / float64(len(data)); left != want {
		t.Errorf("dropCache says %.2f still cached, mincore %.2f", left, want)
	}
	if _, err := dropCache(filepath.Join(dir, "missing")); err == nil {
		t.Error("dropCache of a missing dir: no error")
	}
}

func TestPreparesResumes(t *testing.T) {
	for v, want := range map[string]bool{"": true, "4": true, "1": true, "0": false, "x": true} {
		t.Setenv("PANDASTACK_PREPARED_RESUMES", v)
		if got := preparesResumes(); got != want {
			t.Errorf("PANDASTACK_PREPARED_RESUMES=%q: %v, want %v", v, got, want)
		}
	}
}

func TestPollUntil(t *testing.T) {
	n := 0
	if ok, err := pollUntil(context.Background(), time.Minute, func() bool { n++; return n == 3 }); !ok || err != nil || n != 3 {
		t.Errorf("a condition true on its third check: %v %v after %d checks", ok, err, n)
	}
	if ok, err := pollUntil(context.Background(), 120*time.Millisecond, func() bool { return false }); ok || err != nil {
		t.Errorf("a condition never true: %v %v, want false and no error", ok, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ok, err := pollUntil(ctx, time.Minute, func() bool { return false }); ok || err != context.Canceled {
		t.Errorf("an ended context: %v %v, want its error", ok, err)
	}
}
