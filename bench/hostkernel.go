package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

// hostKernel drives bench/hostkernel.py: an ipykernel on the host, no
// sandbox, the baseline of run_code.
type hostKernel struct {
	cmd       *exec.Cmd
	in        io.WriteCloser
	lines     chan string
	stderr    *logBuffer
	kernelPID int
	versions  string // what it runs (versionList), for the report
	done      chan struct{}
}

// kernelPython returns the python of the venv with ipykernel and
// jupyter_client that scripts/test-python-env.sh makes (once) and prints.
func kernelPython() (string, error) {
	cmd := exec.Command("scripts/test-python-env.sh")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/test-python-env.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func startHostKernel(ctx context.Context, python string) (_ *hostKernel, err error) {
	h := &hostKernel{lines: make(chan string, 16), stderr: &logBuffer{}, done: make(chan struct{})}
	h.cmd = exec.Command(python, "bench/hostkernel.py")
	h.cmd.Stderr = h.stderr
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
	}()
	go func() { h.cmd.Wait(); close(h.done) }()
	defer func() {
		if err != nil {
			h.close()
		}
	}()
	line, err := h.read(ctx, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	var hello struct {
		Ready     bool              `json:"ready"`
		KernelPID int               `json:"kernel_pid"`
		Versions  map[string]string `json:"versions"`
	}
	if json.Unmarshal([]byte(line), &hello) != nil || !hello.Ready {
		return nil, fmt.Errorf("host kernel: unexpected first line %q", line)
	}
	h.kernelPID = hello.KernelPID
	h.versions = versionList(hello.Versions)
	return h, nil
}

// versionList renders the host kernel's versions as "python 3.11.2,
// ipykernel 6.29.5, …", sorted by name; "" when there are none.
func versionList(v map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(v)) {
		parts = append(parts, k+" "+v[k])
	}
	return strings.Join(parts, ", ")
}

func (h *hostKernel) read(ctx context.Context, limit time.Duration) (string, error) {
	select {
	case l, ok := <-h.lines:
		if !ok {
			return "", fmt.Errorf("host kernel helper exited:\n%s", h.stderr.tail(20))
		}
		return l, nil
	case <-time.After(limit):
		return "", fmt.Errorf("host kernel: no answer within %s:\n%s", limit, h.stderr.tail(20))
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// run executes code in the host kernel and returns the round trip that
// jupyter_client measured (execute request until the kernel is idle again)
// and the main result's text.
func (h *hostKernel) run(ctx context.Context, code string) (float64, string, error) {
	b, _ := json.Marshal(code)
	if _, err := fmt.Fprintf(h.in, "%s\n", b); err != nil {
		return 0, "", err
	}
	line, err := h.read(ctx, time.Minute)
	if err != nil {
		return 0, "", err
	}
	var r struct {
		MS     float64 `json:"ms"`
		Text   string  `json:"text"`
		Status string  `json:"status"`
	}
	if err := json.Unmarshal([]byte(line), &r); err != nil {
		return 0, "", fmt.Errorf("host kernel: bad answer %q", line)
	}
	if r.Status != "ok" {
		return 0, "", fmt.Errorf("host kernel: status %s", r.Status)
	}
	return r.MS, r.Text, nil
}

// close asks the helper to shut its kernel down, and kills both if they
// do not go within 10 s.
func (h *hostKernel) close() {
	fmt.Fprintln(h.in, "quit")
	h.in.Close()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
		<-h.done
	}
	// The kernel runs in a session of its own; make sure it is gone.
	if h.kernelPID > 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", h.kernelPID)); err == nil && strings.Contains(string(b), "ipykernel") {
			syscall.Kill(h.kernelPID, syscall.SIGKILL)
		}
	}
}
