// Command bench measures PandaStack on this machine: it starts its own
// `pandastack serve` on a free loopback port, runs each measurement several
// times (comparisons alternate side by side, so a noisy machine affects both
// sides alike), prints a table and writes bench/results/<date>-<host>.json.
//
//	sudo go run ./bench [-n 20] [-quick]
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/paths"
)

// Stat is a summary of repeated measurements.
type Stat struct {
	Name   string  `json:"name"`
	Unit   string  `json:"unit"`
	N      int     `json:"n"`
	Median float64 `json:"median"`
	P95    float64 `json:"p95"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Note   string  `json:"note,omitempty"`
}

func summarize(name, unit string, xs []float64, note string) Stat {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	q := func(p float64) float64 {
		if len(s) == 0 {
			return 0
		}
		i := int(p*float64(len(s)-1) + 0.5)
		return s[i]
	}
	return Stat{Name: name, Unit: unit, N: len(s), Median: q(0.5), P95: q(0.95), Min: s[0], Max: s[len(s)-1], Note: note}
}

// Report is the JSON the benchmark writes.
type Report struct {
	Date    time.Time         `json:"date"`
	Machine map[string]string `json:"machine"`
	Results []Stat            `json:"results"`
}

func main() {
	n := flag.Int("n", 20, "repetitions per measurement")
	quick := flag.Bool("quick", false, "few repetitions, for a smoke run")
	out := flag.String("out", "bench/results", "directory for the JSON report")
	flag.Parse()
	if *quick {
		*n = 3
	}
	if err := run(*n, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(n int, outDir string) error {
	binDir, err := os.MkdirTemp("", "pandastack-bench-bin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	build := exec.Command("go", "build", "-o", binDir, "./cmd/pandastack", "./cmd/pandastack-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	dataDir, err := os.MkdirTemp("", "pandastack-bench-data-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	srv, err := startServer(binDir, dataDir)
	if err != nil {
		return err
	}
	defer srv.stop()
	c := client.New(srv.url, srv.key)
	ctx := context.Background()
	runsc := paths.FindRunsc(os.Getenv("PANDASTACK_RUNSC"), paths.CacheDir())
	rep := Report{Date: time.Now().UTC(), Machine: machine(runsc)}
	add := func(s Stat) {
		rep.Results = append(rep.Results, s)
		fmt.Fprintf(os.Stderr, "  %-48s median %9.2f %-4s p95 %9.2f  (n=%d)\n", s.Name, s.Median, s.Unit, s.P95, s.N)
	}

	fmt.Fprintln(os.Stderr, "cold create of a base sandbox to the first exec result")
	var create []float64
	for i := 0; i < n; i++ {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
		if err != nil {
			return err
		}
		if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			return err
		}
		create = append(create, ms(time.Since(t0)))
		c.KillSandbox(ctx, sb.ID)
	}
	add(summarize("create base → first exec", "ms", create, "cold boot: runsc run + agent hello"))

	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		return err
	}
	defer c.KillSandbox(ctx, sb.ID)
	fmt.Fprintln(os.Stderr, "exec `true`: API round trip vs runsc exec, alternating")
	var viaAPI, viaRunsc []float64
	runscRoot := filepath.Join(dataDir, "runtime", "runsc")
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}}); err != nil {
			return err
		}
		viaAPI = append(viaAPI, ms(time.Since(t0)))
		t0 = time.Now()
		if out, err := exec.Command(runsc, "--root="+runscRoot, "exec", sb.ID, "/bin/true").CombinedOutput(); err != nil {
			return fmt.Errorf("runsc exec: %v: %s", err, out)
		}
		viaRunsc = append(viaRunsc, ms(time.Since(t0)))
	}
	a, b := summarize("exec true via API", "ms", viaAPI, ""), summarize("exec true via runsc exec", "ms", viaRunsc, "baseline")
	add(a)
	add(b)
	ratios := make([]float64, n)
	for i := range ratios {
		ratios[i] = viaAPI[i] / viaRunsc[i]
	}
	add(summarize("exec ratio API / runsc exec (pairwise)", "x", ratios, "below 1 means the API is faster"))
	fmt.Fprintf(os.Stderr, "  API exec is %.1f× faster than runsc exec\n", b.Median/a.Median)

	fmt.Fprintln(os.Stderr, "idle memory per base sandbox (PSS of its host processes)")
	var pss []float64
	for i := 0; i < min(n, 5); i++ {
		s2, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
		if err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
		pss = append(pss, float64(sandboxPSS(runscRoot, s2.ID))/(1<<20))
		c.KillSandbox(ctx, s2.ID)
	}
	add(summarize("idle base sandbox PSS", "MiB", pss, ""))

	fmt.Fprintln(os.Stderr, "2 MB upload and download")
	blob := make([]byte, 2<<20)
	rand.Read(blob)
	var up, down []float64
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := c.WriteFile(ctx, sb.ID, "blob.bin", bytes.NewReader(blob)); err != nil {
			return err
		}
		up = append(up, 2/time.Since(t0).Seconds())
		t0 = time.Now()
		rc, err := c.ReadFile(ctx, sb.ID, "blob.bin")
		if err != nil {
			return err
		}
		io.Copy(io.Discard, rc)
		rc.Close()
		down = append(down, 2/time.Since(t0).Seconds())
	}
	add(summarize("upload 2 MB", "MB/s", up, ""))
	add(summarize("download 2 MB", "MB/s", down, ""))

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	host, _ := os.Hostname()
	path := filepath.Join(outDir, fmt.Sprintf("%s-%s.json", rep.Date.Format("2006-01-02"), host))
	b2, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(path, append(b2, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", path)
	printTable(rep)
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func printTable(rep Report) {
	fmt.Printf("| measurement | median | p95 | n |\n| --- | --- | --- | --- |\n")
	for _, s := range rep.Results {
		fmt.Printf("| %s | %.2f %s | %.2f %s | %d |\n", s.Name, s.Median, s.Unit, s.P95, s.Unit, s.N)
	}
}

// sandboxPSS sums the PSS of the host processes of a sandbox.
func sandboxPSS(runscRoot, id string) int64 {
	var total int64
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cl, []byte("--root="+runscRoot)) || !bytes.Contains(cl, []byte(id)) {
			continue
		}
		sm, _ := os.ReadFile("/proc/" + e.Name() + "/smaps_rollup")
		for _, l := range strings.Split(string(sm), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				total += kb << 10
			}
		}
	}
	return total
}

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

type server struct {
	cmd      *exec.Cmd
	url, key string
}

func startServer(binDir, dataDir string) (*server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(filepath.Join(binDir, "pandastack"), "serve", "--listen", addr, "--data-dir", dataDir)
	var logBuf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, url: "http://" + addr}
	deadline := time.Now().Add(15 * time.Minute)
	for {
		if resp, err := http.Get(s.url + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) || cmd.Process.Signal(syscall.Signal(0)) != nil {
			s.stop()
			return nil, fmt.Errorf("server did not start:\n%s", logBuf.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "api-key"))
	if err != nil {
		return nil, err
	}
	s.key = strings.TrimSpace(string(b))
	return s, nil
}

func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.cmd.Wait()
}
