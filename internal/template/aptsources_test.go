package template

import (
	"os"
	"path/filepath"
	"testing"
)

func TestMirrorsFromHostSources(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		want  Mirrors
		err   bool
	}{
		{"deb822", map[string]string{"apt/sources.list.d/debian.sources": `Types: deb
# a comment
URIs: http://archive.test/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://archive.test/debian-security
Suites: bookworm-security
Components: main
`}, Mirrors{"http://archive.test/debian", "http://archive.test/debian-security"}, false},
		{"one-line with options and a vendor repo first", map[string]string{
			"apt/sources.list": "# comment\ndeb-src http://src.test/debian bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] https://vendor.test/apt stable main\n" +
				"deb [ arch=amd64 ] https://mirror.test/debian/ trixie main\ndeb http://sec.test/debian-security trixie-security main\n",
		}, Mirrors{"https://mirror.test/debian", "http://sec.test/debian-security"}, false},
		{"disabled and file sources are skipped", map[string]string{
			"apt/sources.list.d/a.sources": "Types: deb\nURIs: http://off.test/debian\nSuites: bookworm\nEnabled: no\n\nTypes: deb\nURIs: file:/srv/debian\nSuites: bookworm\n",
			"apt/sources.list.d/b.list":    "deb http://on.test/debian bookworm main\n",
		}, Mirrors{"http://on.test/debian", ""}, false},
		{"a non-Debian host falls back to what it has", map[string]string{
			"apt/sources.list": "deb http://archive.test/ubuntu jammy main\n",
		}, Mirrors{"http://archive.test/ubuntu", ""}, false},
		{"nothing usable", map[string]string{"apt/sources.list": "deb cdrom:[x]/ bookworm main\n"}, Mirrors{}, true},
		{"disabled-by-someone suffix is not read", map[string]string{
			"apt/sources.list.d/x.list.disabled": "deb http://no.test/debian bookworm main\n",
		}, Mirrors{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			etc := t.TempDir()
			for name, content := range c.files {
				p := filepath.Join(etc, name)
				os.MkdirAll(filepath.Dir(p), 0o755)
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := mirrorsFrom(etc)
			if (err != nil) != c.err || got != c.want {
				t.Fatalf("mirrorsFrom = %+v, %v; want %+v, error %v", got, err, c.want, c.err)
			}
		})
	}
}
