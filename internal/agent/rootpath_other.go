//go:build !linux

package agent

import (
	"os"
	"path/filepath"
)

// heldDir is, where the agent does not run, only the directory's path: no
// walk, no handle (see rootpath_linux.go).
type heldDir struct{ dir string }

func (d *heldDir) at(name string) string { return filepath.Join(d.dir, name) }
func (d *heldDir) real() (string, error) { return d.dir, nil }
func (d *heldDir) unmake()               {}
func (d *heldDir) close()                {}

func holdDir(dir, p string, create, write bool) (*heldDir, error) {
	if create {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fsError(err, p, write)
		}
	}
	return &heldDir{dir: dir}, nil
}

func realOf(p string) (string, error) { return filepath.EvalSymlinks(p) }
