package metajson

import (
	"testing"

	"github.com/pandastack/pandastack"
)

func TestRoundTrip(t *testing.T) {
	for _, md := range []map[string]string{nil, {}, {"a.b": `q"'%`, "": "", "日本": "x"}} {
		enc, err := Encode(md)
		if err != nil {
			t.Fatalf("Encode(%q): %v", md, err)
		}
		got, err := Decode([]byte(enc))
		if err != nil || got == nil || len(got) != len(md) {
			t.Fatalf("Decode(%s) = %q, %v", enc, got, err)
		}
		for k, v := range md {
			if got[k] != v {
				t.Errorf("%q: got %q, want %q", k, got[k], v)
			}
		}
	}
	if enc, _ := Encode(nil); enc != "{}" {
		t.Errorf("Encode(nil) = %s, want {}", enc)
	}
}

func TestRefusesUnstorableText(t *testing.T) {
	for _, md := range []map[string]string{{"k": "a\x00b"}, {"\x00": "v"}, {"k": "\xff"}} {
		if _, err := Encode(md); !pandastack.IsCode(err, pandastack.EInvalid) {
			t.Errorf("Encode(%q): err = %v, want %s", md, err, pandastack.EInvalid)
		}
	}
	if _, err := Decode([]byte(`["not", "an object"]`)); err == nil {
		t.Error("Decode of a JSON array succeeded")
	}
}
