package metrics

import (
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, 100 on every Linux this runs on (sysconf would
// need cgo).
const clockTicks = 100

// readProc reads the process's /proc/self/stat and fd directory.
func readProc() (procStat, bool) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return procStat{}, false
	}
	// The command name, in parentheses, may hold spaces: fields start
	// after its closing one.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime 14, stime 15, rss 24 (in pages).
	if len(f) < 22 {
		return procStat{}, false
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	rss, _ := strconv.ParseInt(f[21], 10, 64)
	st := procStat{rssBytes: rss * int64(os.Getpagesize()), cpuSeconds: (utime + stime) / clockTicks}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		st.openFDs = len(ents)
	}
	return st, true
}
