package template

import (
	"testing"

	"github.com/pandastack/pandastack"
)

// FuzzParseSpec: any YAML given as a template spec either parses into a
// valid spec whose hash is stable, or is refused with invalid_request.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"", "name: x\n", "name: x\ncpu: 0.5\n", "name: x\nsuite: \"\"\nmirror: ftp://x\n",
		"name: data\nsuite: trixie\napt: [python3]\npip: [numpy==2.4.6]\nfiles:\n  - path: /etc/x\n    content: hi\n    mode: \"0755\"\nrun: [\"true\"]\ncpu: 2\nmemory_mb: 1024\n",
		"name: x\n---\nname: y\n", "[1, 2]", "name: &a x\nrun: [*a]\n", "files:\n  - path: ../x\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if !pandastack.IsCode(err, pandastack.EInvalid) {
				t.Fatalf("Parse = %v, want invalid_request", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("Parse accepted a spec that does not validate: %v", err)
		}
		if s.Hash() != s.Hash() {
			t.Fatal("the hash of one spec changes")
		}
	})
}
