package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// idleCPUs measures how many of the host's CPUs sat idle (or waited for
// I/O) over d, from /proc/stat: 1.5 on a 2-CPU host means a quarter busy.
// It returns ctx's error if ctx ends first.
func idleCPUs(ctx context.Context, d time.Duration) (float64, error) {
	idle, _, err := IdleCPUs(ctx, d)
	return idle, err
}

// IdleCPUs is idleCPUs for tools outside the package, such as the
// benchmark's quiet gate, with the number of CPUs /proc/stat counts: the
// host's, which runtime.NumCPU (the process's own, under a cpuset or an
// affinity mask) may not be.
func IdleCPUs(ctx context.Context, d time.Duration) (idle float64, cpus int, err error) {
	idle0, total0, n, err := cpuTicks()
	if err != nil {
		return 0, 0, err
	}
	select {
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-time.After(d):
	}
	idle1, total1, _, err := cpuTicks()
	if err != nil {
		return 0, 0, err
	}
	if total1 <= total0 {
		return float64(n), n, nil // no tick went by: nothing says busy
	}
	return float64(n) * float64(idle1-idle0) / float64(total1-total0), n, nil
}

// cpuTicks reads the host's CPU time so far from /proc/stat: idle and
// I/O wait ticks, all ticks, and the number of CPUs.
func cpuTicks() (idle, total uint64, cpus int, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	found := false
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "cpu") {
			continue
		}
		if fields[0] != "cpu" {
			cpus++
			continue
		}
		found = true
		idle, total, err = parseCPULine(fields[1:])
		if err != nil {
			return 0, 0, 0, err
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, 0, err
	}
	if !found || cpus == 0 {
		return 0, 0, 0, fmt.Errorf("/proc/stat: no cpu lines")
	}
	return idle, total, cpus, nil
}

// parseCPULine adds up the fields of /proc/stat's "cpu" line: user nice
// system idle iowait irq softirq steal (guest time is already in user).
func parseCPULine(fields []string) (idle, total uint64, err error) {
	for i, f := range fields {
		if i >= 8 {
			break
		}
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q: %w", f, err)
		}
		total += v
		if i == 3 || i == 4 {
			idle += v
		}
	}
	if len(fields) < 5 {
		return 0, 0, fmt.Errorf("/proc/stat: a cpu line of %d fields", len(fields))
	}
	return idle, total, nil
}
