package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

func entry(id, cmd string, minute int) pandastack.HistoryEntry {
	code := 0
	return pandastack.HistoryEntry{ID: id, Kind: "exec", Command: cmd, StartedAt: base.Add(time.Duration(minute) * time.Minute), ExitCode: &code}
}

func mustPutHistory(t *testing.T, s pandastack.Store, project, sandbox string, e pandastack.HistoryEntry, keep int) {
	t.Helper()
	if err := s.PutHistory(t.Context(), project, sandbox, e, keep); err != nil {
		t.Fatalf("PutHistory %s: %v", e.ID, err)
	}
}

func historyIDs(t *testing.T, s pandastack.Store, project, sandbox string) []string {
	t.Helper()
	list, err := s.ListHistory(t.Context(), project, sandbox)
	if err != nil {
		t.Fatalf("ListHistory %s: %v", sandbox, err)
	}
	if list == nil {
		t.Errorf("ListHistory %s = nil, want an empty list", sandbox)
	}
	out := []string{}
	for _, e := range list {
		out = append(out, e.ID)
	}
	return out
}

// Entries come back whole, newest first; a replacement keeps its place;
// keep bounds a sandbox's entries; projects and sandboxes are apart.
func testHistory(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	checkIDs(t, "history of an unknown sandbox", historyIDs(t, s, "prj_1", "sbx_1"))

	full := pandastack.HistoryEntry{
		ID: "run_1", Kind: "code", Code: "1/0", Language: "python", ContextID: "ctx_1",
		StartedAt: base.Add(123456 * time.Microsecond), DurationMS: 42, Stdout: "out\x00\n", Stderr: "é",
		Text: "t", Results: []string{"png", "html"}, TimedOut: true, Failure: "f", OutputTruncated: true,
		Error: &pandastack.HistoryError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "tb"},
	}
	mustPutHistory(t, s, "prj_1", "sbx_1", full, 0)
	got, err := s.ListHistory(ctx, "prj_1", "sbx_1")
	if err != nil || len(got) != 1 {
		t.Fatalf("ListHistory = %+v, %v", got, err)
	}
	want := full
	want.StartedAt = stored(full.StartedAt)
	if g, w := mustJSON(t, got[0]), mustJSON(t, want); g != w || !got[0].StartedAt.Equal(want.StartedAt) {
		t.Errorf("entry read back\n got %s\nwant %s", g, w)
	}

	mustPutHistory(t, s, "prj_1", "sbx_1", entry("run_2", "b", 1), 0)
	mustPutHistory(t, s, "prj_1", "sbx_2", entry("run_3", "c", 2), 0)
	mustPutHistory(t, s, "prj_2", "sbx_3", entry("run_4", "d", 3), 0)
	// run_1 ends: replaced in its place, not moved to the front.
	ended := full
	ended.Running, ended.Stdout = false, "final"
	mustPutHistory(t, s, "prj_1", "sbx_1", ended, 0)
	checkIDs(t, "history of sbx_1", historyIDs(t, s, "prj_1", "sbx_1"), "run_2", "run_1")
	if got, _ := s.ListHistory(ctx, "prj_1", "sbx_1"); got[1].Stdout != "final" || got[1].Running {
		t.Errorf("replaced entry = %+v", got[1])
	}
	checkIDs(t, "sbx_3 seen from another project", historyIDs(t, s, "prj_1", "sbx_3"))
	checkIDs(t, "sbx_3 from its project", historyIDs(t, s, "prj_2", "sbx_3"), "run_4")

	// An id already used by another sandbox is not taken over.
	err = s.PutHistory(ctx, "prj_1", "sbx_2", entry("run_1", "x", 4), 0)
	checkCode(t, "PutHistory of another sandbox's entry id", err, pandastack.EConflict)
	checkIDs(t, "sbx_2 after the refused put", historyIDs(t, s, "prj_1", "sbx_2"), "run_3")

	// keep: the newest entries of that sandbox stay; others are untouched.
	for i := 5; i <= 8; i++ {
		mustPutHistory(t, s, "prj_1", "sbx_1", entry(fmt.Sprintf("run_%d", i), "k", i), 3)
	}
	checkIDs(t, "sbx_1 kept to 3", historyIDs(t, s, "prj_1", "sbx_1"), "run_8", "run_7", "run_6")
	checkIDs(t, "sbx_2 untouched by sbx_1's keep", historyIDs(t, s, "prj_1", "sbx_2"), "run_3")
	// The history of the project's sandbox: a keep in one project leaves
	// the same sandbox id's entries in another alone.
	mustPutHistory(t, s, "prj_1", "sbx_3", entry("run_9", "k", 9), 1)
	mustPutHistory(t, s, "prj_1", "sbx_3", entry("run_10", "k", 10), 1)
	checkIDs(t, "sbx_3 of prj_1 kept to 1", historyIDs(t, s, "prj_1", "sbx_3"), "run_10")
	checkIDs(t, "sbx_3 of prj_2 untouched by prj_1's keep", historyIDs(t, s, "prj_2", "sbx_3"), "run_4")

	for _, bad := range unstorable {
		checkCode(t, fmt.Sprintf("PutHistory with sandbox %q", bad), s.PutHistory(ctx, "prj_1", bad, entry("run_bad", "x", 9), 0), pandastack.EInvalid)
		checkIDs(t, fmt.Sprintf("history of %q", bad), historyIDs(t, s, "prj_1", bad))
	}
}

// TrimHistory drops the oldest entries of any sandbox until the rest fit.
func testHistoryTrim(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	if n, err := s.TrimHistory(ctx, 0); err != nil || n != 0 {
		t.Errorf("TrimHistory of an empty store = %d, %v", n, err)
	}
	big := strings.Repeat("o", 1000)
	for i := 1; i <= 6; i++ {
		e := entry(fmt.Sprintf("run_%d", i), "x", i)
		e.Stdout = big
		mustPutHistory(t, s, "prj_1", fmt.Sprintf("sbx_%d", i%2), e, 0)
	}
	// Each entry holds over 1000 bytes and under 1500: 4000 keeps three.
	n, err := s.TrimHistory(ctx, 4000)
	if err != nil || n != 3 {
		t.Errorf("TrimHistory = %d, %v; want 3 gone", n, err)
	}
	checkIDs(t, "sbx_0 after the trim", historyIDs(t, s, "prj_1", "sbx_0"), "run_6", "run_4")
	checkIDs(t, "sbx_1 after the trim", historyIDs(t, s, "prj_1", "sbx_1"), "run_5")
	if n, err := s.TrimHistory(ctx, 4000); err != nil || n != 0 {
		t.Errorf("a second TrimHistory = %d, %v; want none gone", n, err)
	}

	// Another project floods: the trim takes from it, the project that
	// holds the most, and leaves prj_1's three entries (about 3500 bytes).
	for i := 7; i <= 16; i++ {
		e := entry(fmt.Sprintf("run_%d", i), "x", i)
		e.Stdout = big
		mustPutHistory(t, s, "prj_2", "sbx_flood", e, 0)
	}
	n, err = s.TrimHistory(ctx, 7000)
	if err != nil || n != 7 {
		t.Errorf("TrimHistory after the flood = %d, %v; want 7 of prj_2's gone", n, err)
	}
	checkIDs(t, "sbx_0 after the flood's trim", historyIDs(t, s, "prj_1", "sbx_0"), "run_6", "run_4")
	checkIDs(t, "sbx_1 after the flood's trim", historyIDs(t, s, "prj_1", "sbx_1"), "run_5")
	checkIDs(t, "sbx_flood after its trim", historyIDs(t, s, "prj_2", "sbx_flood"), "run_16", "run_15", "run_14")
}

// Origins come back oldest first per project; keep bounds a project's.
func testOrigins(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	origins := func(project string) []string {
		t.Helper()
		list, err := s.ListOrigins(ctx, project)
		if err != nil || list == nil {
			t.Fatalf("ListOrigins %s = %v, %v", project, list, err)
		}
		out := []string{}
		for _, o := range list {
			out = append(out, o.SandboxID+"<"+o.Kind+"<"+o.From)
		}
		return out
	}
	checkIDs(t, "origins of an empty project", origins("prj_1"))
	at := base.Add(1500 * time.Microsecond)
	add := func(project, id, kind, from string, keep int) error {
		return s.AddOrigin(ctx, project, pandastack.Origin{SandboxID: id, Kind: kind, From: from, At: at}, keep)
	}
	for _, o := range [][3]string{{"sbx_2", "snapshot", "snap_1"}, {"sbx_3", "fork", "sbx_2"}} {
		if err := add("prj_1", o[0], o[1], o[2], 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := add("prj_2", "sbx_9", "fork", "sbx_8", 0); err != nil {
		t.Fatal(err)
	}
	checkIDs(t, "origins of prj_1", origins("prj_1"), "sbx_2<snapshot<snap_1", "sbx_3<fork<sbx_2")
	list, _ := s.ListOrigins(ctx, "prj_1")
	checkTime(t, "origin's At", list[0].At, stored(at))
	checkCode(t, "a second origin of sbx_2", add("prj_1", "sbx_2", "fork", "sbx_1", 0), pandastack.EConflict)
	if err := add("prj_1", "sbx_4", "fork", "sbx_2", 2); err != nil {
		t.Fatal(err)
	}
	checkIDs(t, "origins of prj_1 kept to 2", origins("prj_1"), "sbx_3<fork<sbx_2", "sbx_4<fork<sbx_2")
	checkIDs(t, "origins of prj_2", origins("prj_2"), "sbx_9<fork<sbx_8")
	for _, bad := range unstorable {
		checkCode(t, fmt.Sprintf("AddOrigin from %q", bad), add("prj_1", "sbx_x", "fork", bad, 0), pandastack.EInvalid)
		checkIDs(t, fmt.Sprintf("origins of project %q", bad), origins(bad))
	}
	if got := origins("prj_1"); slices.Contains(got, "sbx_x") {
		t.Errorf("a refused origin was stored: %v", got)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ChurnHistory puts, rewrites, keeps and trims the history of a few
// projects, then puts and trims from several goroutines at once, and calls
// check after each stage: a store that keeps totals of its own checks
// them against its entries there. None of it may fail (a deadlock between
// a put and a trim did).
func ChurnHistory(t *testing.T, s pandastack.Store, check func(stage string)) {
	ctx := t.Context()
	for i := range 30 {
		project := fmt.Sprintf("prj_%d", i%3)
		sandbox := fmt.Sprintf("sbx_%d", i%5)
		e := entry(fmt.Sprintf("h_%d", i), strings.Repeat("x", 10*i), i)
		mustPutHistory(t, s, project, sandbox, e, 4)
		if i%2 == 0 { // the entry's end rewrites it, longer
			e.Command += strings.Repeat("y", 50)
			mustPutHistory(t, s, project, sandbox, e, 4)
		}
	}
	check("after puts, rewrites and keeps")
	if _, err := s.TrimHistory(ctx, 1500); err != nil {
		t.Fatal(err)
	}
	check("after a trim")
	errs := make(chan error, 200)
	done := make(chan struct{})
	for w := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 40 {
				e := entry(fmt.Sprintf("c_%d_%d", w, i), strings.Repeat("z", 20+i), i)
				if err := s.PutHistory(ctx, fmt.Sprintf("prj_%d", i%2), fmt.Sprintf("sbx_c%d", w), e, 6); err != nil {
					errs <- err
				}
				if i%5 == 0 {
					if _, err := s.TrimHistory(ctx, 2000); err != nil {
						errs <- err
					}
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Errorf("put or trim at once: %v", err)
	}
	check("after puts and trims at once")
}
