package gvisor

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// A small subset of the OCI runtime spec: only what we set.
type ociSpec struct {
	Version  string     `json:"ociVersion"`
	Process  ociProcess `json:"process"`
	Root     ociRoot    `json:"root"`
	Hostname string     `json:"hostname"`
	Mounts   []ociMount `json:"mounts"`
	Linux    ociLinux   `json:"linux"`
}

type ociProcess struct {
	User            ociUser  `json:"user"`
	Args            []string `json:"args"`
	Env             []string `json:"env"`
	Cwd             string   `json:"cwd"`
	Capabilities    ociCaps  `json:"capabilities"`
	NoNewPrivileges bool     `json:"noNewPrivileges"`
	Rlimits         []ociRl  `json:"rlimits"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

type ociCaps struct {
	Bounding  []string `json:"bounding"`
	Effective []string `json:"effective"`
	Permitted []string `json:"permitted"`
}

type ociRl struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Namespaces  []ociNS       `json:"namespaces"`
	Resources   *ociResources `json:"resources,omitempty"`
	CgroupsPath string        `json:"cgroupsPath,omitempty"`
}

type ociNS struct {
	Type string `json:"type"`
	Path string `json:"path,omitempty"` // join this namespace instead of making one
}

type ociResources struct {
	Memory *struct {
		Limit int64 `json:"limit"`
	} `json:"memory,omitempty"`
	CPU *struct {
		Quota  int64  `json:"quota"`
		Period uint64 `json:"period"`
	} `json:"cpu,omitempty"`
	Pids *struct {
		Limit int64 `json:"limit"`
	} `json:"pids,omitempty"`
}

// The agent is root inside the sandbox (gVisor's root, not the host's) so it
// can drop to the sandbox user for user commands.
var agentCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
	"CAP_AUDIT_WRITE", "CAP_MKNOD",
	// Its hello sets the sandbox's hostname with it
	// (agentproto.FeatureHostname): a restore names a sandbox after the
	// container it is restored into, and a resume may take one created
	// under another id. The agent takes it out of its bounding set and its
	// effective set as it starts (agent.KeepAdminToItself), so no process
	// it starts, root's included, has it, and raises it only on the thread
	// that sets the name. Last: images taken before it restore with the set
	// without it (caps.go).
	"CAP_SYS_ADMIN",
}

// cpuPeriodMicros is the CFS period of a sandbox's CPU quota: cpu × the
// period of CPU time per period. The longest period Linux allows, so that
// a short burst over the quota runs at full speed: a restore (the sentry
// loads its state and its memory on several threads at once) was
// throttled by 160-220 ms of its ~500 ms with 100 ms periods. Work that
// goes on for seconds gets its quota all the same, in coarser steps.
const cpuPeriodMicros = 1_000_000

func cgroupPath(id string) string { return "/pandastack/" + id }

// shmOptions are the mount options of /dev/shm, sized sizeMB (0: no size
// of its own): half the sandbox's memory, so filling it is ENOSPC to the
// writer, as a full disk is, rather than the whole sandbox stopped out of
// memory.
func shmOptions(sizeMB int) []string {
	o := []string{"nosuid", "noexec", "nodev", "mode=1777"}
	if sizeMB > 0 {
		o = append(o, "size="+strconv.Itoa(sizeMB)+"m")
	}
	return o
}

// ociSpec is the bundle's spec, of spec revision rev (caps.go). With a disk of its own the sandbox keeps
// /tmp on that disk (runsc would still mount a tmpfs over an empty /tmp:
// templates leave a file there); without, /tmp is a tmpfs in memory, as
// images taken that way expect (a restore needs the checkpoint's mounts).
func (r *Runtime) ociSpec(s pandastack.RuntimeSpec, ownDisk bool, rev int, agent string) ociSpec {
	if agent == "" {
		agent = r.cfg.AgentPath
	}
	caps := capsOf(rev)
	shmMB := 0
	if shmSized(rev) {
		shmMB = s.MemoryMB / 2
	}
	env := append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, s.Env...)
	spec := ociSpec{
		Version: "1.0.2",
		Process: ociProcess{
			Args:            []string{agentproto.AgentPath},
			Env:             env,
			Cwd:             "/",
			Capabilities:    ociCaps{Bounding: caps, Effective: caps, Permitted: caps},
			NoNewPrivileges: true,
			Rlimits:         []ociRl{{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536}},
		},
		Root:     ociRoot{Path: s.RootFS},
		Hostname: agentproto.Hostname(s.ID),
		Mounts: []ociMount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: shmOptions(shmMB)},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: agentproto.AgentPath, Type: "bind", Source: agent, Options: []string{"bind", "ro"}},
		},
		Linux: ociLinux{
			Namespaces: []ociNS{{Type: "pid"}, {Type: "network", Path: s.NetNS}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
		},
	}
	if !ownDisk {
		spec.Mounts = append(spec.Mounts, ociMount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777"}})
	}
	// Always our path: without one runsc makes /<id> in every hierarchy,
	// which removeCgroups would not find.
	spec.Linux.CgroupsPath = cgroupPath(s.ID)
	if s.MemoryMB > 0 || s.CPU > 0 || s.PIDs > 0 {
		res := &ociResources{}
		if s.MemoryMB > 0 {
			res.Memory = &struct {
				Limit int64 `json:"limit"`
			}{int64(s.MemoryMB) << 20}
		}
		if s.CPU > 0 {
			res.CPU = &struct {
				Quota  int64  `json:"quota"`
				Period uint64 `json:"period"`
			}{int64(s.CPU) * cpuPeriodMicros, cpuPeriodMicros}
		}
		if s.PIDs > 0 {
			res.Pids = &struct {
				Limit int64 `json:"limit"`
			}{int64(s.PIDs)}
			// The host's pids limit counts gVisor's own threads too, and
			// systrap gives each task host pids of its own: filling it
			// kills the whole sandbox. RLIMIT_NPROC, which gVisor enforces
			// per user, stops a fork bomb inside first, with EAGAIN in user
			// code. The agent sets it on itself (agentproto.NProcEnv): in
			// the spec's rlimits it would have to match every checkpoint
			// restored, and no image taken before it could be.
			spec.Process.Env = append(spec.Process.Env, agentproto.NProcEnv+"="+strconv.Itoa(nprocLimit(s.PIDs)))
		}
		spec.Linux.Resources = res
	}
	return spec
}

// hostMemoryLimit is the host's memory limit of a sandbox of memMB: its
// memory plus headroom for what the host charges it beyond what it sees
// (gVisor's own heap, the page tables and stub processes of its tasks, and
// memory freed inside that the sentry gives back to the host later). The
// sandbox sees memMB: runsc takes the limit as the sentry's total memory
// when it starts the sentry, and the limit is raised only after that
// (raiseMemoryLimit). The agent keeps the kernels within memMB by polling;
// the headroom is also the time its polling has. Measured here, a kernel's
// allocation loop was stopped with the sandbox 54 MiB past the agent's
// threshold, and the host counting 945 MiB of a 1024 MiB sandbox.
func hostMemoryLimit(memMB int) int64 {
	b := int64(memMB) << 20
	return b + max(b/8, 64<<20)
}

// raiseMemoryLimit sets the memory limit of the sandbox's cgroup rel to
// hostMemoryLimit(memMB), in the v1 hierarchy or the v2 one.
func raiseMemoryLimit(rel string, memMB int) error {
	limit := []byte(strconv.FormatInt(hostMemoryLimit(memMB), 10))
	for _, f := range []string{
		filepath.Join("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes"),
		filepath.Join("/sys/fs/cgroup", rel, "memory.max"),
	} {
		if _, err := os.Stat(f); err == nil {
			return os.WriteFile(f, limit, 0o644)
		}
	}
	return fmt.Errorf("no memory cgroup %s", rel)
}

// stubOOMScoreRaise is what a sandbox's stub processes, those that run
// its tasks' code (systrap), but the agent's, get added to the sentry's
// oom_score_adj (up to the top, 1000). When the sandbox reaches its host
// limit before the agent's watch acts, the host's OOM killer takes the
// process with the highest score in the sandbox's cgroup, by resident
// memory; gVisor commits a task's memory in its memory file, which no
// process shows as resident, so every stub shows about its code, and the
// sentry (40-90 MiB, more when it copied a task's data through its own
// mapping: 230 MiB for a pipe into tail) was taken, the whole sandbox with
// it (a command filling a code-interpreter sandbox whose host limit was
// lowered to 300 MiB above its use: stopped in 3 runs of 3). 1000 adds the
// whole limit to a score, so the stubs go first whatever the sentry
// holds (500 still lost to the sentry at a 200 MiB limit), and gVisor kills
// the task of the stub taken with SIGKILL; the sandbox lives on. Which task is arbitrary (a stub's
// resident memory says little), but never the agent: its stub keeps the
// sentry's score, so that the sandbox, with every process of its user
// gone, stops rather than lives without its agent. A raise needs no
// privilege; lowering the sentry's score instead would need
// CAP_SYS_RESOURCE, which a server in a container may lack, and without it
// no score can be lowered again: the agent's stub must never be raised.
const stubOOMScoreRaise = 1000

// raiseStubOOMScores raises the scores of the stub processes in the
// sandbox's cgroup rel but the agent's (stubOOMScoreRaise), once the
// agent's stub exists: agent says whether it did, or whether the cgroup is
// gone (nothing to do); raised is how many it raised. Stubs are the
// processes without a command line (the sentry clones them and unmaps all
// but the stub's code); the agent's maps the agent's binary. The stubs the
// sentry makes later are cloned from its first one, which is among them,
// and inherit its score; so the raise must wait for the agent's stub (a
// restore's tasks start as runsc returns, their stubs a moment later),
// which would inherit it too. A stub already raised is left as it is.
func raiseStubOOMScores(rel string) (agent bool, raised int, err error) {
	procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", rel, "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		procs, err = os.ReadFile(filepath.Join("/sys/fs/cgroup", rel, "cgroup.procs"))
	}
	if errors.Is(err, fs.ErrNotExist) {
		return true, 0, nil // the sandbox is gone
	}
	if err != nil {
		return false, 0, err
	}
	sentry := unknownAdj
	var stubs []string
	for _, p := range strings.Fields(string(procs)) {
		cmd, err := os.ReadFile("/proc/" + p + "/cmdline")
		if err != nil {
			continue // gone
		}
		if len(cmd) > 0 {
			if bytes.HasPrefix(cmd, []byte("runsc-sandbox\x00")) {
				sentry = oomScoreAdj(p)
			}
			continue // runsc's sentry or gofer
		}
		maps, err := mapsHead(p)
		if err != nil {
			continue
		}
		if bytes.Contains(maps, []byte(agentproto.AgentPath+"\n")) {
			agent = true // the agent's, or a thread of its address space
			continue
		}
		stubs = append(stubs, p)
	}
	if !agent || sentry == unknownAdj {
		return false, 0, nil
	}
	want := min(sentry+stubOOMScoreRaise, 1000)
	adj := []byte(strconv.Itoa(want))
	var errs []error
	for _, p := range stubs {
		if oomScoreAdj(p) >= want {
			continue
		}
		if err := os.WriteFile("/proc/"+p+"/oom_score_adj", adj, 0); err == nil {
			raised++
		} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, err)
		}
	}
	return true, raised, errors.Join(errs...)
}

// mapsHead is the start of process p's /proc/p/maps: one read of 4 KiB,
// which the kernel fills with the lowest mappings alone (a kernel's stub
// has some 130 mappings, which a look every few ms while a sandbox starts
// would read whole). A task's program is mapped at the bottom of its
// address space: the agent's (a static Go binary) first of all.
func mapsHead(p string) ([]byte, error) {
	f, err := os.Open("/proc/" + p + "/maps")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 4096)
	n, err := f.Read(b)
	if n == 0 {
		return nil, err
	}
	return b[:n], nil
}

// unknownAdj is oomScoreAdj's answer when it cannot tell (the range is
// -1000 to 1000).
const unknownAdj = -1001

// oomScoreAdj is process p's oom_score_adj, or unknownAdj.
func oomScoreAdj(p string) int {
	b, err := os.ReadFile("/proc/" + p + "/oom_score_adj")
	if err != nil {
		return unknownAdj
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return unknownAdj
	}
	return n
}

// cgroupRemoveWait bounds removeCgroups' wait for the processes of a
// sandbox just killed to leave its cgroups: a sentry tearing down a large
// address space can take hundreds of ms to exit.
const cgroupRemoveWait = 5 * time.Second

// removeCgroups removes the sandbox's cgroup directories in every mounted
// hierarchy (v1 controllers and the v2 unified mount). runsc usually removes
// them itself; this catches a sandbox that died uncleanly, or whose runsc
// was killed half-way. A cgroup still holding a process that is exiting
// (EBUSY) is tried again until cgroupRemoveWait has passed; the error
// names what is left.
func removeCgroups(rel string) error {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	deadline := time.Now().Add(cgroupRemoveWait)
	for {
		var busy []string
		for _, root := range roots {
			// cgroup dirs are removed with rmdir, never recursively.
			if err := syscall.Rmdir(filepath.Join(root, rel)); errors.Is(err, syscall.EBUSY) {
				busy = append(busy, root)
			}
		}
		if len(busy) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still in use after %v in %s", rel, cgroupRemoveWait, strings.Join(busy, ", "))
		}
		roots = busy
		time.Sleep(20 * time.Millisecond)
	}
}

// nprocLimit is RLIMIT_NPROC for a sandbox whose host pids limit is pids.
// Measured here (systrap): an idle code-interpreter sandbox holds 52 host
// pids, and each process inside adds 2 (its stub process and thread), more
// while tasks come and go: a shell fork bomb (f(){ f|f& }; f) held at most
// 918-983 host pids with 384 tasks allowed, and filled 1024 and killed the
// sandbox in 1 run of 3 (6 of 10 in another test); with 256 it held
// 597-654. So a quarter of the limit: 384 of the default 1536 (every task
// counts, threads too).
func nprocLimit(pids int) int { return max(pids/4, 16) }

// pidsExhausted reports whether the sandbox's pids cgroup refused a fork
// (cgroup v1 or v2 pids.events "max N" with N > 0).
func pidsExhausted(rel string) bool {
	return cgroupEvent("max", filepath.Join("/sys/fs/cgroup/pids", rel, "pids.events"), filepath.Join("/sys/fs/cgroup", rel, "pids.events"))
}

// cgroupEvent reports whether the first of the files (of "key count"
// lines) that can be read and names key counts it at least once.
func cgroupEvent(key string, files ...string) bool {
	return cgroupCount(key, files...) > 0
}

// cgroupCount is the count key has in the first of files that can be read
// and names it ("key N" lines: memory.events, memory.oom_control), or -1.
func cgroupCount(key string, files ...string) int64 {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok && k == key {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// oomKills is how many processes the kernel's OOM killer killed in the
// sandbox's memory cgroup (v1 memory.oom_control, v2 memory.events), or
// -1.
func oomKills(rel string) int64 {
	return cgroupCount("oom_kill", filepath.Join("/sys/fs/cgroup/memory", rel, "memory.oom_control"), filepath.Join("/sys/fs/cgroup", rel, "memory.events"))
}

// memoryBytes reads the memory charged to the sandbox's cgroup less the
// file cache not in active use, the working set (cgroup v1
// memory.usage_in_bytes less memory.stat's total_inactive_file, or v2
// memory.current less inactive_file), or -1. It counts what its memory
// limit counts: the sentry's memory file (the sandbox's own memory, shared
// with the stub processes that run its code), gVisor's heap, page tables.
func memoryBytes(rel string) int64 {
	for _, f := range []struct{ usage, stat, inactive string }{
		{filepath.Join("/sys/fs/cgroup/memory", rel, "memory.usage_in_bytes"), filepath.Join("/sys/fs/cgroup/memory", rel, "memory.stat"), "total_inactive_file"},
		{filepath.Join("/sys/fs/cgroup", rel, "memory.current"), filepath.Join("/sys/fs/cgroup", rel, "memory.stat"), "inactive_file"},
	} {
		b, err := os.ReadFile(f.usage)
		if err != nil {
			continue
		}
		usage, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			continue
		}
		var inactive int64
		if b, err := os.ReadFile(f.stat); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(l, " "); ok && k == f.inactive {
					inactive, _ = strconv.ParseInt(v, 10, 64)
				}
			}
		}
		return max(usage-inactive, 0)
	}
	return -1
}

// cpuNanos reads the CPU time used by everything in the sandbox's cgroup
// (cgroup v1 cpuacct.usage, or v2 cpu.stat's usage_usec), or -1.
func cpuNanos(rel string) int64 {
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", rel, "cpuacct.usage")); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return n
		}
	}
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", rel, "cpu.stat")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok && k == "usage_usec" {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					return n * 1000
				}
			}
		}
	}
	return -1
}
