package sqlite

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// BenchmarkPutHistory is what recording costs an exec or a cell: two puts
// (begun, ended) of an entry with 1 KiB of output, into a sandbox already
// at its 100 entries (so every put also trims one).
func BenchmarkPutHistory(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "pandastack.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	out := strings.Repeat("x", 1024)
	for i := 0; b.Loop(); i++ {
		e := pandastack.HistoryEntry{ID: "run_" + strconv.Itoa(i), Kind: "exec", Command: "echo hi", StartedAt: time.Now(), Running: true}
		if err := s.PutHistory(ctx, "prj_1", "sbx_1", e, 100); err != nil {
			b.Fatal(err)
		}
		e.Running, e.Stdout = false, out
		if err := s.PutHistory(ctx, "prj_1", "sbx_1", e, 100); err != nil {
			b.Fatal(err)
		}
	}
}
