package template

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/templates"
)

// Registry holds the known template specs by name.
type Registry struct {
	specs  map[string]Spec
	source map[string]string // name → file it came from, for messages
}

// Load reads the built-in templates (templates/*.yaml, embedded in the
// binary) and then every *.yaml in dirs, in order; a later file with the same
// name replaces an earlier one, so a user's own base.yaml overrides the
// built-in base. A file's name field may be omitted (it defaults to the file
// name without .yaml) but must otherwise match it. A directory that does not
// exist, or any invalid spec, is an error naming the file.
func Load(dirs ...string) (*Registry, error) {
	r := &Registry{specs: map[string]Spec{}, source: map[string]string{}}
	if err := r.addFS(templates.FS, "templates"); err != nil {
		return nil, err
	}
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil {
			return nil, fmt.Errorf("template directory: %w", err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("template directory %s is not a directory", d)
		}
		if err := r.addFS(os.DirFS(d), d); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func (r *Registry) addFS(fsys fs.FS, label string) error {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return fmt.Errorf("list templates in %s: %w", label, err)
	}
	yml, _ := fs.Glob(fsys, "*.yml")
	names = append(names, yml...)
	sort.Strings(names)
	seen := map[string]string{}
	for _, n := range names {
		if strings.HasPrefix(n, ".") {
			continue // an editor's lock or backup file, not a spec
		}
		file := path.Join(label, n)
		fi, err := fs.Stat(fsys, n)
		if err == nil && !fi.Mode().IsRegular() {
			// A FIFO would hang the read (and every listing with it).
			return fmt.Errorf("%s: %w", file, pandastack.Errorf(pandastack.EInvalid, "not a regular file (%s); a template spec is a YAML file", fi.Mode().Type()))
		}
		if err == nil && fi.Size() > maxSpecBytes {
			return fmt.Errorf("%s: %w", file, pandastack.Errorf(pandastack.EInvalid, "a template spec holds at most %d MiB (this one has %d bytes); download large files in a run step instead", maxSpecBytes>>20, fi.Size()))
		}
		data, err := fs.ReadFile(fsys, n)
		if err != nil {
			return fmt.Errorf("read template: %w", err)
		}
		stem := strings.TrimSuffix(strings.TrimSuffix(n, ".yaml"), ".yml")
		if other, ok := seen[stem]; ok {
			return fmt.Errorf("%s: %w", file, pandastack.Errorf(pandastack.EInvalid, "template %s is also in %s: keep one of them", stem, other))
		}
		seen[stem] = file
		s, err := parseNamed(data, stem, n)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		r.specs[s.Name] = s
		r.source[s.Name] = file
	}
	return nil
}

// maxSpecBytes is the largest spec file read.
const maxSpecBytes = 4 << 20

// parseNamed parses a spec from the file called name, stem.yaml or
// stem.yml.
func parseNamed(data []byte, stem, name string) (Spec, error) {
	s, err := decode(data)
	if err != nil {
		return Spec{}, err
	}
	if s.Name == "" {
		s.Name = stem
	}
	if s, err = s.complete(); err != nil {
		return Spec{}, err
	}
	if s.Name != stem {
		return Spec{}, pandastack.Errorf(pandastack.EInvalid, "template name %q does not match its file name %s", s.Name, name)
	}
	return s, nil
}

// Get returns the spec called name, or a *pandastack.Error with code
// ENotFound whose message lists the available templates.
func (r *Registry) Get(name string) (Spec, error) {
	if s, ok := r.specs[name]; ok {
		return s, nil
	}
	return Spec{}, pandastack.Errorf(pandastack.ENotFound, "no template %q; available: %s", name, strings.Join(r.Names(), ", "))
}

// AddNew adds the specs of from whose names r does not have; it returns
// their names. The specs r has stay as they are.
func (r *Registry) AddNew(from *Registry) []string {
	var added []string
	for _, n := range from.Names() {
		if _, ok := r.specs[n]; !ok {
			r.specs[n], r.source[n] = from.specs[n], from.source[n]
			added = append(added, n)
		}
	}
	return added
}

// Names returns the template names, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.specs))
	for n := range r.specs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// List returns every spec, sorted by name.
func (r *Registry) List() []Spec {
	out := make([]Spec, 0, len(r.specs))
	for _, n := range r.Names() {
		out = append(out, r.specs[n])
	}
	return out
}

// Source returns the file a template was read from ("templates/base.yaml" for
// a built-in one), or "" for an unknown name.
func (r *Registry) Source(name string) string { return r.source[name] }
