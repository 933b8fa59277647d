package client

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/streamframe"
)

func frames(t *testing.T, fs ...any) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	w := streamframe.NewWriter(&b)
	for i := 0; i < len(fs); i += 2 {
		if err := w.WriteFrame(fs[i].(byte), []byte(fs[i+1].(string))); err != nil {
			t.Fatal(err)
		}
	}
	return &b
}

func TestReadFrames(t *testing.T) {
	var out, errb bytes.Buffer
	res, err := readFrames(frames(t, streamframe.Stdout, "a\x00b", streamframe.Stderr, "e", streamframe.Stdout, "c",
		streamframe.Exit, `{"exit_code":2,"timed_out":true,"duration_ms":5}`), &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "a\x00bc" || errb.String() != "e" || res.ExitCode != 2 || !res.TimedOut || res.DurationMS != 5 {
		t.Fatalf("out %q err %q res %+v", out.String(), errb.String(), res)
	}
	// nil writers discard.
	if _, err := readFrames(frames(t, streamframe.Stdout, "x", streamframe.Exit, `{}`), nil, nil); err != nil {
		t.Fatal(err)
	}
}

func TestReadFramesFailures(t *testing.T) {
	for _, c := range []struct {
		name string
		in   *bytes.Buffer
		want string
	}{
		{"error frame", frames(t, streamframe.Stdout, "x", streamframe.Error, `{"error":{"code":"unavailable","message":"sandbox stopped"}}`), "unavailable: sandbox stopped"},
		{"no exit", frames(t, streamframe.Stdout, "x"), "ended without an exit frame"},
		{"bad exit", frames(t, streamframe.Exit, `{`), "bad exit frame"},
		{"bad error", frames(t, streamframe.Error, `{}`), "bad error frame"},
		{"garbage", bytes.NewBufferString("\x09\x00\x00\x00\x01x"), "unknown type 9"},
		{"cut", bytes.NewBufferString("\x01\x00\x00\x00\x09abc"), "cut short"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := readFrames(c.in, nil, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	_, err := readFrames(frames(t, streamframe.Error, `{"error":{"code":"timeout","message":"m"}}`), nil, nil)
	if !IsCode(err, "timeout") {
		t.Fatalf("error frame is not an *Error: %v", err)
	}
	_, err = readFrames(frames(t, streamframe.Stderr, "x"), nil, failing{})
	if !errors.Is(err, errFull) {
		t.Fatalf("writer error lost: %v", err)
	}
}

var errFull = errors.New("full")

type failing struct{}

func (failing) Write([]byte) (int, error) { return 0, errFull }
