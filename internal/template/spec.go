// Package template reads template specs (templates/*.yaml and a user's own
// directories), builds their root filesystems with debootstrap and apt-get in
// a chroot, and keeps the results in the cache by the spec's hash. Builds run
// arbitrary commands as root in a chroot on the host, so a spec must come from
// the operator, never from an API caller. Only cmd/ and internal/sandbox
// import it.
package template

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/pandastack/pandastack"
)

// BuilderVersion is part of every spec's hash and of the debootstrap stage's
// key. Bump it whenever the build recipe changes, so every template is
// rebuilt with the new recipe (TestRecipeIsVersioned fails until then).
const BuilderVersion = "3"

// stageVersion keys the cached debootstrap stages; bump it only when the
// debootstrap step itself changes (BuilderVersion 3 added the security
// archive, which the stage does not use).
const stageVersion = "2"

// Defaults applied to a spec's omitted fields.
const (
	DefaultSuite    = "bookworm"
	DefaultCPU      = 1
	DefaultMemoryMB = 512
	DefaultFileMode = FileMode(0o644)
)

// Spec is one template as written in YAML. Parse fills in the defaults.
type Spec struct {
	Name        string   `yaml:"name" json:"name"`
	Description string   `yaml:"description" json:"description,omitempty"`
	Suite       string   `yaml:"suite" json:"suite"`               // Debian suite for debootstrap
	Mirror      string   `yaml:"mirror" json:"mirror,omitempty"`   // empty: the builder's mirror
	Apt         []string `yaml:"apt" json:"apt,omitempty"`         // apt-get install --no-install-recommends
	Pip         []string `yaml:"pip" json:"pip,omitempty"`         // pip requirement strings, system-wide
	Files       []File   `yaml:"files" json:"files,omitempty"`     // written after packages
	Run         []string `yaml:"run" json:"run,omitempty"`         // each runs as `/bin/sh -ec` in the chroot, as root, last
	CPU         int      `yaml:"cpu" json:"cpu"`                   // default vCPUs of a sandbox
	MemoryMB    int      `yaml:"memory_mb" json:"memory_mb"`       // default memory of a sandbox
	DiskMB      int      `yaml:"disk_mb" json:"disk_mb,omitempty"` // default disk of a sandbox; 0: the server's
	Warmup      string   `yaml:"warmup" json:"warmup,omitempty"`   // Python run before the template is snapshotted
}

// File is a file the builder writes into the root filesystem.
type File struct {
	Path    string   `yaml:"path" json:"path"` // absolute, inside the rootfs
	Content string   `yaml:"content" json:"content"`
	Mode    FileMode `yaml:"mode" json:"mode"` // default 0644
}

// FileMode is a permission mode. In YAML and JSON it is written in octal like
// chmod's argument ("0755", 755 or 0o755 all mean rwxr-xr-x), because a
// decimal 644 silently meaning 0o1204 is a trap.
type FileMode uint32

func (m FileMode) String() string { return fmt.Sprintf("%04o", uint32(m)) }

func parseMode(s string) (FileMode, error) {
	t := strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "0o"), "0O")
	v, err := strconv.ParseUint(t, 8, 32)
	if err != nil || v > 0o7777 {
		return 0, fmt.Errorf("mode %q is not an octal permission like 0644", s)
	}
	return FileMode(v), nil
}

// UnmarshalYAML reads the scalar's text, not its YAML integer value.
func (m *FileMode) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: mode must be an octal number like 0644", n.Line)
	}
	v, err := parseMode(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	if v == 0 {
		// The zero value stands for "left out" (0644): refuse it rather
		// than write a file meant to be unreadable as readable.
		return fmt.Errorf("line %d: mode %q leaves the file unusable to everyone but root; give the mode you mean, such as 0600 (root only), or leave it out for 0644", n.Line, n.Value)
	}
	*m = v
	return nil
}

func (m FileMode) MarshalJSON() ([]byte, error) { return json.Marshal(m.String()) }

func (m *FileMode) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("mode must be a string like \"0644\": %w", err)
	}
	v, err := parseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Parse decodes one YAML spec, rejects unknown fields, applies the defaults
// and validates the result. Errors are *pandastack.Error with code EInvalid.
func Parse(data []byte) (Spec, error) {
	s, err := decode(data)
	if err != nil {
		return Spec{}, err
	}
	return s.complete()
}

// decode reads the YAML strictly, without defaults or validation.
func decode(data []byte) (Spec, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Spec
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return Spec{}, pandastack.Errorf(pandastack.EInvalid, "template spec is empty")
		}
		return Spec{}, pandastack.Errorf(pandastack.EInvalid, "template spec: %s", yamlMessage(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Spec{}, pandastack.Errorf(pandastack.EInvalid, "template spec: want one YAML document, found more")
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return Spec{}, pandastack.Errorf(pandastack.EInvalid, "template spec: want a mapping of fields (name: …, apt: […]), not a single value")
	}
	m := doc.Content[0].Content
	for i := 0; i+1 < len(m); i += 2 {
		switch k, v := m[i].Value, m[i+1]; k {
		case "cpu", "memory_mb", "disk_mb":
			// yaml.v3 truncates a float into an int field: cpu: 0.5 would
			// become the default 1, disk_mb: 100.7 would be 100.
			if v.Tag != "!!int" {
				return Spec{}, pandastack.Errorf(pandastack.EInvalid, "template spec: line %d: %s %q must be a whole number", v.Line, k, v.Value)
			}
			// 0 would silently mean the default.
			if n, err := strconv.ParseInt(v.Value, 0, 64); err == nil && n == 0 {
				return Spec{}, pandastack.Errorf(pandastack.EInvalid, "template spec: line %d: %s 0 is out of range (leave it out for the default)", v.Line, k)
			}
		}
	}
	return s, nil
}

var (
	unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type template\.(\w+)`)
	wrongType    = regexp.MustCompile("line (\\d+): cannot unmarshal !!(\\w+)(?: `([^`]*)`)? into (\\S+)")
)

// yamlMessage says what yaml.v3's decoding error says in the spec's terms,
// not Go's: "field memory not found in type template.Spec", "cannot
// unmarshal !!str `echo hi` into []string".
func yamlMessage(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: unmarshal errors:\n")
	var lines []string
	for _, l := range strings.Split(msg, "\n") {
		l = strings.TrimSpace(l)
		if m := unknownField.FindStringSubmatch(l); m != nil {
			known := specFields
			if m[3] == "File" {
				known = fileFields
			}
			l = fmt.Sprintf("line %s: unknown field %q (the fields are %s)", m[1], m[2], known)
		} else if m := wrongType.FindStringSubmatch(l); m != nil {
			got := map[string]string{"str": "a string", "int": "a number", "float": "a number", "bool": "true or false", "map": "a mapping", "seq": "a list", "null": "nothing"}[m[2]]
			if got == "" {
				got = "a " + m[2]
			}
			want := m[4]
			switch {
			case strings.HasPrefix(want, "[]"):
				want = "a list (e.g. [a, b], or one - item per line)"
			case want == "int":
				want = "a whole number"
			case want == "string":
				want = "a string"
			case strings.HasPrefix(want, "template."):
				want = "a mapping of fields"
			}
			if m[3] != "" {
				got += fmt.Sprintf(" (%q)", m[3])
			}
			l = fmt.Sprintf("line %s: %s where %s is wanted", m[1], got, want)
		}
		lines = append(lines, l)
	}
	return strings.Join(lines, "; ")
}

// specFields and fileFields name the fields of a spec and of one of its
// files, for the message about an unknown one.
var specFields, fileFields = yamlFields(reflect.TypeOf(Spec{})), yamlFields(reflect.TypeOf(File{}))

func yamlFields(t reflect.Type) string {
	var names []string
	for i := range t.NumField() {
		if n, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); n != "" && n != "-" {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

func (s Spec) complete() (Spec, error) {
	s.applyDefaults()
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}

func (s *Spec) applyDefaults() {
	if s.Suite == "" {
		s.Suite = DefaultSuite
	}
	if s.CPU == 0 {
		s.CPU = DefaultCPU
	}
	if s.MemoryMB == 0 {
		s.MemoryMB = DefaultMemoryMB
	}
	// Copy before filling in modes: the caller's slice may be shared.
	files := make([]File, len(s.Files))
	copy(files, s.Files)
	for i := range files {
		if files[i].Mode == 0 {
			files[i].Mode = DefaultFileMode
		}
	}
	if s.Files != nil {
		s.Files = files
	}
}

var (
	nameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	suiteRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]*$`)
	aptPkgRE = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]*(:[a-z0-9-]+)?([=/][A-Za-z0-9.+:~_-]+)?$`) // name[:arch][=version|/release]
)

// Validate checks the spec as Build would use it (after defaults). Errors are
// *pandastack.Error with code EInvalid and name the offending field.
func (s Spec) Validate() error {
	bad := func(format string, args ...any) error {
		prefix := "template"
		if s.Name != "" {
			prefix = fmt.Sprintf("template %q", s.Name)
		}
		return pandastack.Errorf(pandastack.EInvalid, prefix+": "+format, args...)
	}
	if !nameRE.MatchString(s.Name) {
		return bad("name %q must be 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit", s.Name)
	}
	if s.Suite == "" {
		return bad("suite must not be empty")
	}
	if !suiteRE.MatchString(s.Suite) {
		return bad("suite %q is not a Debian suite name like bookworm", s.Suite)
	}
	if s.Mirror != "" {
		u, err := url.Parse(s.Mirror)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("mirror %q must be an http:// or https:// URL", s.Mirror)
		}
	}
	if s.CPU < 1 || s.CPU > 64 {
		return bad("cpu %d is out of range 1..64", s.CPU)
	}
	if s.MemoryMB < 64 || s.MemoryMB > 65536 {
		return bad("memory_mb %d is out of range 64..65536", s.MemoryMB)
	}
	if s.DiskMB != 0 && (s.DiskMB < 64 || s.DiskMB > 1<<20) {
		return bad("disk_mb %d is out of range 64..1048576 (or leave it out for the server's default)", s.DiskMB)
	}
	for i, p := range s.Apt {
		if !aptPkgRE.MatchString(p) {
			return bad("apt[%d] %q is not a Debian package name", i, p)
		}
	}
	for i, p := range s.Pip {
		// A leading '-' would be read as a pip option.
		if strings.TrimSpace(p) == "" || strings.HasPrefix(strings.TrimSpace(p), "-") {
			return bad("pip[%d] %q is not a requirement like numpy==2.1", i, p)
		}
	}
	seen := map[string]bool{}
	for i, f := range s.Files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return bad("files[%d].path %q must be a clean absolute path", i, f.Path)
		}
		if under(f.Path, "/tmp") || under(f.Path, "/var/tmp") {
			return bad("files[%d].path %q: the build empties /tmp and /var/tmp at its end; put the file elsewhere (a sandbox's /tmp starts empty)", i, f.Path)
		}
		for _, kernel := range []string{"/proc", "/sys", "/dev"} {
			if under(f.Path, kernel) {
				return bad("files[%d].path %q: %s belongs to the kernel, in the build as in a sandbox; a file there never reaches the template", i, f.Path, kernel)
			}
		}
		if seen[f.Path] {
			return bad("files[%d].path %q appears twice", i, f.Path)
		}
		seen[f.Path] = true
		if f.Mode > 0o7777 {
			return bad("files[%d].mode %o is not a permission mode", i, uint32(f.Mode))
		}
	}
	for i, r := range s.Run {
		if strings.TrimSpace(r) == "" {
			return bad("run[%d] is empty", i)
		}
		if len(r) > maxArgBytes {
			return bad("run[%d] has %d bytes, more than one command line carries (%d): put a long script in files (say /usr/local/bin/setup.sh) and run that", i, len(r), maxArgBytes)
		}
	}
	for _, l := range []struct {
		field string
		list  []string
	}{{"apt", s.Apt}, {"pip", s.Pip}} {
		n := 0
		for _, e := range l.list {
			n += len(e) + 1
		}
		if n > maxArgsBytes {
			return bad("%s names %d bytes of packages, more than one command line carries (%d): split them with run steps", l.field, n, maxArgsBytes)
		}
	}
	return nil
}

// maxArgBytes is the longest argument Linux passes to a program
// (MAX_ARG_STRLEN, 128 KiB with its NUL), which each run line is;
// maxArgsBytes a bound on an apt-get or pip command line, well within
// the whole arguments' limit (ARG_MAX, commonly 2 MiB with the environment).
const (
	maxArgBytes  = 128<<10 - 1
	maxArgsBytes = 1 << 20
)

// UserHome is the home of the sandbox user (uid and gid 1000); the files a
// spec puts beneath it are the user's.
const UserHome = "/home/user"

// under reports whether p is dir or lies beneath it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Hash identifies what Build makes of the spec: the sha256 (hex) of the
// spec's canonical JSON (defaults applied, empty fields omitted) and
// BuilderVersion. Any change to the spec changes it.
func (s Spec) Hash() string {
	s.applyDefaults()
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // plain strings and numbers always encode
	}
	h := sha256.New()
	fmt.Fprintf(h, "pandastack-template/%s\n", BuilderVersion)
	h.Write(b)
	if slices.ContainsFunc(s.Files, func(f File) bool { return under(f.Path, UserHome) }) {
		// Since files under the user's home belong to the user: builds
		// made before, with root's files there, are not reused.
		h.Write([]byte("\nhome files owned by the user"))
	}
	return hex.EncodeToString(h.Sum(nil))
}
