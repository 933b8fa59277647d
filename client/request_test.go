package client

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
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
