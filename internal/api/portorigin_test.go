package api

import (
	"context"
	"net/http/httptest"
	"testing"
)

// A request let in by its port-token cookie alone is refused when a page
// of another origin sent it: on the host form, every sandbox's port host
// is one site, so another sandbox's page gets the cookie sent along.
func TestForeignPage(t *testing.T) {
	s := &Server{cfg: Config{PublicDomain: "ports.example.test"}}
	const id = "sbx_abcdefghijklmnop"
	own := "8000-sbx-abcdefghijklmnop.ports.example.test"
	for _, c := range []struct {
		name    string
		method  string
		host    bool // the host form
		headers map[string]string
		refused bool
	}{
		{"curl, no browser headers", "POST", true, nil, false},
		{"the port's own page", "POST", true, map[string]string{"Origin": "https://" + own, "Sec-Fetch-Site": "same-origin"}, false},
		{"another port of the same sandbox", "POST", true, map[string]string{"Origin": "https://3000-sbx-abcdefghijklmnop.ports.example.test", "Sec-Fetch-Site": "same-site"}, false},
		{"another sandbox's page, a WebSocket", "GET", true, map[string]string{"Origin": "https://3000-sbx-zzzzzzzzzzzzzzzz.ports.example.test", "Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "websocket", "Upgrade": "websocket"}, true},
		{"another sandbox's page, a POST", "POST", true, map[string]string{"Origin": "https://3000-sbx-zzzzzzzzzzzzzzzz.ports.example.test", "Sec-Fetch-Site": "same-site"}, true},
		{"another site's page, a script's GET", "GET", true, map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}, true},
		{"another sandbox's image, no Origin", "GET", true, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors"}, true},
		{"a link followed from elsewhere", "GET", true, map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, false},
		{"another sandbox's frame", "GET", true, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe", "Referer": "https://3000-sbx-zzzzzzzzzzzzzzzz.ports.example.test/"}, true},
		{"another port's image of the same sandbox", "GET", true, map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Referer": "https://3000-sbx-abcdefghijklmnop.ports.example.test/app"}, false},
		{"the port's own image, over plain HTTP", "GET", true, map[string]string{"Referer": "http://" + own + "/index.html"}, false},
		{"another sandbox's image over plain HTTP", "GET", true, map[string]string{"Referer": "http://3000-sbx-zzzzzzzzzzzzzzzz.ports.example.test/"}, true},
		{"a post behind a redirect", "POST", true, map[string]string{"Origin": "null"}, true},
		{"a form posted from elsewhere", "POST", true, map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}, true},
		{"path form, the API's own origin", "POST", false, map[string]string{"Origin": "https://api.example.test", "Sec-Fetch-Site": "same-origin"}, false},
		{"path form, another site", "POST", false, map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, true},
		{"a bad Origin", "POST", true, map[string]string{"Origin": "://"}, true},
	} {
		r := httptest.NewRequest(c.method, "/x", nil)
		r.Host = own
		if !c.host {
			r.Host = "api.example.test"
		} else {
			r = r.WithContext(context.WithValue(r.Context(), hostRoutedKey{}, true))
		}
		for k, v := range c.headers {
			r.Header.Set(k, v)
		}
		if got := s.foreignPage(r, id); got != c.refused {
			t.Errorf("%s: refused %v, want %v", c.name, got, c.refused)
		}
	}
}
