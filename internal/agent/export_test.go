package agent

import "time"

// SetDrainMax sets drainMax for a test; the returned func puts it back.
func SetDrainMax(d time.Duration) (restore func()) {
	old := drainMax
	drainMax = d
	return func() { drainMax = old }
}

// SetMaxListed sets maxListed for a test; the returned func puts it back.
func SetMaxListed(n int) (restore func()) {
	old := maxListed
	maxListed = n
	return func() { maxListed = old }
}

// SetStdinWait sets stdinWait for a test; the returned func puts it back.
func SetStdinWait(d time.Duration) (restore func()) {
	old := stdinWait
	stdinWait = d
	return func() { stdinWait = old }
}

// SetRootPlaced sets rootPlaced for a test; the returned func puts it back.
func SetRootPlaced(f func(p string)) (restore func()) {
	old := rootPlaced
	rootPlaced = f
	return func() { rootPlaced = old }
}
