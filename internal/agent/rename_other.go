//go:build !linux

package agent

func renameNoReplace(from, to string) error { return renameUnlessThere(from, to) }
