package metrics

import (
	"runtime"
	"time"
)

// RegisterProcess adds the serving process's own series: goroutines, memory,
// open files, CPU time and start time (the last three where the platform
// tells them), and build_info with the version.
func RegisterProcess(r *Registry, prefix, version string) {
	start := time.Now()
	r.NewGauge(prefix+"_build_info", "Always 1; the server's version as a label.", []string{"version", "go_version"}, func(emit func(float64, ...string)) {
		emit(1, version, runtime.Version())
	})
	r.NewGauge("go_goroutines", "Goroutines of the server process.", nil, func(emit func(float64, ...string)) {
		emit(float64(runtime.NumGoroutine()))
	})
	r.NewGauge("process_start_time_seconds", "When the server process started, in seconds since the epoch.", nil, func(emit func(float64, ...string)) {
		emit(float64(start.UnixNano()) / 1e9)
	})
	r.NewGauge("process_resident_memory_bytes", "Resident memory of the server process (its sandboxes are processes of their own).", nil, func(emit func(float64, ...string)) {
		if st, ok := readProc(); ok {
			emit(float64(st.rssBytes))
		}
	})
	r.NewGauge("process_open_fds", "Open file descriptors of the server process.", nil, func(emit func(float64, ...string)) {
		if st, ok := readProc(); ok {
			emit(float64(st.openFDs))
		}
	})
	r.NewCounterFunc("process_cpu_seconds_total", "CPU time of the server process (user and system), in seconds.", nil, func(emit func(float64, ...string)) {
		if st, ok := readProc(); ok {
			emit(st.cpuSeconds)
		}
	})
}

type procStat struct {
	rssBytes   int64
	openFDs    int
	cpuSeconds float64
}
