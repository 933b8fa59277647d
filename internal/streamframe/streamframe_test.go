package streamframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	big := make([]byte, MaxPayload*2+7)
	for i := range big {
		big[i] = byte(i * 7)
	}
	frames := []struct {
		t byte
		p []byte
	}{{Stdout, []byte("hello\n")}, {Stderr, []byte{0, 0xff, '\n', '"'}}, {Stdout, nil}, {Stdout, big}, {Exit, []byte(`{"exit_code":3}`)}}
	for _, f := range frames {
		if err := w.WriteFrame(f.t, f.p); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&buf)
	var got [][2]any
	var out bytes.Buffer
	for i := 0; ; i++ {
		typ, p, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(p) > MaxPayload {
			t.Fatalf("frame of %d bytes", len(p))
		}
		if i >= 3 && typ == Stdout { // big, split at MaxPayload
			out.Write(p)
			continue
		}
		got = append(got, [2]any{typ, string(p)})
	}
	if len(got) != 4 || got[0] != [2]any{Stdout, "hello\n"} || got[1] != [2]any{Stderr, "\x00\xff\n\""} || got[2] != [2]any{Stdout, ""} || got[3] != [2]any{Exit, `{"exit_code":3}`} {
		t.Fatalf("frames: %q", got)
	}
	if !bytes.Equal(out.Bytes(), big) {
		t.Fatalf("big payload: got %d bytes, want %d", out.Len(), len(big))
	}
}

func frame(t byte, n uint32, payload string) []byte {
	b := []byte{t, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], n)
	return append(b, payload...)
}

func TestBadFrames(t *testing.T) {
	for _, c := range []struct {
		name, want string
		in         []byte
	}{
		{"unknown type", "unknown type 9", frame(9, 1, "x")},
		{"zero type", "unknown type 0", frame(0, 0, "")},
		{"too long", "more than the", frame(Stdout, MaxPayload+1, "")},
		{"cut payload", "stdout frame cut short", frame(Stdout, 10, "abc")},
		{"cut header", "cut inside a frame header", []byte{Stdout, 0, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := NewReader(bytes.NewReader(c.in)).Next()
			if !errors.Is(err, ErrBadFrame) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrBadFrame with %q", err, c.want)
			}
		})
	}
	if _, _, err := NewReader(bytes.NewReader(nil)).Next(); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
	if err := NewWriter(io.Discard).WriteFrame(7, nil); err == nil {
		t.Fatal("writing an unknown type succeeded")
	}
}

// TestRandomBytes feeds random garbage and random cuts of a valid stream:
// the reader must end with an error, never panic or loop.
func TestRandomBytes(t *testing.T) {
	var valid bytes.Buffer
	w := NewWriter(&valid)
	w.WriteFrame(Stdout, []byte("some output"))
	w.WriteFrame(Stderr, []byte("err"))
	w.WriteFrame(Exit, []byte(`{"exit_code":0}`))
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		var in []byte
		if i%2 == 0 {
			in = make([]byte, rng.IntN(64))
			for j := range in {
				in[j] = byte(rng.IntN(256))
			}
		} else {
			in = bytes.Clone(valid.Bytes()[:rng.IntN(valid.Len())])
			if len(in) > 0 && rng.IntN(2) == 0 {
				in[rng.IntN(len(in))] ^= byte(1 + rng.IntN(255))
			}
		}
		r := NewReader(bytes.NewReader(in))
		for n := 0; ; n++ {
			typ, p, err := r.Next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrBadFrame) {
					t.Fatalf("input %x: error %v is neither EOF nor ErrBadFrame", in, err)
				}
				break
			}
			if TypeName(typ) == "" || len(p) > MaxPayload || n > len(in) {
				t.Fatalf("input %x: frame %d type %d len %d", in, n, typ, len(p))
			}
		}
	}
}

func FuzzReader(f *testing.F) {
	f.Add(frame(Stdout, 3, "abc"))
	f.Add(frame(Exit, 2, "{}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in))
		for {
			_, p, err := r.Next()
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrBadFrame) {
					t.Fatalf("error %v is neither EOF nor ErrBadFrame", err)
				}
				return
			}
			if len(p) > MaxPayload {
				t.Fatal("oversized payload")
			}
		}
	})
}

// AppendFrame gives the very bytes WriteFrame writes, big payloads split
// at MaxPayload and empty ones as one empty frame, after what dst held.
func TestAppendFrameMatchesWriteFrame(t *testing.T) {
	big := make([]byte, MaxPayload*2+7)
	for i := range big {
		big[i] = byte(i * 13)
	}
	frames := []struct {
		t byte
		p []byte
	}{{Stdout, []byte("hello\n")}, {Stderr, []byte{0, 0xff}}, {Stdout, nil}, {Stdout, big}, {Exit, []byte(`{"exit_code":0}`)}}
	var want bytes.Buffer
	w := NewWriter(&want)
	got := []byte("kept")
	for _, f := range frames {
		if err := w.WriteFrame(f.t, f.p); err != nil {
			t.Fatal(err)
		}
		var err error
		if got, err = AppendFrame(got, f.t, f.p); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, append([]byte("kept"), want.Bytes()...)) {
		t.Fatalf("AppendFrame gave %d bytes, WriteFrame %d (+4 kept)", len(got), want.Len())
	}
	if out, err := AppendFrame([]byte("x"), 9, []byte("y")); err == nil || string(out) != "x" {
		t.Fatalf("unknown type: %q, %v; want an error and dst unchanged", out, err)
	}
}
