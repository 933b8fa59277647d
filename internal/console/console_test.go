package console

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestServesIndexAndAssets(t *testing.T) {
	h := Handler()
	for path, ctype := range map[string]string{"/": "text/html", "/ui/app.js": "javascript", "/ui/console.css": "text/css"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Header().Get("Content-Type"), ctype) {
			t.Errorf("GET %s: %d %q", path, rec.Code, rec.Header().Get("Content-Type"))
		}
		if !strings.Contains(rec.Header().Get("Content-Security-Policy"), "default-src 'self'") {
			t.Errorf("GET %s: no content security policy", path)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/ui/nope.js", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("GET /ui/nope.js: %d, want 404", rec.Code)
	}
	for path, want := range map[string]bool{"/": true, "/ui/x": true, "/v1/sandboxes": false, "/healthz": false, "/uix": false} {
		if Serves(path) != want {
			t.Errorf("Serves(%q) = %v", path, !want)
		}
	}
}

// The console must work offline: no asset may load anything from another
// origin (the CSP would block it anyway; this catches it before a user does).
func TestNoExternalReferences(t *testing.T) {
	external := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?(https?:)?//|@import\s+url\(\s*["']?(https?:)?//|fetch\(\s*["']https?://`)
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(assets, path)
		if m := external.Find(b); m != nil {
			t.Errorf("%s refers to another origin: %s", path, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
