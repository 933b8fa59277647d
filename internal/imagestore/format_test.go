package imagestore

import (
	"testing"

	"github.com/pandastack/pandastack"
)

// A manifest from a bucket is input: one naming files outside the image
// (which a download would write there) is refused.
func TestParseManifestRefusesPathsOutside(t *testing.T) {
	for _, name := range []string{"../escape", "/etc/passwd", "a/../../b", `a\..\b`, ""} {
		b := []byte(`{"version":1,"files":{"` + jsonEscape(name) + `":{"size":1,"crc32c":1}}}`)
		if _, err := ParseManifest(b, "x"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Errorf("manifest naming %q: err = %v, want %s", name, err, pandastack.ESnapshotCorrupt)
		}
	}
	for _, bad := range []string{``, `{}`, `{"version":2,"files":{"a":{}}}`, `{"version":1,"files":{}}`, `not json`} {
		if _, err := ParseManifest([]byte(bad), "x"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Errorf("manifest %q: err = %v, want %s", bad, err, pandastack.ESnapshotCorrupt)
		}
	}
	man, err := ParseManifest([]byte(`{"version":1,"template":"base","files":{"a":{"size":3,"crc32c":7},"sub/b":{"size":4,"crc32c":8}}}`), "x")
	if err != nil || man.Template != "base" || man.Size() != 7 {
		t.Errorf("good manifest: %+v, %v", man, err)
	}
}

func jsonEscape(s string) string {
	out := ""
	for _, r := range s {
		if r == '\\' || r == '"' {
			out += `\`
		}
		out += string(r)
	}
	return out
}

func TestValidID(t *testing.T) {
	for _, id := range []string{"snap_abc", "x"} {
		if err := ValidID(id); err != nil {
			t.Errorf("ValidID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", ".tmp-x", "a/b", `a\b`, "..", "a\x00b", string(make([]byte, 129))} {
		if err := ValidID(id); !pandastack.IsCode(err, pandastack.EInvalid) {
			t.Errorf("ValidID(%q) = %v, want %s", id, err, pandastack.EInvalid)
		}
	}
}
