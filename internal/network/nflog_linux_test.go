package network

import (
	"testing"

	"github.com/pandastack/pandastack/internal/testutil"
)

// Two servers whose instance ids pick the same NFLOG group get different
// ones: the second binds the next free group.
func TestNFLOGGroupsDoNotCollide(t *testing.T) {
	testutil.RequireRoot(t)
	a, err := openNFLOG("zz9")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := openNFLOG("zz9")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.group == b.group || a.group < nflogGroupBase || b.group < nflogGroupBase {
		t.Errorf("groups %d and %d, want two distinct ones from %d", a.group, b.group, nflogGroupBase)
	}
}

func TestParseNFLOG(t *testing.T) {
	// NFULA_MARK (2) = 2, NFULA_PAYLOAD (9) = an IPv4/TCP header 10.0.0.2 → 192.0.2.7:8080.
	ip := []byte{0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 2, 192, 0, 2, 7, 0x9c, 0x40, 0x1f, 0x90}
	attr := func(typ uint16, data []byte) []byte {
		l := 4 + len(data)
		b := append([]byte{byte(l), byte(l >> 8), byte(typ), byte(typ >> 8)}, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	msg := append(attr(nfulaMark, []byte{0, 0, 0, 2}), attr(nfulaPayload, ip)...)
	p, ok := parseNFLOG(msg)
	if !ok || p.mark != refusedPolicy || p.proto != 6 || p.src.String() != "10.0.0.2" || p.dst.String() != "192.0.2.7" || p.dport != 8080 {
		t.Errorf("parsed %+v %v", p, ok)
	}
	if _, ok := parseNFLOG(attr(nfulaPayload, ip[:12])); ok {
		t.Error("a truncated IPv4 header parsed")
	}
}
