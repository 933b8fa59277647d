package template

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// heartbeatEvery is how often a long step reports that it is still running.
const heartbeatEvery = 5 * time.Second

// progress prints build steps as "[3/6] title … done in 12.4s (rootfs 182 MB)".
// A step's line stays open so a quick step takes one line; once a heartbeat
// has interrupted it, the ending is printed as a full line of its own.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	total int
	n     int
	title string
	open  bool // the current step's line has no newline yet
	beats bool // a heartbeat was printed during the current step
}

func newProgress(w io.Writer) *progress {
	if w == nil {
		w = io.Discard
	}
	return &progress{w: w}
}

// line prints a line outside any step.
func (p *progress) line(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLine()
	fmt.Fprintf(p.w, format+"\n", args...)
}

func (p *progress) closeLine() {
	if p.open {
		fmt.Fprintln(p.w)
		p.open = false
	}
}

func (p *progress) begin(title string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLine()
	p.n++
	p.title = title
	p.beats = false
	fmt.Fprintf(p.w, "[%d/%d] %s …", p.n, p.total, title)
	p.open = true
}

func (p *progress) heartbeat(elapsed time.Duration, detail string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLine()
	p.beats = true
	fmt.Fprintf(p.w, "      … still running after %s%s\n", fmtDuration(elapsed), detail)
}

// end finishes the current step with outcome, e.g. "done in 1.2s (rootfs 10 MB)".
func (p *progress) end(outcome string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.open && !p.beats {
		fmt.Fprintf(p.w, " %s\n", outcome)
	} else {
		p.closeLine()
		fmt.Fprintf(p.w, "[%d/%d] %s … %s\n", p.n, p.total, p.title, outcome)
	}
	p.open = false
}

func fmtDuration(d time.Duration) string {
	return fmt.Sprintf("%.1fs", d.Seconds())
}

func fmtSize(n int64) string {
	return fmt.Sprintf("%d MB", (n+500_000)/1_000_000)
}

// shorten returns s's first line, cut to n runes and marked "..." if cut.
func shorten(s string, n int) string {
	s = strings.TrimSpace(s)
	cut := false
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s, cut = s[:i], true
	}
	if r := []rune(s); len(r) > n {
		s, cut = string(r[:n]), true
	}
	if cut {
		s += "..."
	}
	return s
}

// tailBuffer keeps the last max bytes written to it: a command's output,
// of which only the end goes into an error.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

// lastLines returns the final n lines.
func (t *tailBuffer) lastLines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := bytes.Split(bytes.TrimRight(t.buf, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
