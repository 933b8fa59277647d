package history

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/store/sqlite"
)

// newLog returns a log on a real SQLite store in a temp dir, with a clock
// the test moves, and a function that reopens both as a restarted serve.
func newLog(t *testing.T, lim Limits) (l *Log, clock *time.Time, reopen func() *Log) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.db")
	c := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock = &c
	open := func() *Log {
		st, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		l := New(lim, st, slog.New(slog.NewTextHandler(io.Discard, nil)))
		l.now = func() time.Time { return *clock }
		l.born = *clock
		return l
	}
	return open(), clock, open
}

func list(t *testing.T, l *Log, id string) []Entry {
	t.Helper()
	out, _, err := l.List(context.Background(), "p", id)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestNewestFirstAndBounded(t *testing.T) {
	l, clock, _ := newLog(t, Limits{EntriesPerSandbox: 3, OutputBytes: 8})
	for i, cmd := range []string{"a", "b", "c", "d"} {
		r := l.Begin("p", "sbx_1", Entry{Kind: KindExec, Command: cmd})
		r.Stdout([]byte("out-" + cmd))
		*clock = clock.Add(time.Second)
		code := i
		r.End(func(e *Entry) { e.ExitCode = &code })
	}
	got := list(t, l, "sbx_1")
	if len(got) != 3 {
		t.Fatalf("%d entries, want the newest 3", len(got))
	}
	for i, want := range []string{"d", "c", "b"} {
		if got[i].Command != want || got[i].Running || got[i].DurationMS != 1000 || got[i].Stdout != "out-"+want {
			t.Errorf("entry %d = %+v, want command %s, 1000 ms, finished", i, got[i], want)
		}
	}
	if *got[0].ExitCode != 3 {
		t.Errorf("exit code %d, want 3", *got[0].ExitCode)
	}
	if len(list(t, l, "sbx_other")) != 0 {
		t.Error("another sandbox's history is not empty")
	}
	if other, ok, _ := l.List(context.Background(), "q", "sbx_1"); ok || len(other) != 0 {
		t.Errorf("another project sees %d entries", len(other))
	}

	// Output over the limit is cut and flagged; a running entry shows so.
	r := l.Begin("p", "sbx_1", Entry{Kind: KindCode, Code: "print('a very long cell')"})
	r.Stdout([]byte("12345"))
	r.Stdout([]byte("67890"))
	*clock = clock.Add(2 * time.Second)
	e := list(t, l, "sbx_1")[0]
	if !e.Running || e.Stdout != "12345678" || e.Code != "print('a" || e.DurationMS != 2000 {
		t.Errorf("running entry = %+v", e)
	}
	r.End(func(e *Entry) { e.Error = &CodeError{Name: "ValueError", Traceback: strings.Repeat("x", 100)} })
	r.End(func(e *Entry) { e.Failure = "twice" }) // a second End changes nothing
	e = list(t, l, "sbx_1")[0]
	if e.Running || e.Failure != "" || len(e.Error.Traceback) != 8 || e.Stdout != "12345678" || !e.OutputTruncated {
		t.Errorf("ended entry = %+v", e)
	}
	if n := len(list(t, l, "sbx_1")); n != 3 {
		t.Errorf("%d entries after a fifth, want 3", n)
	}
}

func TestOutlivesRestart(t *testing.T) {
	l, clock, reopen := newLog(t, Limits{})
	r := l.Begin("p", "s", Entry{Kind: KindExec, Command: "echo done"})
	r.Stdout([]byte("done\n"))
	r.End(func(e *Entry) { code := 0; e.ExitCode = &code })
	running := l.Begin("p", "s", Entry{Kind: KindExec, Command: "sleep 100"})
	running.Stdout([]byte("partial"))
	<-running.begun // stored beside the work; the work outlasts it
	l.AddOrigin("p", Origin{SandboxID: "s2", Kind: "fork", From: "s", At: *clock})

	*clock = clock.Add(time.Minute)
	l2 := reopen()
	got := list(t, l2, "s")
	if len(got) != 2 || got[1].Command != "echo done" || got[1].Stdout != "done\n" || *got[1].ExitCode != 0 {
		t.Fatalf("after a restart: %+v", got)
	}
	// What ran when serve stopped is no longer running, and says why.
	if got[0].Command != "sleep 100" || got[0].Running || got[0].Failure != Interrupted {
		t.Errorf("the entry cut short = %+v", got[0])
	}
	o, err := l2.Origins(context.Background(), "p")
	if err != nil || len(o) != 1 || o[0].SandboxID != "s2" || o[0].From != "s" || !o[0].At.Equal(clock.Add(-time.Minute)) {
		t.Errorf("origins after a restart = %+v, %v", o, err)
	}
}

func TestUnstorableOutputKept(t *testing.T) {
	l, _, _ := newLog(t, Limits{OutputBytes: 6})
	r := l.Begin("p", "s", Entry{Kind: KindExec, Command: "cat /bin/true"})
	r.Stdout([]byte("a\x00b\xffcé"))
	r.End(nil)
	e := list(t, l, "s")[0]
	// NUL and the invalid byte become U+FFFD (3 bytes each); é is not split.
	if e.Stdout != "a\uFFFDb" || !e.OutputTruncated {
		t.Errorf("stdout = %q (truncated %v)", e.Stdout, e.OutputTruncated)
	}
}

func TestTerminalTranscriptIsPlainText(t *testing.T) {
	l, _, _ := newLog(t, Limits{})
	r := l.Begin("p", "s", Entry{Kind: KindTerminal})
	r.Stdout([]byte("\x1b[?2004huser@sbx:~$ echo $((6*7))\r\n\x1b[?2004l\r42\r\n\x1b]0;title\x07\x1b[01;32mok\x1b[0m\r\n"))
	want := "user@sbx:~$ echo $((6*7))\n42\nok\n"
	if got := list(t, l, "s")[0].Stdout; got != want {
		t.Errorf("running transcript = %q, want %q", got, want)
	}
	r.End(nil)
	if got := list(t, l, "s")[0].Stdout; got != want {
		t.Errorf("transcript = %q, want %q", got, want)
	}
}

func TestOrigins(t *testing.T) {
	l, _, _ := newLog(t, Limits{OriginsPerProject: 2})
	ctx := context.Background()
	if got, err := l.Origins(ctx, "p"); err != nil || got == nil || len(got) != 0 {
		t.Errorf("empty lineage = %v, %v; want []", got, err)
	}
	l.AddOrigin("p", Origin{SandboxID: "s1", Kind: "snapshot", From: "snap_1"})
	l.AddOrigin("p", Origin{SandboxID: "s2", Kind: "fork", From: "s1"})
	l.AddOrigin("p", Origin{SandboxID: "s3", Kind: "fork", From: "s1"})
	l.AddOrigin("q", Origin{SandboxID: "x", Kind: "fork", From: "y"})
	got, _ := l.Origins(ctx, "p")
	if len(got) != 2 || got[0].SandboxID != "s2" || got[1].SandboxID != "s3" {
		t.Errorf("lineage of p = %+v, want the newest two", got)
	}
	if q, _ := l.Origins(ctx, "q"); len(q) != 1 {
		t.Error("projects share a lineage")
	}
}

func TestTotalBytesBudget(t *testing.T) {
	// Each entry is stored as about 220 bytes of JSON; a trim after every
	// second entry keeps the total within 1000.
	l, _, _ := newLog(t, Limits{TotalBytes: 1000, TrimEvery: 2})
	for i := range 10 {
		r := l.Begin("p", string(rune('a'+i%2)), Entry{Kind: KindExec, Command: "x"})
		r.Stdout([]byte(strings.Repeat("o", 40)))
		r.End(nil)
	}
	a, b := len(list(t, l, "a")), len(list(t, l, "b"))
	if a+b >= 10 || a+b < 2 || a == 0 || b == 0 {
		t.Errorf("a=%d b=%d entries after 10 over a budget that holds a few", a, b)
	}
}

func TestConcurrentUse(t *testing.T) {
	l, _, _ := newLog(t, Limits{EntriesPerSandbox: 50})
	l.now = time.Now
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 20 {
			list(t, l, "s")
		}
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				r := l.Begin("p", "s", Entry{Kind: KindExec, Command: fmt.Sprint(g, i)})
				r.Stdout([]byte("out"))
				r.End(nil)
			}
		}()
	}
	wg.Wait()
	<-done
	got := list(t, l, "s")
	if len(got) != 50 {
		t.Errorf("%d entries, want the newest 50 of 80", len(got))
	}
	for _, e := range got {
		if e.Running || e.Stdout != "out" {
			t.Errorf("entry %+v, want ended with its output", e)
		}
	}
}

// TestFinishThenStore: between Finish and Store (while the server answers
// its client) List already shows the outcome; after Store it comes from
// the store, also for a restarted serve.
func TestFinishThenStore(t *testing.T) {
	l, clock, reopen := newLog(t, Limits{})
	r := l.Begin("p", "s", Entry{Kind: KindCode, Code: "1+1"})
	*clock = clock.Add(1500 * time.Millisecond)
	if !r.Finish(func(e *Entry) { e.Text = "2" }) {
		t.Fatal("Finish of a running entry said it did nothing")
	}
	*clock = clock.Add(time.Minute) // the duration is the one Finish saw
	got := list(t, l, "s")
	if len(got) != 1 || got[0].Running || got[0].Text != "2" || got[0].DurationMS != 1500 {
		t.Fatalf("finished, not stored: %+v", got)
	}
	if r.Finish(func(e *Entry) { e.Text = "3" }) {
		t.Fatal("a second Finish changed the entry")
	}
	r.Store()
	r.Store() // a second Store does nothing
	r.End(func(e *Entry) { e.Text = "4" })
	if got := list(t, reopen(), "s"); len(got) != 1 || got[0].Running || got[0].Text != "2" || got[0].DurationMS != 1500 {
		t.Fatalf("stored, seen by a restarted serve: %+v", got)
	}
}

// A cell that displays much (display(i) in a loop of a million) keeps a
// bounded list of its outputs' kinds, as every output is bounded, with an
// item saying how many more there were: the list grew with the results,
// and one entry of megabytes was written twice and read by every history
// page.
func TestResultKindsBounded(t *testing.T) {
	const limit = 1 << 10
	l, _, _ := newLog(t, Limits{OutputBytes: limit})
	kinds := make([]string, 0, 200_010)
	for range 10 {
		kinds = append(kinds, "png")
	}
	for range 200_000 {
		kinds = append(kinds, "text")
	}
	r := l.Begin("p", "sbx_1", Entry{Kind: KindCode, Code: "for i in range(200_000): display(i)"})
	r.End(func(e *Entry) { e.Results = kinds })
	e := list(t, l, "sbx_1")[0]
	b, err := json.Marshal(e.Results)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > limit+256 {
		t.Errorf("the results list is %d bytes of JSON, want about %d", len(b), limit)
	}
	if len(e.Results) < 10 || e.Results[0] != "png" || e.Results[10] != "text" || !e.OutputTruncated {
		t.Errorf("the list does not start as the results did, or is not flagged cut: %d items, truncated %v", len(e.Results), e.OutputTruncated)
	}
	kept := len(e.Results) - 1
	if last := e.Results[kept]; last != fmt.Sprintf("… %d more: text %d", 200_010-kept, 200_010-kept) {
		t.Errorf("last item %q, want how many more there were", last)
	}

	// A short list is kept as it is.
	r = l.Begin("p", "sbx_1", Entry{Kind: KindCode, Code: "plt.show()"})
	r.End(func(e *Entry) { e.Results = []string{"png", "text"} })
	if e := list(t, l, "sbx_1")[0]; strings.Join(e.Results, ",") != "png,text" || e.OutputTruncated {
		t.Errorf("a short list: %q, truncated %v", e.Results, e.OutputTruncated)
	}
}

// An entry recorded running that this process does not run reads by
// where its sandbox is: cut off when this node ran it before this process
// began (Interrupted) or when the sandbox has stopped (Unfinished: killed,
// expired, its node lost); running when another node runs the sandbox,
// whose entries a node that cannot reach it answers from the store.
func TestListAtWhere(t *testing.T) {
	l, clock, reopen := newLog(t, Limits{})
	before := l.Begin("p", "s", Entry{Kind: KindExec, Command: "sleep 100"})
	<-before.begun
	*clock = clock.Add(time.Minute)
	l2 := reopen() // a process begun after it: another node, or this node restarted
	*clock = clock.Add(time.Minute)
	after := l.Begin("p", "s", Entry{Kind: KindExec, Command: "sleep 200"}) // begun since, by another process
	<-after.begun
	for _, c := range []struct {
		name          string
		where         Where
		before, after string // the entries' Failure; "running": still running
	}{
		{"this node's, running", Where{}, Interrupted, "running"},
		{"this node's, stopped", Where{Stopped: true}, Interrupted, Unfinished},
		{"another node's, running", Where{Elsewhere: true}, "running", "running"},
		{"another node's, stopped or lost", Where{Elsewhere: true, Stopped: true}, Unfinished, Unfinished},
	} {
		got, _, err := l2.ListAt(context.Background(), "p", "s", c.where)
		if err != nil || len(got) != 2 {
			t.Fatalf("%s: %+v, %v", c.name, got, err)
		}
		for i, want := range []string{c.after, c.before} { // newest first
			state := got[i].Failure
			if got[i].Running {
				state = "running"
			}
			if state != want {
				t.Errorf("%s: %s reads %q, want %q", c.name, got[i].Command, state, want)
			}
		}
	}
}
