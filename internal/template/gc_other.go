//go:build !linux

package template

// inUseBy has nothing to report where sandboxes never run.
func inUseBy() (func(dir string) string, error) {
	return func(string) string { return "" }, nil
}

// tryLockName has nothing to lock where nothing is ever built.
func tryLockName(cacheDir, name string) (func(), error) { return func() {}, nil }
