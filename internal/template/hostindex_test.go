package template

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func writeHostFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The host's pip index settings reach the build's pip as its variables:
// files in pip's order ([install] over [global], the user's over the
// site's), the host's PIP_* variables over them, local paths left out.
func TestHostPipEnv(t *testing.T) {
	etc, home := t.TempDir(), t.TempDir()
	none := func(string) string { return "" }
	if env := hostPipEnv(etc, home, none); len(env) != 0 {
		t.Fatalf("no configuration: %v", env)
	}
	writeHostFiles(t, etc, map[string]string{"pip.conf": "# site\n[global]\nindex-url = http://mirror.test/simple\ntrusted-host = mirror.test\ncert = /etc/ssl/x.pem\n" +
		"extra-index-url =\n    http://extra.test/simple\n    /opt/wheels\n"})
	writeHostFiles(t, home, map[string]string{".config/pip/pip.conf": "[install]\nindex_url: https://user.test/simple\n"})
	got := hostPipEnv(etc, home, none)
	want := []string{"PIP_INDEX_URL=https://user.test/simple", "PIP_EXTRA_INDEX_URL=http://extra.test/simple", "PIP_TRUSTED_HOST=mirror.test"}
	if !slices.Equal(got, want) {
		t.Errorf("from the files: %v, want %v", got, want)
	}
	vars := map[string]string{"PIP_INDEX_URL": "http://env.test/simple", "PIP_EXTRA_INDEX_URL": "/srv/local"}
	got = hostPipEnv(etc, home, func(k string) string { return vars[k] })
	want = []string{"PIP_INDEX_URL=http://env.test/simple", "PIP_TRUSTED_HOST=mirror.test"}
	if !slices.Equal(got, want) {
		t.Errorf("with the host's variables: %v, want %v", got, want)
	}
}

// The host's apt proxies reach the build's apt-get as -o options; a later
// file wins, and settings apt comments out or that name no proxy do not.
func TestHostAptProxyOpts(t *testing.T) {
	etc := t.TempDir()
	if opts := hostAptProxyOpts(etc); len(opts) != 0 {
		t.Fatalf("no configuration: %v", opts)
	}
	writeHostFiles(t, etc, map[string]string{
		"apt/apt.conf.d/01proxy":   "Acquire::http::Proxy \"http://old.test:3128\";\n// Acquire::https::Proxy \"http://commented.test\";\n",
		"apt/apt.conf.d/02proxy":   "acquire::HTTP::proxy \"http://new.test:3128\";\nAcquire::https::Proxy \"http://tls.test:3128\";\n",
		"apt/apt.conf.d/03retries": "Acquire::Retries \"3\";\n",
	})
	got := hostAptProxyOpts(etc)
	want := []string{"-o", "Acquire::http::Proxy=http://new.test:3128", "-o", "Acquire::https::Proxy=http://tls.test:3128"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
