// Package history keeps, in memory, what was run in each sandbox through
// the API (commands, code cells, terminal sessions) with their outputs, so an
// operator can see what an agent did. It is bounded: a number of entries per
// sandbox, a number of bytes per output, a number of sandboxes. It also keeps
// the lineage of sandboxes (which came from which snapshot or fork). Only
// internal/api imports it.
package history

import (
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Kinds of entries.
const (
	KindExec     = "exec"
	KindCode     = "code"
	KindTerminal = "terminal"
)

// Entry is one thing run in a sandbox.
type Entry struct {
	ID              string     `json:"id"`
	Kind            string     `json:"kind"`                 // exec, code or terminal
	Command         string     `json:"command,omitempty"`    // exec: the command line (argv joined by spaces)
	Code            string     `json:"code,omitempty"`       // code: the cell's source
	Language        string     `json:"language,omitempty"`   // code
	ContextID       string     `json:"context_id,omitempty"` // code
	StartedAt       time.Time  `json:"started_at"`
	DurationMS      int64      `json:"duration_ms"`
	Running         bool       `json:"running"`
	Stdout          string     `json:"stdout"` // for a terminal: its transcript, escape sequences removed
	Stderr          string     `json:"stderr"`
	Text            string     `json:"text,omitempty"`      // code: the main result's text
	Results         []string   `json:"results,omitempty"`   // code: the kinds of rich outputs, e.g. "png", "html"
	ExitCode        *int       `json:"exit_code,omitempty"` // exec and terminal
	TimedOut        bool       `json:"timed_out,omitempty"`
	Error           *CodeError `json:"error,omitempty"`   // code: the cell's exception
	Failure         string     `json:"failure,omitempty"` // the request itself failed: why
	OutputTruncated bool       `json:"output_truncated,omitempty"`
}

// CodeError is a cell's exception.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Limits bound the log. Zero fields take the documented defaults.
type Limits struct {
	EntriesPerSandbox int // 100
	OutputBytes       int // kept per stream of an entry, and of a cell's source; 64 KiB
	Sandboxes         int // the least recently used beyond this are forgotten; 1000
	TotalBytes        int // text kept in all; beyond it the least recently used sandboxes go first; 64 MiB
}

// Log is the history of every sandbox. It is safe for concurrent use.
type Log struct {
	lim Limits
	now func() time.Time

	mu    sync.Mutex
	seq   int64
	tick  int64
	total int // bytes of text held
	sbx   map[string]*sandboxLog
}

type sandboxLog struct {
	project string
	entries []*item // oldest first
	used    int64   // tick of the last write, for LRU
	bytes   int
}

// item is an entry and the bytes it is counted for.
type item struct {
	e    Entry
	size int
	gone bool // dropped from the log: no longer counted
}

func (e *Entry) size() int {
	n := len(e.Command) + len(e.Code) + len(e.Stdout) + len(e.Stderr) + len(e.Text) + len(e.Failure)
	if e.Error != nil {
		n += len(e.Error.Name) + len(e.Error.Value) + len(e.Error.Traceback)
	}
	return n
}

// New returns an empty log.
func New(lim Limits) *Log {
	if lim.EntriesPerSandbox <= 0 {
		lim.EntriesPerSandbox = 100
	}
	if lim.OutputBytes <= 0 {
		lim.OutputBytes = 64 << 10
	}
	if lim.Sandboxes <= 0 {
		lim.Sandboxes = 1000
	}
	if lim.TotalBytes <= 0 {
		lim.TotalBytes = 64 << 20
	}
	return &Log{lim: lim, now: time.Now, sbx: map[string]*sandboxLog{}}
}

// Record is an entry being written.
type Record struct {
	l     *Log
	s     *sandboxLog
	it    *item
	e     *Entry
	start time.Time
}

// Begin adds e (running, started now) to the history of the project's
// sandbox. Its ID and StartedAt are set here; long fields are cut to the
// output limit.
func (l *Log) Begin(projectID, sandboxID string, e Entry) *Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq++
	l.tick++
	start := l.now()
	e.ID = "run_" + strconv.FormatInt(l.seq, 10)
	e.StartedAt = start.UTC().Truncate(time.Millisecond)
	e.Running = true
	e.Code, _ = l.cut(e.Code)
	e.Command, _ = l.cut(e.Command)
	s := l.sbx[sandboxID]
	if s == nil || s.project != projectID {
		if s != nil {
			for _, it := range s.entries {
				it.gone = true
			}
			l.total -= s.bytes
		}
		s = &sandboxLog{project: projectID}
		l.sbx[sandboxID] = s
	}
	s.used = l.tick
	it := &item{e: e}
	s.entries = append(s.entries, it)
	l.grow(s, it, e.size())
	for len(s.entries) > l.lim.EntriesPerSandbox {
		l.dropOldest(s)
	}
	l.shrink(s)
	return &Record{l: l, s: s, it: it, e: &it.e, start: start}
}

// grow counts n more bytes for the item. l.mu is held.
func (l *Log) grow(s *sandboxLog, it *item, n int) {
	it.size += n
	s.bytes += n
	l.total += n
}

func (l *Log) dropOldest(s *sandboxLog) {
	s.entries[0].gone = true
	s.bytes -= s.entries[0].size
	l.total -= s.entries[0].size
	s.entries = slices.Delete(s.entries, 0, 1)
}

// shrink forgets the least recently written sandboxes (never keep) while
// there are too many or they hold too much text; if keep alone holds too
// much, its oldest entries go, all but the newest. l.mu is held.
func (l *Log) shrink(keep *sandboxLog) {
	for len(l.sbx) > l.lim.Sandboxes || l.total > l.lim.TotalBytes {
		var oldest string
		var min int64 = -1
		for id, s := range l.sbx {
			if s != keep && (min < 0 || s.used < min) {
				oldest, min = id, s.used
			}
		}
		if oldest == "" {
			if len(keep.entries) <= 1 {
				return
			}
			l.dropOldest(keep)
			continue
		}
		for _, it := range l.sbx[oldest].entries {
			it.gone = true
		}
		l.total -= l.sbx[oldest].bytes
		delete(l.sbx, oldest)
	}
}

func (l *Log) cut(s string) (string, bool) {
	if len(s) <= l.lim.OutputBytes {
		return s, false
	}
	return s[:l.lim.OutputBytes], true
}

// Stdout appends to the entry's stdout (the transcript, for a terminal).
func (r *Record) Stdout(p []byte) { r.append(&r.e.Stdout, p) }

// Stderr appends to the entry's stderr.
func (r *Record) Stderr(p []byte) { r.append(&r.e.Stderr, p) }

func (r *Record) append(dst *string, p []byte) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	room := r.l.lim.OutputBytes - len(*dst)
	if len(p) > room {
		r.e.OutputTruncated = true
		p = p[:max(room, 0)]
	}
	*dst += string(p)
	r.recount()
}

// recount brings the entry's byte count up to date and keeps the log
// within its budget. r.l.mu is held.
func (r *Record) recount() {
	if r.it.gone {
		return
	}
	r.l.grow(r.s, r.it, r.e.size()-r.it.size)
	r.l.shrink(r.s)
}

// End marks the entry finished and lets set fill in its outcome.
func (r *Record) End(set func(e *Entry)) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if !r.e.Running {
		return
	}
	if set != nil {
		set(r.e)
	}
	r.e.Running = false
	r.e.DurationMS = r.l.now().Sub(r.start).Milliseconds()
	for _, f := range []*string{&r.e.Stdout, &r.e.Stderr, &r.e.Text} {
		var cut bool
		if *f, cut = r.l.cut(*f); cut {
			r.e.OutputTruncated = true
		}
	}
	if r.e.Error != nil {
		r.e.Error.Traceback, _ = r.l.cut(r.e.Error.Traceback)
	}
	r.recount()
}

// List returns the history of the project's sandbox, newest first, and
// whether there is any (it outlives the sandbox until evicted). Entries
// still running show their output so far and the time since they began.
func (l *Log) List(projectID, sandboxID string) ([]Entry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sbx[sandboxID]
	out := make([]Entry, 0, 8)
	if s == nil || s.project != projectID {
		return out, false
	}
	now := l.now()
	for i := len(s.entries) - 1; i >= 0; i-- {
		e := s.entries[i].e
		e.Results = slices.Clone(e.Results)
		if e.Error != nil {
			ce := *e.Error
			e.Error = &ce
		}
		if e.Running {
			e.DurationMS = now.Sub(e.StartedAt).Milliseconds()
		}
		if e.Kind == KindTerminal {
			e.Stdout = PlainText(e.Stdout)
		}
		out = append(out, e)
	}
	return out, true
}

// escapes matches terminal control sequences: CSI (ESC [ … final), OSC
// (ESC ] … BEL or ESC \), other two-byte escapes, and lone control bytes
// other than newline and tab.
var escapes = regexp.MustCompile(`\x1b\[[0-9;?<=>!]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|\x1b[@-_]|[\x00-\x08\x0b-\x1f\x7f]`)

var crlf = regexp.MustCompile(`\r+\n`)

// PlainText turns a terminal transcript into plain text: control
// sequences removed, CRLF made LF, a bare CR (a line redrawn) dropped.
func PlainText(s string) string {
	s = crlf.ReplaceAllString(s, "\n")
	return escapes.ReplaceAllString(s, "")
}
