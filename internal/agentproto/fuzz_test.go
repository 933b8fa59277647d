package agentproto

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"path"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
)

// FuzzFrames feeds the frame reader whatever a dead or hostile writer may
// have left in the pipe (garbage), then what a new session writes: the
// padding and one frame's worth of real data. The reader must never
// panic, never return a frame over the limit, and always find the new
// session's data intact after the garbage.
func FuzzFrames(f *testing.F) {
	torn := make([]byte, headerSize+3)
	binary.BigEndian.PutUint32(torn[0:4], frameMagic)
	binary.BigEndian.PutUint32(torn[4:8], 3)
	binary.BigEndian.PutUint32(torn[8:12], 5000)
	var whole bytes.Buffer
	(&frameWriter{w: &whole}).write(9, []byte("an old session's frame"))
	f.Add([]byte{}, []byte("hello"), uint32(7))
	f.Add(torn, []byte("after a torn frame"), uint32(7))
	f.Add(whole.Bytes(), []byte{}, uint32(9))
	f.Add([]byte("PDS1PDS1PDS1\xff\xff\xff\xff"), bytes.Repeat([]byte("x"), maxFramePayload+10), uint32(1))
	f.Fuzz(func(t *testing.T, garbage, payload []byte, epoch uint32) {
		fr := newFrameReader(bytes.NewReader(garbage))
		for {
			fm, err := fr.next()
			if err != nil {
				break
			}
			if len(fm.payload) > maxFramePayload {
				t.Fatalf("a frame of %d bytes, over the %d limit", len(fm.payload), maxFramePayload)
			}
		}

		var pipe bytes.Buffer
		pipe.Write(garbage)
		fw := &frameWriter{w: &pipe}
		if err := fw.pad(); err != nil {
			t.Fatal(err)
		}
		if _, err := fw.write(epoch, payload); err != nil {
			t.Fatal(err)
		}
		var frames []frame
		fr = newFrameReader(&pipe)
		for {
			fm, err := fr.next()
			if err != nil {
				break
			}
			fm.payload = bytes.Clone(fm.payload) // valid until the next call
			frames = append(frames, fm)
		}
		n := (len(payload) + maxFramePayload - 1) / maxFramePayload
		if len(frames) < n {
			t.Fatalf("read %d frames, want at least the session's %d", len(frames), n)
		}
		var got []byte
		for _, fm := range frames[len(frames)-n:] {
			if fm.epoch != epoch {
				t.Fatalf("the session's frame came back with epoch %d, want %d", fm.epoch, epoch)
			}
			got = append(got, fm.payload...)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("the session's data came back as %d bytes, want %d", len(got), len(payload))
		}
	})
}

// FuzzCheckPath: whatever a client sends as a path, CheckPath either
// refuses it with invalid_request or it is a path the file API can use:
// no NUL, at most MaxPathLen bytes, no component over MaxNameLen; and
// Under never counts a sibling ("/procx") as beneath a directory.
func FuzzCheckPath(f *testing.F) {
	for _, s := range []string{"", "/", "a", "/home/user/data.csv", "../../etc/passwd", "/proc/self/mem", "/procx/y", "a\x00b", strings.Repeat("a/", 3000), strings.Repeat("x", 256), "/.pandastack/agent"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := CheckPath(p)
		if err != nil {
			if !pandastack.IsCode(err, pandastack.EInvalid) {
				t.Fatalf("CheckPath(%q) = %v, want invalid_request", p, err)
			}
			return
		}
		if p == "" || len(p) > MaxPathLen || strings.IndexByte(p, 0) >= 0 {
			t.Fatalf("CheckPath accepted %q", p)
		}
		for _, c := range strings.Split(p, "/") {
			if len(c) > MaxNameLen {
				t.Fatalf("CheckPath accepted a %d-byte component", len(c))
			}
		}
		clean := path.Clean("/" + p)
		for _, d := range PseudoFS {
			under := Under(clean, d)
			if under != (clean == d || strings.HasPrefix(clean, d+"/")) {
				t.Fatalf("Under(%q, %q) = %v", clean, d, under)
			}
		}
	})
}

// FuzzCheckEnv: accepted variables can be passed to a process as they are.
func FuzzCheckEnv(f *testing.F) {
	f.Add("PATH", "/bin")
	f.Add("1X", "y")
	f.Add("A", "x\x00y")
	f.Add("A=B", "c")
	f.Fuzz(func(t *testing.T, k, v string) {
		err := CheckEnv(map[string]string{k: v})
		if err != nil {
			if !pandastack.IsCode(err, pandastack.EInvalid) {
				t.Fatalf("CheckEnv = %v, want invalid_request", err)
			}
			return
		}
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 || len(v) > MaxEnvValueLen || (k[0] >= '0' && k[0] <= '9') {
			t.Fatalf("CheckEnv accepted %q=%q", k, v)
		}
	})
}

// An environment over MaxEnvTotal in all is refused, each variable within
// its own limits; one just under it passes.
func TestCheckEnvTotal(t *testing.T) {
	big := map[string]string{}
	for i := range 40 {
		big[fmt.Sprintf("E%d", i)] = strings.Repeat("v", 30000)
	}
	if err := CheckEnv(big); !pandastack.IsCode(err, pandastack.EInvalid) || !strings.Contains(err.Error(), "in all") {
		t.Errorf("1.2 MB of env: %v, want invalid_request saying in all", err)
	}
	delete(big, "E0")
	for i := 1; i < 7; i++ {
		delete(big, fmt.Sprintf("E%d", i))
	}
	if err := CheckEnv(big); err != nil {
		t.Errorf("under 1 MiB of env: %v", err)
	}
}
