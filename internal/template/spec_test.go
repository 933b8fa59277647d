package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
)

func mustParse(t *testing.T, y string) Spec {
	t.Helper()
	s, err := Parse([]byte(y))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", y, err)
	}
	return s
}

func TestParseFull(t *testing.T) {
	s := mustParse(t, `
name: data-1
description: a test
suite: trixie
mirror: http://mirror.example/debian
apt: [python3, curl]
pip: ["numpy==2.1", "pandas>=2"]
files:
  - path: /etc/motd
    content: |
      hello
    mode: 0600
  - path: /usr/local/bin/go-run
    content: "#!/bin/sh\n"
    mode: "755"
  - path: /opt/plain
    content: x
run:
  - echo hi > /etc/hi
cpu: 2
memory_mb: 1024
warmup: import numpy
`)
	if s.Name != "data-1" || s.Suite != "trixie" || s.Mirror != "http://mirror.example/debian" {
		t.Errorf("name/suite/mirror = %q/%q/%q", s.Name, s.Suite, s.Mirror)
	}
	if strings.Join(s.Apt, ",") != "python3,curl" || strings.Join(s.Pip, ",") != "numpy==2.1,pandas>=2" {
		t.Errorf("apt %v pip %v", s.Apt, s.Pip)
	}
	if len(s.Files) != 3 || s.Files[0].Content != "hello\n" {
		t.Fatalf("files = %+v", s.Files)
	}
	for i, want := range []FileMode{0o600, 0o755, 0o644} {
		if s.Files[i].Mode != want {
			t.Errorf("files[%d].mode = %v, want %v", i, s.Files[i].Mode, want)
		}
	}
	if s.CPU != 2 || s.MemoryMB != 1024 || s.Warmup != "import numpy" || len(s.Run) != 1 {
		t.Errorf("cpu %d mem %d warmup %q run %v", s.CPU, s.MemoryMB, s.Warmup, s.Run)
	}
}

func TestParseDefaults(t *testing.T) {
	s := mustParse(t, "name: x\n")
	if s.Suite != "bookworm" || s.CPU != 1 || s.MemoryMB != 512 || s.Mirror != "" {
		t.Errorf("defaults: %+v", s)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"", "empty"},
		{"name: x\nnmae: y\n", `unknown field "nmae" (the fields are name,`},
		{"name: x\nfiles: [{path: /a, content: b, owner: root}]\n", `unknown field "owner" (the fields are path, content, mode)`},
		{"name: x\n---\nname: y\n", "one YAML document"},
		{"name: [x]\n", "a list where a string is wanted"},
		{"description: no name\n", `name ""`},
		{"name: Bad_Name\n", `name "Bad_Name"`},
		{"name: -x\n", `name "-x"`},
		{"name: " + strings.Repeat("a", 64) + "\n", "1-63 characters"},
		{"name: x\nsuite: \"\"\nmirror: ftp://x\n", "mirror"},
		{"name: x\nsuite: 'book worm'\n", "suite"},
		{"name: x\ncpu: 65\n", "cpu 65 is out of range 1..64"},
		{"name: x\ndisk_mb: 10\n", "disk_mb 10 is out of range"},
		{"name: x\ncpu: -1\n", "cpu -1"},
		{"name: x\ncpu: 1.5\n", `cpu "1.5" must be a whole number`},
		{"name: x\nmemory_mb: 1e3\n", "memory_mb"},
		{"name: x\nmemory_mb: 63\n", "memory_mb 63 is out of range 64..65536"},
		{"name: x\nmemory_mb: 65537\n", "memory_mb 65537"},
		{"name: x\napt: [\"python3; rm -rf /\"]\n", "apt[0]"},
		{"name: x\napt: [--force-yes]\n", "apt[0]"},
		{"name: x\npip: [--index-url=http://evil]\n", "pip[0]"},
		{"name: x\nfiles: [{path: etc/motd}]\n", "files[0].path"},
		{"name: x\nfiles: [{path: /etc/../motd}]\n", "files[0].path"},
		{"name: x\nfiles: [{path: /a}, {path: /a}]\n", "appears twice"},
		{"name: x\nfiles: [{path: /a, mode: 0999}]\n", "octal permission"},
		{"name: x\nfiles: [{path: /a, mode: 17777}]\n", "octal permission"},
		{"name: x\nrun: [\"  \"]\n", "run[0] is empty"},
		{"name: x\nrun: [\"echo " + strings.Repeat("x", 128<<10) + "\"]\n", "run[0] has 131077 bytes, more than one command line carries"},
		{"name: x\napt: [" + strings.Repeat("abcdefghijklmno, ", 70000) + "]\n", "apt names 1120000 bytes of packages"},
		{"null\n", "mapping of fields"},
		{"just words\n", "where a mapping of fields is wanted"},
		{"name: x\ndisk_mb: 100.7\n", `disk_mb "100.7" must be a whole number`},
		{"name: x\ncpu: 0\n", "cpu 0 is out of range (leave it out for the default)"},
		{"name: x\nmemory_mb: 0\n", "memory_mb 0 is out of range"},
		{"name: x\ndisk_mb: 0\n", "disk_mb 0 is out of range"},
		{"name: x\ncpu: 00\n", "cpu 0 is out of range"},
		{"name: x\nfiles: [{path: /tmp/a}]\n", "empties /tmp"},
		{"name: x\nfiles: [{path: /var/tmp/a/b}]\n", "empties /tmp"},
		{"name: x\nfiles: [{path: /proc/sys/kernel/hostname, content: x}]\n", "belongs to the kernel"},
		{"name: x\nfiles: [{path: /sys/x}]\n", "belongs to the kernel"},
		{"name: x\nfiles: [{path: /dev/devfile}]\n", "belongs to the kernel"},
		{"name: x\nfiles: [{path: /etc/secret, mode: \"0000\"}]\n", "unusable"},
		{"name: x\nfiles: [{path: /etc/secret, mode: 0}]\n", "unusable"},
	} {
		_, err := Parse([]byte(tc.yaml))
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want error containing %q", tc.yaml, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v, want it to contain %q", tc.yaml, err, tc.want)
		}
		if !pandastack.IsCode(err, pandastack.EInvalid) {
			t.Errorf("Parse(%q): code %s, want %s", tc.yaml, pandastack.ErrorCode(err), pandastack.EInvalid)
		}
	}
}

func TestParseAcceptsAptVersions(t *testing.T) {
	mustParse(t, "name: x\napt: [python3=3.11.2-1+b1, libc6:amd64, g++, curl/bookworm-backports, python3-numpy=1:1.24~rc1]\n")
}

func TestHashStable(t *testing.T) {
	a := mustParse(t, "name: x\napt: [python3]\n")
	// Key order, explicit defaults and an explicit empty list do not matter.
	b := mustParse(t, "apt: [python3]\ncpu: 1\nmemory_mb: 512\nsuite: bookworm\npip: []\nname: x\n")
	if a.Hash() != b.Hash() {
		t.Errorf("same spec, different hashes: %s %s", a.Hash(), b.Hash())
	}
	if a.Hash() != a.Hash() || len(a.Hash()) != 64 {
		t.Errorf("hash %q is not a stable sha256 hex", a.Hash())
	}
	// A spec built in Go without defaults hashes like the parsed one.
	if h := (Spec{Name: "x", Apt: []string{"python3"}}).Hash(); h != a.Hash() {
		t.Errorf("Go-built spec hash %s != parsed %s", h, a.Hash())
	}
}

func TestHashChangesWithEveryField(t *testing.T) {
	base := func() Spec {
		return mustParse(t, `
name: x
description: d
suite: bookworm
mirror: http://m/debian
apt: [a]
pip: [b]
files: [{path: /f, content: c, mode: "0644"}]
run: [r]
cpu: 1
memory_mb: 512
warmup: w
`)
	}
	seen := map[string]string{base().Hash(): "original"}
	for name, change := range map[string]func(*Spec){
		"name":         func(s *Spec) { s.Name = "y" },
		"description":  func(s *Spec) { s.Description = "e" },
		"suite":        func(s *Spec) { s.Suite = "trixie" },
		"mirror":       func(s *Spec) { s.Mirror = "" },
		"apt":          func(s *Spec) { s.Apt = append(s.Apt, "z") },
		"apt order":    func(s *Spec) { s.Apt = []string{"z", "a"} },
		"pip":          func(s *Spec) { s.Pip = nil },
		"file path":    func(s *Spec) { s.Files[0].Path = "/g" },
		"file content": func(s *Spec) { s.Files[0].Content = "c2" },
		"file mode":    func(s *Spec) { s.Files[0].Mode = 0o600 },
		"run":          func(s *Spec) { s.Run = []string{"r", "r"} },
		"cpu":          func(s *Spec) { s.CPU = 2 },
		"memory":       func(s *Spec) { s.MemoryMB = 1024 },
		"warmup":       func(s *Spec) { s.Warmup = "w2" },
	} {
		s := base()
		change(&s)
		h := s.Hash()
		if prev, dup := seen[h]; dup {
			t.Errorf("changing %s gives the same hash as %s", name, prev)
		}
		seen[h] = name
	}
}

// A spec with files under the user's home does not reuse a build made
// when those files were root's; other specs keep their hash.
func TestHashOfUserFiles(t *testing.T) {
	etc := Spec{Name: "x", Files: []File{{Path: "/etc/a"}}}
	home := Spec{Name: "x", Files: []File{{Path: "/home/user/a"}}}
	homeRoot := Spec{Name: "x", Files: []File{{Path: "/home/usera"}}}
	if etc.Hash() == home.Hash() {
		t.Error("the path is not in the hash")
	}
	h := sha256.New()
	fmt.Fprintf(h, "pandastack-template/%s\n", BuilderVersion)
	b, _ := json.Marshal(func() Spec { s := homeRoot; s.applyDefaults(); return s }())
	h.Write(b)
	if homeRoot.Hash() != hex.EncodeToString(h.Sum(nil)) {
		t.Error("a spec without files under /home/user has a new hash")
	}
}

func TestHashDoesNotMutate(t *testing.T) {
	files := []File{{Path: "/a"}}
	s := Spec{Name: "x", Files: files}
	s.Hash()
	if files[0].Mode != 0 || s.Suite != "" {
		t.Errorf("Hash changed its receiver's data: %+v %+v", s, files)
	}
}

// A spec's decoding errors speak of the spec, not of Go's types.
func TestSpecErrorsInTheSpecsTerms(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"name: x\nmemory: 512\n", `line 2: unknown field "memory" (the fields are name, description, suite, mirror, apt, pip, files, run, cpu, memory_mb, disk_mb, warmup`},
		{"name: x\nrun: echo hi\n", `line 2: a string ("echo hi") where a list (e.g. [a, b], or one - item per line) is wanted`},
		{"name: x\nfiles:\n  - path: /a\n    text: b\n", `line 4: unknown field "text" (the fields are path, content, mode)`},
		{"name: x\napt: {a: b}\n", `line 2: a mapping`},
	} {
		_, err := Parse([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "template.Spec") || strings.Contains(err.Error(), "[]string") {
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
}
