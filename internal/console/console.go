// Package console is the web console that `pandastack serve` serves at /:
// plain HTML, CSS and JavaScript modules embedded in the binary, with
// nothing fetched from elsewhere (it works offline). Everything it shows
// comes from the public REST API with the key the user signs in with. Only
// internal/api imports it.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
	"sync"
)

//go:embed assets
var assets embed.FS

// Serves reports whether path is the console's: / and /ui/….
func Serves(path string) bool {
	return path == "/" || path == "/index.html" || strings.HasPrefix(path, "/ui/")
}

// Has reports whether the console has a page or file at path (one Serves
// says is the console's).
func Has(path string) bool {
	if path == "/" || path == "/index.html" {
		return true
	}
	name, ok := strings.CutPrefix(path, "/ui/")
	if !ok || name == "" {
		return false
	}
	st, err := fs.Stat(assets, "assets/"+name)
	return err == nil && !st.IsDir()
}

// csp keeps the console to its own origin: no script, style, font or image
// from elsewhere, no inline script (output of sandboxed code is shown, and
// must never run here), images also from data: URLs (charts).
const csp = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; " +
	"connect-src 'self'; frame-src 'self' data: blob:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console; it is built once.
var Handler = sync.OnceValue(newHandler)

func newHandler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/" || r.URL.Path == "/index.html" {
			http.ServeFileFS(w, r, sub, "index.html")
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = strings.TrimPrefix(r.URL.Path, "/ui")
		if r2.URL.Path == "/" {
			http.NotFound(w, r)
			return
		}
		files.ServeHTTP(w, r2)
	})
}
