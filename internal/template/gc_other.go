//go:build !linux

package template

import "errors"

// inUseBy has nothing to report where sandboxes never run.
func inUseBy() (func(dir string) string, error) {
	return func(string) string { return "" }, nil
}

// tryLockName has nothing to lock where nothing is ever built.
func tryLockName(cacheDir, name string) (func(), error) { return func() {}, nil }

// Hold has nothing to hold where sandboxes never run.
func Hold(b Built) (release func(), err error) { return func() {}, nil }

var errHeld = errors.New("in use by a running server")

// lockBuild has nothing to lock where nothing is held.
func lockBuild(b Built) (unlock func(), err error) { return func() {}, nil }
