package agent

import "testing"

func TestASCap(t *testing.T) {
	const mib = 1 << 20
	l := memLimit{total: 1024 * mib, perKernel: 768 * mib, pressure: 896 * mib, margin: 64 * mib}
	for _, c := range []struct {
		name           string
		vsz, rss, used int64
		want           int64
	}{
		{"small kernel in a quiet sandbox: none", 2000 * mib, 100 * mib, 300 * mib, 0},
		{"just under half its limit: none", 2000 * mib, 383 * mib, 447 * mib, 0},
		{"a small kernel in a busy sandbox: none", 2000 * mib, 100 * mib, 900 * mib, 0},
		{"half its limit: its own room", 2000 * mib, 384 * mib, 400 * mib, 2000*mib + 448*mib},
		{"half its limit in a busy sandbox: the sandbox's room", 2000 * mib, 400 * mib, 800 * mib, 2000*mib + 160*mib},
		{"the smaller room wins", 2000 * mib, 700 * mib, 900 * mib, 2000*mib + 60*mib},
		{"no room left: nothing more", 2000 * mib, 840 * mib, 950 * mib, 2000 * mib},
	} {
		if got := l.asCap(c.vsz, c.rss, c.used); got != c.want {
			t.Errorf("%s: asCap = %d MiB, want %d MiB", c.name, got/mib, c.want/mib)
		}
	}
}
