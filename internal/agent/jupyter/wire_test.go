package jupyter

import (
	"errors"
	"strings"
	"testing"
)

func TestSignedRoundTrip(t *testing.T) {
	s := &signer{key: newKey(), session: newUUID()}
	frames, id, err := s.encode("execute_request", map[string]string{"code": "1+1"})
	if err != nil {
		t.Fatal(err)
	}
	// As a kernel's reply would arrive: an identity or topic, then ours.
	in := append([][]byte{[]byte("kernel.topic")}, frames...)
	m, err := s.decode(in)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.MsgID != id || m.Header.MsgType != "execute_request" || m.Header.Version != "5.3" || m.Header.Session != s.session {
		t.Errorf("header %+v", m.Header)
	}
	if string(m.Content) != `{"code":"1+1"}` {
		t.Errorf("content %s", m.Content)
	}

	tampered := append([][]byte{}, in...)
	tampered[len(tampered)-1] = []byte(`{"code":"evil"}`)
	if _, err := s.decode(tampered); !errors.Is(err, errBadSignature) {
		t.Errorf("tampered content: %v", err)
	}
	other := &signer{key: newKey()}
	if _, err := other.decode(in); !errors.Is(err, errBadSignature) {
		t.Errorf("other key: %v", err)
	}
	if _, err := s.decode(in[:4]); err == nil {
		t.Error("short message accepted")
	}
}

func TestUUID(t *testing.T) {
	u := newUUID()
	if len(u) != 36 || u[14] != '4' || strings.Count(u, "-") != 4 || u == newUUID() {
		t.Errorf("uuid %q", u)
	}
}

func TestStripANSI(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                                      "plain",
		"\x1b[0;31mValueError\x1b[0m: boom":          "ValueError: boom",
		"\x1b[1;32m----> 3\x1b[39m explode()":        "----> 3 explode()",
		"\x1b]8;;file:///x.py\x1b\\x.py\x1b]8;;\x07": "x.py",
		"a\x1b(Bb\x1b":                               "ab",
	} {
		if got := stripANSI(in); got != want {
			t.Errorf("stripANSI(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCapped(t *testing.T) {
	c := capped{limit: 10}
	if kept, tr := c.write("12345"); kept != "12345" || tr {
		t.Fatal(kept, tr)
	}
	if kept, tr := c.write("6789abc"); kept != "6789a" || !tr {
		t.Fatal(kept, tr)
	}
	if kept, tr := c.write("more"); kept != "" || tr {
		t.Fatal(kept, tr)
	}
	if got := c.String(); got != "123456789a\n[output truncated: 6 bytes omitted]\n" {
		t.Errorf("%q", got)
	}
	u := capped{limit: 3}
	if kept, _ := u.write("éé"); kept != "é" {
		t.Errorf("cut inside a rune: %q", kept)
	}
}
