//go:build !linux

package main

// lockDataDir is a no-op where serve cannot run anyway (it needs gVisor,
// which is Linux only).
func lockDataDir(dir string) (release func(), err error) { return func() {}, nil }
