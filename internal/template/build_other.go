//go:build !linux

package template

import (
	"context"
	"fmt"
)

// Build needs Linux: debootstrap, chroot and mount namespaces.
func Build(ctx context.Context, spec Spec, opts BuildOptions) (Built, error) {
	return Built{}, fmt.Errorf("build template %s: template builds need Linux", spec.Name)
}

// mountsUnder has nothing to report where builds never mount anything.
func mountsUnder(dir string) ([]string, error) { return nil, nil }

// RemoveStale has nothing to do where nothing is ever built.
func RemoveStale(cacheDir string, dryRun bool) ([]Leftover, error) { return nil, nil }

// Leftover is a directory a build left in the cache.
type Leftover struct {
	Dir       string
	SizeBytes int64
}
