package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// stdlibLine is the line encoding/json writes for an event, as the
// NDJSON stream did before appendExecEvent.
func stdlibLine(t testing.TB, ev agentproto.ExecEvent) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(toStreamEvent(ev)); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func checkLine(t testing.TB, ev agentproto.ExecEvent) {
	t.Helper()
	got, ok := appendExecEvent([]byte("kept"), ev)
	if !ok {
		t.Fatalf("%s event not encoded", ev.Type)
	}
	if want := append([]byte("kept"), stdlibLine(t, ev)...); !bytes.Equal(got, want) {
		t.Fatalf("data %q:\n got %s\nwant %s", ev.Data, got, want)
	}
}

// Every line is byte for byte what encoding/json writes: clients parse
// the same JSON as before.
func TestAppendExecEventMatchesEncodingJSON(t *testing.T) {
	cases := []string{
		"", "y\n", "plain text", `quote " and backslash \ here`, "\b\f\n\r\t\x00\x01\x1f\x7f",
		"<html> & </html>", "héllo wörld ✓ 𝄞", "\u2028\u2029 separators", "\xff\xfe bad \xc3 utf8 \xe2\x82",
		"\xed\xa0\x80 surrogate", "ends in a partial rune \xe2\x82",
	}
	for _, c := range cases {
		for _, typ := range []string{"stdout", "stderr"} {
			checkLine(t, agentproto.ExecEvent{Type: typ, Data: []byte(c)})
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(64))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		checkLine(t, agentproto.ExecEvent{Type: "stdout", Data: b})
	}
	for _, typ := range []string{"exit", "error"} {
		if _, ok := appendExecEvent(nil, agentproto.ExecEvent{Type: typ}); ok {
			t.Errorf("%s event: encoded by the fast path, want encoding/json's", typ)
		}
	}
}

func FuzzAppendExecEvent(f *testing.F) {
	f.Add([]byte("y\n"))
	f.Add([]byte("\xff\u2028\"\\\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkLine(t, agentproto.ExecEvent{Type: "stdout", Data: data})
	})
}

func BenchmarkNDJSONOutput(b *testing.B) {
	data := bytes.Repeat([]byte("y\n"), 128<<10)
	ev := agentproto.ExecEvent{Type: "stdout", Data: data}
	b.Run("appendExecEvent", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		var buf []byte
		for b.Loop() {
			buf, _ = appendExecEvent(buf[:0], ev)
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		var w bytes.Buffer
		enc := json.NewEncoder(&w)
		enc.SetEscapeHTML(false)
		for b.Loop() {
			w.Reset()
			enc.Encode(toStreamEvent(ev))
		}
	})
}

// A UTF-8 character split between two output events of a stream arrives
// whole; one the output never finishes arrives as U+FFFD (one per byte, as
// encoding/json writes it) before the exit.
func TestNDJSONKeepsSplitCharacters(t *testing.T) {
	text := map[string]string{"stdout": "aé🐼b" + strings.Repeat("€", 50), "stderr": "ñ🐼"}
	rec := httptest.NewRecorder()
	nd := newNDJSON(rec)
	// Each stream in pieces of 1 to 4 bytes, interleaved.
	pos := map[string]int{}
	for step := 0; pos["stdout"] < len(text["stdout"]) || pos["stderr"] < len(text["stderr"]); step++ {
		for _, s := range []string{"stdout", "stderr"} {
			i, n := pos[s], 1+step%4
			if i >= len(text[s]) {
				continue
			}
			j := min(i+n, len(text[s]))
			if err := nd.sendExec(agentproto.ExecEvent{Type: s, Data: []byte(text[s][i:j])}); err != nil {
				t.Fatal(err)
			}
			pos[s] = j
		}
	}
	nd.sendExec(agentproto.ExecEvent{Type: "stdout", Data: []byte("end\xf0\x9f")}) // cut short
	nd.sendExec(agentproto.ExecEvent{Type: "exit"})
	got := map[string]string{}
	var last string
	for _, line := range strings.Split(strings.TrimSpace(rec.Body.String()), "\n") {
		var ev streamEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		got[ev.Type] += ev.Data
		last = ev.Type
	}
	if want := text["stdout"] + "end\uFFFD\uFFFD"; got["stdout"] != want {
		t.Errorf("stdout %q, want %q", got["stdout"], want)
	}
	if got["stderr"] != text["stderr"] {
		t.Errorf("stderr %q, want %q", got["stderr"], text["stderr"])
	}
	if last != "exit" {
		t.Errorf("the last event is %s", last)
	}
}
