package client

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Durations go to the API in whole seconds, rounded up: a part of a
// second is never 0, which means "never" for an idle timeout.
func TestWholeSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, 500 * time.Millisecond: 1, time.Second: 1, 1500 * time.Millisecond: 2, time.Hour: 3600} {
		if got := wholeSeconds(d); got != want {
			t.Errorf("%s: %d, want %d", d, got, want)
		}
	}
}

// The requests carry every field the API takes.
func TestRequestFields(t *testing.T) {
	idle := int64(30)
	b, _ := json.Marshal(CreateSandboxRequest{Template: "base", AutoResume: true})
	if string(b) != `{"template":"base","auto_resume":true}` {
		t.Errorf("create: %s", b)
	}
	b, _ = json.Marshal(RestoreRequest{SnapshotID: "snap_x", IdleTimeoutSeconds: &idle, Network: &NetworkPolicy{AllowOut: []string{"a.test"}}})
	var got map[string]any
	json.Unmarshal(b, &got)
	if got["idle_timeout_seconds"] != 30.0 || got["network"] == nil {
		t.Errorf("restore: %s", b)
	}
}

// A port token's TTL goes as whole seconds rounded up, as SetTTL's does:
// 500 ms was sent as 0, which the server refuses.
func TestPortTokenTTLRoundsUp(t *testing.T) {
	var body map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"url":"http://x/","token":"t","expires_at":"2026-01-01T00:00:00Z"}`)
	}))
	defer srv.Close()
	if _, err := New(srv.URL, "pds_x").CreatePortToken(t.Context(), "sbx_x", 8000, 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if body["ttl_seconds"] != 1.0 {
		t.Errorf("ttl_seconds %v, want 1", body["ttl_seconds"])
	}
}

// ListSandboxes reads the list a page at a time, passing each page's next
// as the following page's after with the same filters, until a page has
// none.
func TestListSandboxesReadsEveryPage(t *testing.T) {
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Query().Get("after") {
		case "":
			io.WriteString(w, `{"sandboxes":[{"id":"sbx_a"},{"id":"sbx_b"}],"next":"p2"}`)
		case "p2":
			io.WriteString(w, `{"sandboxes":[{"id":"sbx_c"}],"next":"p3"}`)
		default:
			io.WriteString(w, `{"sandboxes":[]}`)
		}
	}))
	defer srv.Close()
	list, err := New(srv.URL, "pds_x").ListSandboxes(t.Context(), map[string]string{"k": "v"}, "all")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	want := []string{"limit=500&metadata.k=v&state=all", "after=p2&limit=500&metadata.k=v&state=all", "after=p3&limit=500&metadata.k=v&state=all"}
	if fmt.Sprint(ids) != "[sbx_a sbx_b sbx_c]" || fmt.Sprint(queries) != fmt.Sprint(want) {
		t.Errorf("got %v from queries %q, want [sbx_a sbx_b sbx_c] from %q", ids, queries, want)
	}
}

// Against a server from before pages (it refuses limit as an unknown
// parameter) ListSandboxes asks once without it; one that answers the
// same next again is an error, not a loop without end.
func TestListSandboxesOldServerAndRepeatedNext(t *testing.T) {
	old := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Has("limit") {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"code":"invalid_request","message":"unknown query parameter \"limit\"; filter with metadata.<key>=<value> or state="}}`)
			return
		}
		io.WriteString(w, `{"sandboxes":[{"id":"sbx_a"},{"id":"sbx_b"}]}`)
	}))
	defer old.Close()
	list, err := New(old.URL, "pds_x").ListSandboxes(t.Context(), nil, "")
	if err != nil || len(list) != 2 {
		t.Errorf("an old server: %v, %v", list, err)
	}
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"sandboxes":[{"id":"sbx_a"}],"next":"same"}`)
	}))
	defer stuck.Close()
	if _, err := New(stuck.URL, "pds_x").ListSandboxes(t.Context(), nil, ""); err == nil || !strings.Contains(err.Error(), "never end") {
		t.Errorf("a server that repeats next: %v, want an error", err)
	}
}
