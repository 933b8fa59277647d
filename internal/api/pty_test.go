package api

import (
	"net/http/httptest"
	"testing"
)

func TestWebSocketKeyFromSubprotocol(t *testing.T) {
	for _, tc := range []struct {
		headers []string
		want    string
	}{
		{nil, ""},
		{[]string{"pandastack.pty"}, ""},
		{[]string{"pandastack.pty, bearer.pds_abc"}, "pds_abc"},
		{[]string{"pandastack.pty", "bearer.pds_xyz"}, "pds_xyz"},
		{[]string{"bearer."}, ""},
	} {
		r := httptest.NewRequest("GET", "/v1/sandboxes/x/pty", nil)
		for _, h := range tc.headers {
			r.Header.Add("Sec-WebSocket-Protocol", h)
		}
		if got := wsKey(r); got != tc.want {
			t.Errorf("wsKey(%q) = %q, want %q", tc.headers, got, tc.want)
		}
	}
}

func TestTermSize(t *testing.T) {
	for q, want := range map[string]int{"": 80, "cols=1": 1, "cols=1000": 1000, "cols=0": -1, "cols=1001": -1, "cols=x": -1, "cols=-5": -1} {
		r := httptest.NewRequest("GET", "/v1/sandboxes/x/pty?"+q, nil)
		got, err := termSize(r, "cols", 80)
		if want < 0 {
			if err == nil {
				t.Errorf("%q: no error", q)
			}
			continue
		}
		if err != nil || int(got) != want {
			t.Errorf("%q: %d, %v; want %d", q, got, err, want)
		}
	}
}
