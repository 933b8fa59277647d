package api

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// The port proxy takes its own cookie out of what it passes to the
// sandbox's server and leaves the app's cookies as the client sent them:
// rebuilt through Go's parser, a value with a quote or a non-ASCII byte
// was dropped and one with a space came back quoted.
func TestRemoveCookieKeepsTheOthersAsSent(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []string
		want []string
	}{
		{"the app's cookies around ours", []string{`prefs={"theme":"dark"}; ` + portTokenCookie + `=abc; name=José; sid=a b`}, []string{`prefs={"theme":"dark"}; name=José; sid=a b`}},
		{"ours alone", []string{portTokenCookie + "=abc"}, nil},
		{"two lines (HTTP/2 sends one per cookie)", []string{"a=1", portTokenCookie + "=abc", "b=\\x"}, []string{"a=1; b=\\x"}},
		{"none of ours: untouched", []string{`x="y z" ;  odd=1,2`, "other=1"}, []string{`x="y z" ;  odd=1,2`, "other=1"}},
		{"a name that only ends like ours", []string{"my" + portTokenCookie + "=1; " + portTokenCookie + " = abc"}, []string{"my" + portTokenCookie + "=1"}},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		for _, l := range c.in {
			r.Header.Add("Cookie", l)
		}
		removeCookie(r, portTokenCookie)
		if got := r.Header.Values("Cookie"); !slices.Equal(got, c.want) {
			t.Errorf("%s: Cookie %q, want %q", c.name, got, c.want)
		}
	}
}
