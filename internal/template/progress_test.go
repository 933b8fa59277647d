package template

import (
	"strings"
	"testing"
	"time"
)

func TestProgressLines(t *testing.T) {
	var out strings.Builder
	p := newProgress(&out)
	p.total = 2
	p.begin("quick")
	p.end("done in 0.1s (rootfs 1 MB)")
	p.begin("slow")
	p.heartbeat(5*time.Second, ", rootfs 2 MB")
	p.end("done in 7.0s (rootfs 3 MB)")
	want := "[1/2] quick … done in 0.1s (rootfs 1 MB)\n" +
		"[2/2] slow …\n" +
		"      … still running after 5.0s, rootfs 2 MB\n" +
		"[2/2] slow … done in 7.0s (rootfs 3 MB)\n"
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 40}
	for i := range 100 {
		tb.Write([]byte(strings.Repeat("x", i%3) + "line\n"))
	}
	got := tb.lastLines(3)
	if got != "xline\nxxline\nline" {
		t.Errorf("lastLines = %q", got)
	}
}

func TestShorten(t *testing.T) {
	for in, want := range map[string]string{
		"echo hi":              "echo hi",
		"a\nb":                 "a...",
		strings.Repeat("y", 9): "yyyyyyyy...",
	} {
		if got := shorten(in, 8); got != want {
			t.Errorf("shorten(%q) = %q, want %q", in, got, want)
		}
	}
}
