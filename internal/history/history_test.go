package history

import (
	"strings"
	"testing"
	"time"
)

func TestNewestFirstAndBounded(t *testing.T) {
	l := New(Limits{EntriesPerSandbox: 3, OutputBytes: 8})
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l.now = func() time.Time { return clock }
	for i, cmd := range []string{"a", "b", "c", "d"} {
		r := l.Begin("p", "sbx_1", Entry{Kind: KindExec, Command: cmd})
		r.Stdout([]byte("out-" + cmd))
		clock = clock.Add(time.Second)
		code := i
		r.End(func(e *Entry) { e.ExitCode = &code })
	}
	got := list(l, "sbx_1")
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
	if len(list(l, "sbx_other")) != 0 {
		t.Error("another sandbox's history is not empty")
	}

	// Output over the limit is cut and flagged; a running entry shows so.
	r := l.Begin("p", "sbx_1", Entry{Kind: KindCode, Code: "print('a very long cell')"})
	r.Stdout([]byte("12345"))
	r.Stdout([]byte("67890"))
	e := list(l, "sbx_1")[0]
	if !e.Running || e.Stdout != "12345678" || !e.OutputTruncated || e.Code != "print('a" {
		t.Errorf("running entry = %+v", e)
	}
	r.End(func(e *Entry) { e.Error = &CodeError{Name: "ValueError", Traceback: strings.Repeat("x", 100)} })
	r.End(func(e *Entry) { e.Failure = "twice" }) // a second End changes nothing
	e = list(l, "sbx_1")[0]
	if e.Running || e.Failure != "" || len(e.Error.Traceback) != 8 {
		t.Errorf("ended entry = %+v", e)
	}
	// Callers get copies.
	e.Error.Name = "changed"
	if list(l, "sbx_1")[0].Error.Name != "ValueError" {
		t.Error("List handed out the log's own entry")
	}
}

func TestLeastRecentlyUsedSandboxForgotten(t *testing.T) {
	l := New(Limits{Sandboxes: 2})
	l.Begin("p", "a", Entry{Kind: KindExec}).End(nil)
	l.Begin("p", "b", Entry{Kind: KindExec}).End(nil)
	l.Begin("p", "a", Entry{Kind: KindExec}).End(nil) // a is now newer than b
	l.Begin("p", "c", Entry{Kind: KindExec}).End(nil)
	if len(list(l, "b")) != 0 || len(list(l, "a")) != 2 || len(list(l, "c")) != 1 {
		t.Errorf("after eviction a=%d b=%d c=%d entries, want 2 0 1", len(list(l, "a")), len(list(l, "b")), len(list(l, "c")))
	}
}

func TestTerminalTranscriptIsPlainText(t *testing.T) {
	l := New(Limits{})
	r := l.Begin("p", "s", Entry{Kind: KindTerminal})
	r.Stdout([]byte("\x1b[?2004huser@sbx:~$ echo $((6*7))\r\n\x1b[?2004l\r42\r\n\x1b]0;title\x07\x1b[01;32mok\x1b[0m\r\n"))
	got := list(l, "s")[0].Stdout
	want := "user@sbx:~$ echo $((6*7))\n42\nok\n"
	if got != want {
		t.Errorf("transcript = %q, want %q", got, want)
	}
}

func TestLineage(t *testing.T) {
	l := NewLineage(2)
	if got := l.List("p"); got == nil || len(got) != 0 {
		t.Errorf("empty lineage = %v, want []", got)
	}
	l.Add("p", Origin{SandboxID: "s1", Kind: "snapshot", From: "snap_1"})
	l.Add("p", Origin{SandboxID: "s2", Kind: "fork", From: "s1"})
	l.Add("p", Origin{SandboxID: "s3", Kind: "fork", From: "s1"})
	l.Add("q", Origin{SandboxID: "x", Kind: "fork", From: "y"})
	got := l.List("p")
	if len(got) != 2 || got[0].SandboxID != "s2" || got[1].SandboxID != "s3" {
		t.Errorf("lineage of p = %+v, want the newest two", got)
	}
	if len(l.List("q")) != 1 {
		t.Error("projects share a lineage")
	}
}

func list(l *Log, id string) []Entry {
	out, _ := l.List("p", id)
	return out
}

func TestTotalBytesBudget(t *testing.T) {
	l := New(Limits{TotalBytes: 100, OutputBytes: 1000})
	for _, id := range []string{"a", "b", "c"} {
		r := l.Begin("p", id, Entry{Kind: KindExec, Command: "x"})
		r.Stdout([]byte(strings.Repeat("o", 40)))
		r.End(nil)
	}
	// 3 × 41 bytes is over 100: the least recently written sandbox went.
	if len(list(l, "a")) != 0 || len(list(l, "b")) != 1 || len(list(l, "c")) != 1 {
		t.Errorf("a=%d b=%d c=%d entries, want 0 1 1", len(list(l, "a")), len(list(l, "b")), len(list(l, "c")))
	}
	if l.total != 82 {
		t.Errorf("total %d bytes, want 82", l.total)
	}
	// One sandbox alone over budget keeps its newest entry.
	for range 3 {
		r := l.Begin("p", "c", Entry{Kind: KindExec, Command: "y"})
		r.Stdout([]byte(strings.Repeat("o", 60)))
		r.End(nil)
	}
	if got := list(l, "c"); len(got) != 1 || got[0].Command != "y" || len(list(l, "b")) != 0 {
		t.Errorf("c = %+v, b = %d entries; want c's newest entry alone", got, len(list(l, "b")))
	}
	if l.total != 61 {
		t.Errorf("total %d bytes, want 61", l.total)
	}
}
