// Package history records what was run in each sandbox through the API
// (commands, code cells, terminal sessions) with their outputs, so an
// operator can see what an agent did, and where sandboxes came from
// (snapshots and forks). Both are kept in the Store (pandastack.HistoryStore),
// so they outlive the sandbox and a restart of serve; an entry still running
// is also held here, where its output grows until it ends. The log is
// bounded: entries per sandbox, bytes per output, bytes in all. Only
// internal/api imports it.
package history

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack"
)

// Kinds of entries.
const (
	KindExec     = "exec"
	KindCode     = "code"
	KindTerminal = "terminal"
)

type (
	// Entry is one thing run in a sandbox.
	Entry = pandastack.HistoryEntry
	// CodeError is a cell's exception.
	CodeError = pandastack.HistoryError
	// Origin says where a sandbox came from.
	Origin = pandastack.Origin
)

// Interrupted is the Failure of an entry that was running when serve stopped.
const Interrupted = "interrupted: the server stopped before this finished"

// Unfinished is the Failure of an entry recorded running, on another node
// or in a run of this one it cannot tell, of a sandbox that has stopped
// since (killed, expired, or its node lost).
const Unfinished = "interrupted: the sandbox stopped before this finished"

// Where says, for ListAt, where the sandbox is: what tells an entry still
// recorded running, and not running in this process, that is cut off
// from one that runs elsewhere.
type Where struct {
	// Stopped: the sandbox has stopped; nothing of it runs any more.
	Stopped bool
	// Elsewhere: it runs, or ran, on another node, whose entries this
	// process does not hold (it answers from the store when that node
	// cannot be reached): one that began before this process did is not
	// for that reason cut off.
	Elsewhere bool
}

// Limits bound the log. Zero fields take the documented defaults.
type Limits struct {
	EntriesPerSandbox int   // 100
	OutputBytes       int   // kept per stream of an entry, and of a cell's source; 64 KiB
	TotalBytes        int64 // stored in all; beyond it the projects holding the most lose their oldest entries (TrimHistory); 256 MiB
	OriginsPerProject int   // 10000
	// TrimEvery is how many finished entries pass between two trims to
	// TotalBytes (a trim reads the projects' totals and the entries it
	// removes); 64.
	TrimEvery int
}

// storeTimeout bounds each write to the store; it does not follow the
// request's context, which a client's hang-up cancels before the entry ends.
const storeTimeout = 10 * time.Second

// Log is the history of every sandbox. It is safe for concurrent use.
type Log struct {
	lim   Limits
	store pandastack.HistoryStore
	log   *slog.Logger
	now   func() time.Time
	born  time.Time // when this process began to log: older running entries were cut short

	mu    sync.Mutex
	live  map[string]*Record // entries running, by id
	ended int                // entries ended since the last trim
}

// New returns the log kept in store. Failures to write it are logged to log,
// never returned: the history must not fail what it records.
func New(lim Limits, store pandastack.HistoryStore, log *slog.Logger) *Log {
	if lim.EntriesPerSandbox <= 0 {
		lim.EntriesPerSandbox = 100
	}
	if lim.OutputBytes <= 0 {
		lim.OutputBytes = 64 << 10
	}
	if lim.TotalBytes <= 0 {
		lim.TotalBytes = 256 << 20
	}
	if lim.OriginsPerProject <= 0 {
		lim.OriginsPerProject = 10000
	}
	if lim.TrimEvery <= 0 {
		lim.TrimEvery = 64
	}
	l := &Log{lim: lim, store: store, log: log, now: time.Now, live: map[string]*Record{}}
	l.born = l.now().Truncate(time.Millisecond)
	return l
}

// Record is an entry being written.
type Record struct {
	l       *Log
	project string
	sandbox string
	e       Entry // guarded by l.mu
	start   time.Time
	begun   chan struct{} // closed once the running entry is stored
	// finished: Finish ran (e holds the outcome); stored: Store ran.
	// Guarded by l.mu.
	finished, stored bool
}

// Begin adds e (running, started now) to the history of the project's
// sandbox. Its ID and StartedAt are set here; long fields are cut to the
// output limit.
func (l *Log) Begin(projectID, sandboxID string, e Entry) *Record {
	start := l.now()
	e.ID = pandastack.NewID("run")
	e.StartedAt = start.UTC().Truncate(time.Millisecond)
	e.Running = true
	e.Code, _ = l.cut(e.Code)
	e.Command, _ = l.cut(e.Command)
	r := &Record{l: l, project: projectID, sandbox: sandboxID, e: e, start: start, begun: make(chan struct{})}
	l.mu.Lock()
	l.live[e.ID] = r
	l.mu.Unlock()
	// Stored while the work runs, not before it: List shows it from live
	// meanwhile, and End waits for it so that the ended entry lands last.
	go func() {
		defer close(r.begun)
		l.put(r.project, r.sandbox, e)
	}()
	return r
}

// put writes e to the store, logging a failure.
func (l *Log) put(projectID, sandboxID string, e Entry) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := l.store.PutHistory(ctx, projectID, sandboxID, e, l.lim.EntriesPerSandbox); err != nil {
		l.log.Warn("history: cannot store an entry", "sandbox", sandboxID, "entry", e.ID, "err", err)
	}
}

// cut keeps the first OutputBytes of s, whole characters of valid UTF-8
// without NUL (what every store can hold), and says whether it cut.
func (l *Log) cut(s string) (string, bool) {
	if !pandastack.StorableText(s) {
		s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	if len(s) <= l.lim.OutputBytes {
		return s, false
	}
	n := l.lim.OutputBytes
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

// cutKinds returns a copy of a cell's list of output kinds, of at most
// OutputBytes as JSON, as each output is: past that, its first kinds and
// an item saying how many more of each kind there were ("… 9000 more:
// text 8990, png 10"). It says whether it cut.
func (l *Log) cutKinds(kinds []string) ([]string, bool) {
	jsonSize := func(k string) int { return len(k) + 3 } // quoted, and a comma
	size := 2                                            // [ ]
	for _, k := range kinds {
		size += jsonSize(k)
	}
	if size <= l.lim.OutputBytes {
		return slices.Clone(kinds), false
	}
	// The kinds are a few short names, so the note of the rest is short:
	// room for it is kept.
	budget := max(l.lim.OutputBytes-256, l.lim.OutputBytes/2)
	size, n := 2, 0
	for n < len(kinds) && size+jsonSize(kinds[n]) <= budget {
		size += jsonSize(kinds[n])
		n++
	}
	out := slices.Clone(kinds[:n])
	counts := map[string]int{}
	var order []string
	for _, k := range kinds[n:] {
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	slices.SortStableFunc(order, func(a, b string) int { return counts[b] - counts[a] })
	rest := make([]string, len(order))
	for i, k := range order {
		rest[i] = fmt.Sprintf("%s %d", k, counts[k])
	}
	note, _ := l.cut(fmt.Sprintf("… %d more: %s", len(kinds)-n, strings.Join(rest, ", ")))
	return append(out, note), true
}

// Stdout appends to the entry's stdout (the transcript, for a terminal).
func (r *Record) Stdout(p []byte) { r.append(&r.e.Stdout, p) }

// Stderr appends to the entry's stderr.
func (r *Record) Stderr(p []byte) { r.append(&r.e.Stderr, p) }

// append keeps the output while it runs; End cuts it to the limit.
func (r *Record) append(dst *string, p []byte) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	if room := r.l.lim.OutputBytes + utf8.UTFMax - len(*dst); len(p) > room {
		r.e.OutputTruncated = true
		p = p[:max(room, 0)]
	}
	*dst += string(p)
}

// End marks the entry finished, lets set fill in its outcome and stores it.
// A second End does nothing.
func (r *Record) End(set func(e *Entry)) {
	if r.Finish(set) {
		r.Store()
	}
}

// Finish is the first half of End: the entry is finished, with the
// outcome set fills in, for List at once; Store writes it. A caller that
// answers its client in between keeps the store write off the answer's
// path, and List shows the outcome whenever the client asks. It reports
// whether it finished the entry: false if it was finished before.
func (r *Record) Finish(set func(e *Entry)) bool {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if !r.e.Running || r.finished {
		return false
	}
	if set != nil {
		set(&r.e)
	}
	r.e.Running = false
	r.e.DurationMS = l.now().Sub(r.start).Milliseconds()
	for _, f := range []*string{&r.e.Stdout, &r.e.Stderr, &r.e.Text, &r.e.Failure} {
		var cut bool
		if *f, cut = l.cut(*f); cut {
			r.e.OutputTruncated = true
		}
	}
	if r.e.Error != nil {
		ce := *r.e.Error
		ce.Name, _ = l.cut(ce.Name)
		ce.Value, _ = l.cut(ce.Value)
		ce.Traceback, _ = l.cut(ce.Traceback)
		r.e.Error = &ce
	}
	var cut bool
	if r.e.Results, cut = l.cutKinds(r.e.Results); cut {
		r.e.OutputTruncated = true
	}
	r.finished = true
	return true
}

// Store is the second half of End, after Finish: it writes the finished
// entry to the store, after its first write, and then List reads it from
// there. A second Store does nothing.
func (r *Record) Store() {
	l := r.l
	l.mu.Lock()
	if !r.finished || r.stored {
		l.mu.Unlock()
		return
	}
	r.stored = true
	e := r.e
	l.ended++
	trim := l.ended >= l.lim.TrimEvery
	if trim {
		l.ended = 0
	}
	l.mu.Unlock()

	<-r.begun
	l.put(r.project, r.sandbox, e)
	l.mu.Lock()
	delete(l.live, e.ID)
	l.mu.Unlock()
	if trim {
		l.Trim()
	}
}

// Trim forgets the oldest entries beyond TotalBytes. End calls it now and then.
func (l *Log) Trim() {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if n, err := l.store.TrimHistory(ctx, l.lim.TotalBytes); err != nil {
		l.log.Warn("history: cannot trim", "err", err)
	} else if n > 0 {
		l.log.Debug("history: forgot the oldest entries", "count", n)
	}
}

// List returns the history of the project's sandbox, newest first, and
// whether there is any (it outlives the sandbox). Entries still running
// show their output so far and the time since they began; an entry that
// was running when a previous serve stopped shows as Interrupted (one that
// began since this log was made, elsewhere, is another serve's on the same
// store, and shows as running). ListAt knows more of the sandbox.
func (l *Log) List(ctx context.Context, projectID, sandboxID string) ([]Entry, bool, error) {
	return l.ListAt(ctx, projectID, sandboxID, Where{})
}

// ListAt is List for a sandbox at where: an entry recorded running that
// this process does not run is Interrupted when this node ran it before
// this process began, Unfinished when the sandbox has stopped, and else
// running (another node's, or another serve's on the same store).
func (l *Log) ListAt(ctx context.Context, projectID, sandboxID string, where Where) ([]Entry, bool, error) {
	list, err := l.store.ListHistory(ctx, projectID, sandboxID)
	if err != nil {
		return nil, false, err
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	list = l.withUnstored(list, projectID, sandboxID)
	for i := range list {
		e := &list[i]
		if e.Running {
			if r := l.live[e.ID]; r != nil {
				*e = r.e
				e.Results = slices.Clone(e.Results)
				if !r.finished { // (a finished one, not stored yet, holds its outcome)
					e.Stdout, _ = l.cut(e.Stdout)
					e.Stderr, _ = l.cut(e.Stderr)
					e.DurationMS = now.Sub(e.StartedAt).Milliseconds()
				}
			} else if !where.Elsewhere && e.StartedAt.Before(l.born) {
				e.Running = false
				e.Failure = Interrupted
			} else if where.Stopped {
				e.Running = false
				e.Failure = Unfinished
			} // else another node, or serve on the same store, runs it
		}
		if e.Kind == KindTerminal {
			e.Stdout = PlainText(e.Stdout)
		}
	}
	return list, len(list) > 0, nil
}

// withUnstored adds to list (newest first) the sandbox's running entries
// whose first write has not landed yet. l.mu is held.
func (l *Log) withUnstored(list []Entry, projectID, sandboxID string) []Entry {
	var extra []Entry
	for id, r := range l.live {
		if r.project == projectID && r.sandbox == sandboxID && !slices.ContainsFunc(list, func(e Entry) bool { return e.ID == id }) {
			extra = append(extra, Entry{ID: id, Running: true, StartedAt: r.e.StartedAt})
		}
	}
	list = append(list, extra...)
	// Entries are stored as work begins, but a moment after: order them by
	// when they began.
	slices.SortStableFunc(list, func(a, b Entry) int { return b.StartedAt.Compare(a.StartedAt) })
	return list
}

// AddOrigin records where a new sandbox came from.
func (l *Log) AddOrigin(projectID string, o Origin) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := l.store.AddOrigin(ctx, projectID, o, l.lim.OriginsPerProject); err != nil {
		l.log.Warn("history: cannot store an origin", "sandbox", o.SandboxID, "err", err)
	}
}

// Origins returns the project's origins, oldest first.
func (l *Log) Origins(ctx context.Context, projectID string) ([]Origin, error) {
	return l.store.ListOrigins(ctx, projectID)
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
