package template

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/paths"
)

func TestZZByHandBase(t *testing.T) {
	if os.Getenv("BYHAND") == "" {
		t.Skip()
	}
	r, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.Get("base")
	start := time.Now()
	b, err := Build(context.Background(), s, BuildOptions{CacheDir: paths.CacheDir(), Progress: os.Stdout, Force: os.Getenv("FORCE") != ""})
	t.Logf("took %s: %+v err=%v", time.Since(start), b, err)
}
