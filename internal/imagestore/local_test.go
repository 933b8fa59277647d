package imagestore_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/imagestore/imagestoretest"
)

// Two Locals on one directory are two servers sharing it (e.g. over NFS).
func TestLocal(t *testing.T) {
	var mu sync.Mutex
	roots := map[*testing.T]string{}
	root := func(t *testing.T) string {
		mu.Lock()
		defer mu.Unlock()
		if roots[t] == "" {
			roots[t] = t.TempDir()
		}
		return roots[t]
	}
	imagestoretest.Run(t, imagestoretest.Harness{
		New: func(t *testing.T) pandastack.ImageStore {
			return imagestore.NewLocal(root(t))
		},
		Corrupt: func(t *testing.T, id, name string, data []byte) {
			p := filepath.Join(root(t), id, imagestore.FilesDir, name)
			if data == nil {
				os.Remove(p)
				return
			}
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
		},
		BigFile: 12 << 20,
	})
}
