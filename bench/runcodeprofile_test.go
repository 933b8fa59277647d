package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Lines as runsc --strace writes them (taken from a run), with one of
// another process and an entry line, which do not count.
const straceSample = `I1201 10:24:30.560838       1 strace.go:616] [  15:  15] python3 X futex(0xa563d8, FUTEX_WAKE|FUTEX_PRIVATE_FLAG, 0x1, null, 0x0, 0x0) = 1 (0x1) (1.583µs)
I1201 10:24:30.560900       1 strace.go:580] [  15:  15] python3 E getpid()
I1201 10:24:30.560961       1 strace.go:616] [  15:  19] python3 X futex(0xa563d8, FUTEX_WAIT|FUTEX_PRIVATE_FLAG, 0x2, null, 0x0, 0x0) = 0 (0x0) (241.491µs)
I1201 10:24:30.568997       1 strace.go:616] [  15:  25] python3 X futex(0xa563d0, FUTEX_WAIT_BITSET|FUTEX_PRIVATE_FLAG, 0x0, 0x7ec54b7fdb90 {sec=185 nsec=649020676}, 0x0, 0xffffffff) = -1 errno=110 (connection timed out) (5.188668ms)
I1201 10:24:31.128466       1 strace.go:616] [  15:  18] ZMQbg/IO/0 X recvfrom(0x13 socket:[48], 0x7ec55c005718, 0x2000, 0x0, null, null) = 291 (0x123) (22.813µs)
I1201 10:24:46.300705       1 strace.go:607] [   1:   4] agent X write(0x1 host:[2], ..., 0x18) = 24 (0x18) (17.794µs)
I1201 10:24:46.300800       1 strace.go:607] [  30(   2):  31(   3)] sh X getpid() = 2 (0x2) (2µs)
`

func TestCountSyscalls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "boot.txt")
	prefix := "I1201 10:24:00.000000       1 strace.go:616] [  15:  15] python3 X getpid() = 15 (0xf) (1µs)\n"
	if err := os.WriteFile(path, []byte(prefix+straceSample), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := countSyscalls(path, int64(len(prefix)), int64(len(prefix)+len(straceSample)), 15, map[string]string{"15": "MainThread", "19": "IOPub"}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if p.PerRun != 3 { // 6 exits (not the one before from), 2 runs
		t.Fatalf("per run %v, want 3", p.PerRun)
	}
	threads := map[string]float64{}
	for _, c := range p.Threads {
		threads[c.Thread] = c.PerRun
	}
	want := map[string]float64{"kernel: MainThread": 0.5, "kernel: IOPub": 0.5, "kernel: python3 (not Python's)": 0.5, "kernel: ZMQbg/IO/0 (not Python's)": 0.5, "agent": 0.5, "sh": 0.5}
	for k, v := range want {
		if threads[k] != v {
			t.Errorf("thread %q: %v per run, want %v (all: %v)", k, threads[k], v, threads)
		}
	}
	var wait SyscallCount
	for _, c := range p.Calls {
		if c.Thread == "kernel: IOPub" && c.Syscall == "futex" {
			wait = c
		}
	}
	if wait.PerRun != 0.5 || wait.USPerRun < 120 || wait.USPerRun > 121 {
		t.Errorf("IOPub futex: %+v, want 0.5 per run and 120.7 µs", wait)
	}
	if _, err := countSyscalls(path, 0, 10, 15, nil, 1); err == nil || !strings.Contains(err.Error(), "no strace lines") {
		t.Errorf("a window without calls: %v", err)
	}
}

func TestRunBreakdown(t *testing.T) {
	log := `time=2026-12-01T10:00:00Z level=DEBUG msg="code run" sandbox=sbx_a context=ctx_default_python total_us=1500 agent_us=1200 kernel_messages=4
time=2026-12-01T10:00:01Z level=DEBUG msg="code run" sandbox=sbx_b context=ctx_default_python total_us=9000 agent_us=8000
time=2026-12-01T10:00:02Z level=DEBUG msg=request method=POST path=/v1/sandboxes/sbx_a/run_code status=200 ms=2
time=2026-12-01T10:00:03Z level=DEBUG msg="code run" sandbox=sbx_a context=ctx_default_python total_us=2500 agent_us=2000 kernel_messages=4
`
	got := runBreakdown(log, "sbx_a", 2)
	if len(got["total_us"]) != 2 || got["total_us"][0] != 1.5 || got["total_us"][1] != 2.5 || got["agent_us"][1] != 2 {
		t.Fatalf("breakdown %v", got)
	}
	if _, ok := got["kernel_messages"]; ok {
		t.Fatalf("a count read as a time: %v", got)
	}
	if got := runBreakdown(log, "sbx_a", 3); got != nil {
		t.Fatalf("3 runs asked, 2 logged: %v, want nil", got)
	}
}
