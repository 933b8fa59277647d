package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/streamframe"
)

// execAnswer is the answer to an exec whose command started: the events
// go out through send, a batch at a time; ctx ends when the host is gone
// (it closed the stream, cancelled, or the session ended); end finishes it.
type execAnswer struct {
	send func(evs ...agentproto.ExecEvent) error
	ctx  context.Context
	end  func()
}

// startAnswer writes the status and headers of an exec's answer: binary
// frames (streamframe) when the host asks for them, else NDJSON. It
// returns an error if the host is already gone.
//
// Frames go straight onto the stream, outside HTTP's chunked encoding:
// the answer says Connection: close and ends with the stream, which the
// host's HTTP client reads to its end. Through the chunked writer every
// event would cross the channel as three yamux messages (a piece the
// writer's 4 KiB buffer holds, the rest, the chunk's CRLF at the flush),
// each a write of its own onto the sandbox's stdout; raw, a batch of
// events is one write.
func startAnswer(w http.ResponseWriter, r *http.Request) (*execAnswer, error) {
	if wantsFrames(r) {
		if conn, brw, err := http.NewResponseController(w).Hijack(); err == nil {
			return rawFrames(r.Context(), conn, brw)
		}
		// A writer that cannot hand over its connection (HTTP/2, a
		// recorder in tests): frames in the chunked body.
	}
	rc := http.NewResponseController(w)
	encode := eventEncoder(w, r)
	w.WriteHeader(http.StatusOK)
	a := &execAnswer{ctx: r.Context(), end: func() {}}
	a.send = func(evs ...agentproto.ExecEvent) error {
		for _, ev := range evs {
			if err := encode(ev); err != nil {
				return err
			}
		}
		return rc.Flush()
	}
	return a, rc.Flush()
}

// wantsFrames reports whether the host asked for binary frames.
func wantsFrames(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), streamframe.MediaType)
}

// rawFrames answers in frames on conn, taken over from the HTTP server.
func rawFrames(parent context.Context, conn net.Conn, brw *bufio.ReadWriter) (*execAnswer, error) {
	ctx, cancel := context.WithCancel(parent)
	// The host sends nothing after its request: a read ends when it
	// closes the stream (it went away, or cancelled) or the session ends.
	go func() {
		io.Copy(io.Discard, brw.Reader)
		cancel()
	}()
	a := &execAnswer{ctx: ctx, end: func() {
		conn.Close()
		cancel()
	}}
	var buf []byte
	a.send = func(evs ...agentproto.ExecEvent) error {
		buf = buf[:0]
		for _, ev := range evs {
			var err error
			if buf, err = appendEventFrame(buf, ev); err != nil {
				return err
			}
		}
		_, err := conn.Write(buf)
		return err
	}
	_, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: "+streamframe.MediaType+"\r\nConnection: close\r\n\r\n")
	return a, err
}

// appendEventFrame appends ev to buf as frames.
func appendEventFrame(buf []byte, ev agentproto.ExecEvent) ([]byte, error) {
	if ev.Type != "exit" {
		return streamframe.AppendFrame(buf, streamframe.TypeOf(ev.Type), ev.Data)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return buf, err
	}
	return streamframe.AppendFrame(buf, streamframe.Exit, b)
}

// eventEncoder sets the answer's Content-Type and returns how to write one
// event in the chunked body: frames when the host asks for them, else
// NDJSON.
func eventEncoder(w http.ResponseWriter, r *http.Request) func(agentproto.ExecEvent) error {
	if wantsFrames(r) {
		w.Header().Set("Content-Type", streamframe.MediaType)
		var buf []byte
		return func(ev agentproto.ExecEvent) error {
			var err error
			if buf, err = appendEventFrame(buf[:0], ev); err != nil {
				return err
			}
			_, err = w.Write(buf)
			return err
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	return func(ev agentproto.ExecEvent) error { return enc.Encode(ev) }
}
