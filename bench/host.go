package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/pandastack/pandastack/internal/paths"
)

// sandboxPIDs maps each sandbox under the runsc root to its host processes
// (runsc-sandbox, runsc-gofer, a runsc command in flight), found by their
// command lines, which name the root and end with the container id: the
// sandbox's, or, for a sandbox resumed into a container prepared under
// another id, that one's (byAlias).
func sandboxPIDs(runscRoot string) map[string][]int {
	out := containerPIDs(runscRoot)
	byAlias(out, filepath.Join(filepath.Dir(runscRoot), "sandboxes"))
	return out
}

// byAlias files the processes of a container that a sandbox took over
// under the sandbox's id: the server links sandboxes/<sandbox id> to the
// container's directory.
func byAlias(pids map[string][]int, sandboxesDir string) {
	ents, _ := os.ReadDir(sandboxesDir)
	for _, e := range ents {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		target, err := os.Readlink(filepath.Join(sandboxesDir, e.Name()))
		if err != nil {
			continue
		}
		if p, ok := pids[target]; ok {
			pids[e.Name()] = p
			delete(pids, target)
		}
	}
}

// containerPIDs maps each runsc container under the root to its host
// processes.
func containerPIDs(runscRoot string) map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte("--root="+runscRoot+"\x00")) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if id := args[len(args)-1]; strings.HasPrefix(id, "sbx_") {
			out[id] = append(out[id], pid)
		}
	}
	return out
}

// pss sums the proportional set size of processes, in bytes.
func pss(pids []int) int64 {
	var total int64
	for _, p := range pids {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/smaps_rollup")
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

// sandboxPSS is the host memory of one sandbox: PSS of all its processes.
func sandboxPSS(runscRoot, id string) int64 { return pss(sandboxPIDs(runscRoot)[id]) }

// otherSandboxes counts gVisor sandboxes on the host that are not under
// the given roots: other users' load shares the CPU with the benchmark.
func otherSandboxes(roots ...string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.HasPrefix(b, []byte("runsc-sandbox\x00")) {
			continue
		}
		ours := false
		for _, r := range roots {
			ours = ours || bytes.Contains(b, []byte("--root="+r+"\x00"))
		}
		if !ours {
			n++
		}
	}
	return n
}

func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// cpuTimes are the host's CPU times since boot, from /proc/stat's "cpu"
// line, in clock ticks: steal is the time the hypervisor ran something
// else while this machine's CPUs wanted to run, idle the time they had
// nothing to run (iowait included), total all of it.
type cpuTimes struct{ steal, idle, total uint64 }

// busyMS is the CPU time the host's processes used between a and b, in
// ms (clock ticks are 10 ms).
func busyMS(a, b cpuTimes) float64 {
	used := (b.total - b.idle - b.steal) - (a.total - a.idle - a.steal)
	return float64(used) * 10
}

func readCPUTimes() cpuTimes {
	b, _ := os.ReadFile("/proc/stat")
	return parseCPUTimes(string(b))
}

// parseCPUTimes reads the first line of /proc/stat ("cpu  user nice
// system idle iowait irq softirq steal guest guest_nice"); guest time is
// counted in user already. Anything else gives zero times.
func parseCPUTimes(stat string) cpuTimes {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuTimes{}
	}
	var t cpuTimes
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return cpuTimes{}
		}
		t.total += n
		switch i {
		case 3, 4:
			t.idle += n
		case 7:
			t.steal = n
		}
	}
	return t
}

// stealPercent is the share of the CPU time between a and b that the
// hypervisor took (steal), as text; "" when unknown.
func stealPercent(a, b cpuTimes) string {
	if b.total <= a.total || b.steal < a.steal {
		return ""
	}
	return strconv.FormatFloat(100*float64(b.steal-a.steal)/float64(b.total-a.total), 'f', 1, 64)
}

func memAvailable() string {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "MemAvailable:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "MemAvailable:"))
		}
	}
	return ""
}

// machine describes the host the figures were measured on.
func machine(runsc string) map[string]string {
	m := map[string]string{"cores": strconv.Itoa(runtime.NumCPU()), "go": runtime.Version()}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m["memory"] = strings.TrimSpace(strings.TrimPrefix(strings.Split(string(b), "\n")[0], "MemTotal:"))
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		m["kernel"] = utsString(u.Release[:])
	}
	m["runsc"] = paths.RunscVersion
	m["runsc_path"] = runsc
	if out, err := exec.Command(runsc, "--version").Output(); err == nil {
		m["runsc_version"] = strings.SplitN(string(out), "\n", 2)[0]
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				m["cpu"] = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	return m
}

func utsString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
