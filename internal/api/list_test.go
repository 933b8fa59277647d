package api

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/store/sqlite"
)

// listServer serves GET /v1/sandboxes over a SQLite store (every key
// prj_1's, keyStore) holding n sandboxes of prj_1 (sbx_00…, one a second,
// the odd ones stopped) and one of another project.
func listServer(t *testing.T, n int) *Server {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	add := func(id, project string, i int, state pandastack.SandboxState) {
		sb := pandastack.Sandbox{ID: id, ProjectID: project, Template: "base", State: state, Metadata: map[string]string{"i": fmt.Sprint(i % 3)},
			CPU: 1, MemoryMB: 512, CreatedAt: at.Add(time.Duration(i) * time.Second), ExpiresAt: at.Add(time.Hour)}
		if err := st.CreateSandbox(t.Context(), sb); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		state := pandastack.StateRunning
		if i%2 == 1 {
			state = pandastack.StateStopped
		}
		add(fmt.Sprintf("sbx_%02d", i), "prj_1", i, state)
	}
	add("sbx_other", "prj_2", 1, pandastack.StateRunning)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	return New(Config{}, sandbox.New(sandbox.Config{}, st, nil, nil, log), keyStore{st}, nil, log)
}

type listPage struct {
	Sandboxes []pandastack.Sandbox `json:"sandboxes"`
	Next      *string              `json:"next"`
}

func getList(t *testing.T, s *Server, query string) (int, listPage, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, "/v1/sandboxes?"+query, nil)
	req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	var p listPage
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("GET ?%s: %v: %s", query, err, rec.Body)
		}
	}
	return rec.Code, p, rec.Body.String()
}

// Following next from page to page gives the whole list once, in its
// order, with the filters applied; the last page has no next, and a list
// asked without limit has none either.
func TestListPages(t *testing.T) {
	s := listServer(t, 7)
	walk := func(query string) (pages [][]string) {
		t.Helper()
		q := query
		for range 10 {
			code, p, body := getList(t, s, q)
			if code != http.StatusOK {
				t.Fatalf("GET ?%s: %d %s", q, code, body)
			}
			var ids []string
			for _, sb := range p.Sandboxes {
				ids = append(ids, sb.ID)
			}
			pages = append(pages, ids)
			if p.Next == nil {
				return pages
			}
			q = query + "&after=" + *p.Next
		}
		t.Fatalf("GET ?%s: no last page after 10", query)
		return nil
	}
	check := func(what string, got [][]string, want ...[]string) {
		t.Helper()
		if !slices.EqualFunc(got, want, slices.Equal[[]string]) {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}
	check("all states, 3 a page", walk("state=all&limit=3"),
		[]string{"sbx_00", "sbx_01", "sbx_02"}, []string{"sbx_03", "sbx_04", "sbx_05"}, []string{"sbx_06"})
	check("a last page that is full has no next", walk("state=all&limit=7"),
		[]string{"sbx_00", "sbx_01", "sbx_02", "sbx_03", "sbx_04", "sbx_05", "sbx_06"})
	check("newest first", walk("state=all&limit=4&order=newest"),
		[]string{"sbx_06", "sbx_05", "sbx_04", "sbx_03"}, []string{"sbx_02", "sbx_01", "sbx_00"})
	check("the default states (the running ones here)", walk("limit=2"),
		[]string{"sbx_00", "sbx_02"}, []string{"sbx_04", "sbx_06"})
	check("with a metadata filter", walk("state=all&metadata.i=0&limit=1"),
		[]string{"sbx_00"}, []string{"sbx_03"}, []string{"sbx_06"})
	check("no limit: everything, no next", walk("state=all"),
		[]string{"sbx_00", "sbx_01", "sbx_02", "sbx_03", "sbx_04", "sbx_05", "sbx_06"})
}

// Bad paging parameters answer invalid_request, saying which and why.
func TestListPagesRefuseBadParameters(t *testing.T) {
	s := listServer(t, 1)
	for _, c := range []struct{ query, says string }{
		{"limit=0", "limit must be a whole number from 1 to 1000"},
		{"limit=1001", "limit must be"},
		{"limit=ten", "limit must be"},
		{"after=sbx_00", "after must be the next of an earlier page"},
		{"after=" + "MTIzOnNieF8w!", "after must be"},
		{"after=" + "LTE6c2J4XzA", "after must be"},                  // -1:sbx_0
		{"after=" + "MTIzOnNieCAw", "after must be"},                 // 123:sbx 0
		{"after=" + "MjUzNDAyMzAwODAwMDAwOnNieF8w", "after must be"}, // 253402300800000:sbx_0, past the year 9999
		{"order=random", "order must be oldest or newest"},
		{"page=2", "page with limit=, after= and order="},
	} {
		code, _, body := getList(t, s, c.query)
		if code != http.StatusBadRequest || !strings.Contains(body, `"invalid_request"`) || !strings.Contains(body, c.says) {
			t.Errorf("GET ?%s: %d %s, want 400 invalid_request saying %q", c.query, code, body, c.says)
		}
	}
}

// More metadata filters than a record can have keys are refused: each is
// a term of the store's query, and a thousand were an internal error of
// SQLite's (its expression depth). As many as a record can have are
// answered. A state named again and again is one filter (32 767 of them
// were too many SQL variables).
func TestListFilterLimits(t *testing.T) {
	s := listServer(t, 4)
	filters := func(n int) string {
		var q []string
		for i := range n {
			q = append(q, fmt.Sprintf("metadata.k%d=v", i))
		}
		return strings.Join(q, "&")
	}
	for _, n := range []int{sandbox.MaxMetadataKeys + 1, 1000} {
		code, _, body := getList(t, s, filters(n))
		if code != http.StatusBadRequest || !strings.Contains(body, `"invalid_request"`) || !strings.Contains(body, fmt.Sprintf("at most %d metadata.<key> filters, got %d", sandbox.MaxMetadataKeys, n)) {
			t.Errorf("%d metadata filters: %d %s, want 400 invalid_request", n, code, body)
		}
		req := httptest.NewRequest(http.MethodGet, "/v1/snapshots?"+filters(n), nil)
		req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "metadata.<key> filters") {
			t.Errorf("%d metadata filters on snapshots: %d %s, want 400 invalid_request", n, rec.Code, rec.Body)
		}
	}
	code, p, body := getList(t, s, filters(sandbox.MaxMetadataKeys))
	if code != http.StatusOK || len(p.Sandboxes) != 0 {
		t.Errorf("%d metadata filters: %d %s, want 200 and none", sandbox.MaxMetadataKeys, code, body)
	}
	code, p, body = getList(t, s, "state="+strings.TrimSuffix(strings.Repeat("running,", 32767), ","))
	var ids []string
	for _, sb := range p.Sandboxes {
		ids = append(ids, sb.ID)
	}
	if code != http.StatusOK || !slices.Equal(ids, []string{"sbx_00", "sbx_02"}) {
		t.Errorf("state=running 32767 times: %d %q %.200s, want 200 and the running ones", code, ids, body)
	}
}
