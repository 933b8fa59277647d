package template

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack"
)

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestBuiltinBase(t *testing.T) {
	r, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"python3", "bash", "coreutils", "ca-certificates"} {
		if !strings.Contains(" "+strings.Join(s.Apt, " ")+" ", " "+pkg+" ") {
			t.Errorf("base apt %v lacks %s", s.Apt, pkg)
		}
	}
	if s.Suite != "bookworm" || r.Source("base") != "templates/base.yaml" {
		t.Errorf("suite %q source %q", s.Suite, r.Source("base"))
	}
}

func TestGetUnknownListsTemplates(t *testing.T) {
	r, err := Load(writeFiles(t, map[string]string{"zeta.yaml": "name: zeta\n"}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Get("nope")
	if !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("Get(nope) = %v, want code %s", err, pandastack.ENotFound)
	}
	if msg := pandastack.ErrorMessage(err); !strings.Contains(msg, `"nope"`) || !strings.Contains(msg, "base, ") || !strings.HasSuffix(msg, ", zeta") {
		t.Errorf("message %q should name the template and list base … zeta", msg)
	}
}

func TestUserTemplatesOverride(t *testing.T) {
	first := writeFiles(t, map[string]string{
		"base.yaml":  "name: base\ndescription: mine\napt: [python3]\n",
		"extra.yaml": "description: no name field, so the file name\n",
		"notes.txt":  "not a template",
	})
	second := writeFiles(t, map[string]string{"extra.yaml": "name: extra\ncpu: 4\n"})
	r, err := Load(first, second)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := r.Get("base")
	if base.Description != "mine" || r.Source("base") != filepath.Join(first, "base.yaml") {
		t.Errorf("base not overridden: %+v from %s", base, r.Source("base"))
	}
	extra, err := r.Get("extra")
	if err != nil || extra.CPU != 4 {
		t.Errorf("extra from the later dir: %+v %v", extra, err)
	}
	var names []string
	for _, s := range r.List() {
		names = append(names, s.Name)
	}
	if !slices.Contains(names, "base") || !slices.Contains(names, "extra") || !slices.IsSorted(names) {
		t.Errorf("List = %v, want base and extra among them, sorted", names)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		files map[string]string
		want  string
	}{
		{map[string]string{"a.yaml": "name: b\n"}, `name "b" does not match its file name a.yaml`},
		{map[string]string{"a.yaml": "name: a\ncpu: 0.5\n"}, `a.yaml: invalid_request: template spec: line 2: cpu "0.5" must be a whole number`},
		{map[string]string{"a.yaml": "name: a\nbogus: 1\n"}, `unknown field "bogus"`},
		{map[string]string{"a.yml": "name: b\n"}, `name "b" does not match its file name a.yml`},
		{map[string]string{"a.yml": "name: a\n", "a.yaml": "name: a\n"}, "template a is also in"},
		{map[string]string{"a.yaml": "name: a\ndescription: " + strings.Repeat("x", 5<<20) + "\n"}, "at most 4 MiB"},
	} {
		_, err := Load(writeFiles(t, tc.files))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Load(%v) = %v, want error containing %q", tc.files, err, tc.want)
		}
	}
	// Hidden files (an editor's) are not specs; .yml is as .yaml.
	r, err := Load(writeFiles(t, map[string]string{".#a.yaml": "junk", "b.yml": "name: b\n"}))
	if err != nil || strings.Join(r.Names(), " ") != "b base code-interpreter" {
		t.Errorf("Load with a hidden file and a .yml: %v %v", r, err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Load of a missing directory succeeded")
	}
	// A FIFO or a directory named as a spec is refused at once, by name
	// (reading the FIFO hung every listing).
	for _, mk := range []func(string) error{
		func(p string) error { return syscall.Mkfifo(p, 0o644) },
		func(p string) error { return os.Mkdir(p, 0o755) },
	} {
		dir := t.TempDir()
		if err := mk(filepath.Join(dir, "odd.yaml")); err != nil {
			t.Fatal(err)
		}
		_, err := Load(dir)
		if !pandastack.IsCode(err, pandastack.EInvalid) || !strings.Contains(err.Error(), "odd.yaml") || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("Load of a directory with a non-file odd.yaml: %v", err)
		}
	}
}

// AddNew takes only the names a registry does not have.
func TestAddNew(t *testing.T) {
	r, err := Load(writeFiles(t, map[string]string{"a.yaml": "description: first\n"}))
	if err != nil {
		t.Fatal(err)
	}
	later, err := Load(writeFiles(t, map[string]string{"a.yaml": "description: changed\n", "b.yaml": "description: new\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if added := r.AddNew(later); strings.Join(added, " ") != "b" {
		t.Errorf("added %q, want b", added)
	}
	if a, _ := r.Get("a"); a.Description != "first" {
		t.Errorf("a known spec changed: %q", a.Description)
	}
	if _, err := r.Get("b"); err != nil {
		t.Error(err)
	}
}
