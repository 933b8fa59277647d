package agentproto

import (
	"bytes"
	"io"
	"testing"
)

func TestPTYFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePTYFrame(&buf, PTYData, []byte("echo hi\r")); err != nil {
		t.Fatal(err)
	}
	WritePTYFrame(&buf, PTYResize, ResizePayload(120, 40))
	WritePTYFrame(&buf, PTYExit, ExitPayload(-1))
	WritePTYFrame(&buf, PTYData, nil)

	typ, p, err := ReadPTYFrame(&buf)
	if err != nil || typ != PTYData || string(p) != "echo hi\r" {
		t.Fatalf("data frame = %q %q %v", typ, p, err)
	}
	typ, p, _ = ReadPTYFrame(&buf)
	cols, rows, err := ParseResize(p)
	if typ != PTYResize || err != nil || cols != 120 || rows != 40 {
		t.Fatalf("resize frame = %q %d×%d %v", typ, cols, rows, err)
	}
	typ, p, _ = ReadPTYFrame(&buf)
	if code, err := ParseExit(p); typ != PTYExit || err != nil || code != -1 {
		t.Fatalf("exit frame = %q %d %v", typ, code, err)
	}
	if typ, p, err = ReadPTYFrame(&buf); err != nil || typ != PTYData || len(p) != 0 {
		t.Fatalf("empty frame = %q %q %v", typ, p, err)
	}
	if _, _, err := ReadPTYFrame(&buf); err != io.EOF {
		t.Fatalf("at the end: %v, want EOF", err)
	}
}

func TestPTYFrameBadInput(t *testing.T) {
	// A length over the limit is refused before any allocation.
	if _, _, err := ReadPTYFrame(bytes.NewReader([]byte{'d', 0xff, 0xff, 0xff, 0xff})); err == nil {
		t.Error("a 4 GiB frame was accepted")
	}
	// A torn frame is an unexpected EOF, not a short payload.
	if _, _, err := ReadPTYFrame(bytes.NewReader([]byte{'d', 0, 0, 0, 5, 'a'})); err != io.ErrUnexpectedEOF {
		t.Errorf("torn frame: %v, want unexpected EOF", err)
	}
	if _, _, err := ParseResize([]byte{1, 2, 3}); err == nil {
		t.Error("a 3-byte resize was accepted")
	}
	if err := WritePTYFrame(io.Discard, PTYData, make([]byte, maxPTYFrame+1)); err == nil {
		t.Error("an oversized frame was written")
	}
}
