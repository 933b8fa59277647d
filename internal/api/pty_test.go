package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
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

// TestWebSocketHandshakeCheck: the check made before a shell is opened
// refuses exactly the handshakes websocket.Accept refuses, so a bad one
// gets a JSON error and opens no shell, and a good one is not turned away.
func TestWebSocketHandshakeCheck(t *testing.T) {
	type verdict struct{ check, accepted bool }
	got := make(chan verdict, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := verdict{check: wsHandshakeError(r) == nil}
		ws, err := websocket.Accept(w, r, nil)
		if v.accepted = err == nil; v.accepted {
			ws.CloseNow()
		}
		got <- v
	}))
	defer srv.Close()
	good := map[string]string{"Upgrade": "websocket", "Connection": "keep-alive, Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
	host := strings.TrimPrefix(srv.URL, "http://")
	for name, change := range map[string]map[string]string{
		"good":            {},
		"same origin":     {"Origin": "http://" + strings.ToUpper(host)},
		"no upgrade":      {"Upgrade": ""},
		"no connection":   {"Connection": ""},
		"version 12":      {"Sec-WebSocket-Version": "12"},
		"no version":      {"Sec-WebSocket-Version": ""},
		"no key":          {"Sec-WebSocket-Key": ""},
		"short key":       {"Sec-WebSocket-Key": "c2hvcnQ="},
		"key not base64":  {"Sec-WebSocket-Key": "not base64 at all!!!!!!"},
		"other origin":    {"Origin": "http://elsewhere.test"},
		"no origin host":  {"Origin": "null"},
		"connection only": {"Connection": "close"},
	} {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		for k, v := range good {
			req.Header.Set(k, v)
		}
		for k, v := range change {
			if v == "" {
				req.Header.Del(k)
			} else {
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		v := <-got
		if v.check != v.accepted || v.accepted != (name == "good" || name == "same origin") {
			t.Errorf("%s: our check passes %v, websocket.Accept accepts %v", name, v.check, v.accepted)
		}
	}
}

// TestPortProxyKeepsTheQuery: the proxy drops only its own token from the
// query; everything else goes on as written.
func TestPortProxyKeepsTheQuery(t *testing.T) {
	for raw, want := range map[string]string{
		"":                                      "",
		"b=2&a=1&flag&t=%20&u=x;y":              "b=2&a=1&flag&t=%20&u=x;y",
		"pandastack_token=abc":                  "",
		"a=1&pandastack_token=abc&b=2":          "a=1&b=2",
		"a=1&pandastack%5Ftoken=abc&pandastack": "a=1&pandastack",
	} {
		if got := withoutParam(raw, tokenParam); got != want {
			t.Errorf("%q: %q, want %q", raw, got, want)
		}
	}
	for path, want := range map[string]string{
		"/v1/sandboxes/sbx_a/ports/8000/a%2Fb":       "/a%2Fb",
		"/v1/sandboxes/sbx_a/ports/8000/":            "/",
		"/v1/sandboxes/sbx_a/ports/8000":             "/",
		"/v1/sandboxes/sbx_a/ports/8000/x/ports/9/y": "/x/ports/9/y",
		"/app/ports/3/detail%2Fx":                    "/app/ports/3/detail%2Fx", // a host route: all of it
		"/v1/sandboxes/sbx_a/ports/%38000/x?":        "/x",                      // the port escaped
	} {
		r := httptest.NewRequest("GET", path, nil)
		r.SetPathValue("id", "sbx_a")
		r.SetPathValue("port", "8000")
		if got := proxiedPath(r); got != want {
			t.Errorf("%s: %q, want %q", path, got, want)
		}
	}
}

// TestBearerProtocolsStayWithUs: the key a browser sends as a WebSocket
// subprotocol is not passed on to a sandbox's server; its other
// subprotocols are.
func TestBearerProtocolsStayWithUs(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"bearer.pds_x"}, ""},
		{[]string{"chat, bearer.pds_x", "bearer.pds_y"}, "chat"},
		{[]string{"pandastack.pty,bearer.pds_x, v2.json"}, "pandastack.pty, v2.json"},
	} {
		h := http.Header{}
		for _, v := range c.in {
			h.Add("Sec-WebSocket-Protocol", v)
		}
		removeBearerProtocols(h)
		if got := strings.Join(h.Values("Sec-WebSocket-Protocol"), "|"); got != c.want || strings.Contains(got, "pds_") {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}
