package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A child started with StartWithParent ends when its parent does, here a
// copy of this test binary that starts `sleep` and exits at once.
func TestStartWithParentEndsTheChildWithTheParent(t *testing.T) {
	if os.Getenv("TESTUTIL_PARENT") == "1" {
		sleep := exec.Command("sleep", "60")
		if err := StartWithParent(sleep); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println(sleep.Process.Pid)
		os.Exit(0)
	}
	parent := exec.Command(os.Args[0], "-test.run=^TestStartWithParentEndsTheChildWithTheParent$")
	parent.Env = append(os.Environ(), "TESTUTIL_PARENT=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	parent.Wait()
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("the parent said %q", line)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The sleep is not our child: once dead, init reaps it and the
		// pid is gone (or a zombie for a moment).
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			return
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("sleep (pid %d) still runs 10 s after its parent ended", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
