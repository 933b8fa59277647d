package agent

import "time"

// SetDrainMax sets drainMax for a test; the returned func puts it back.
func SetDrainMax(d time.Duration) (restore func()) {
	old := drainMax
	drainMax = d
	return func() { drainMax = old }
}
