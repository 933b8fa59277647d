// Package streamframe is the binary form of a streamed exec, spoken by the
// API to clients that ask for it (Accept: application/vnd.pandastack.stream)
// and by the agent to the host. Each frame is a type byte, a payload length
// (uint32, big-endian) and the payload:
//
//	1 stdout  raw bytes
//	2 stderr  raw bytes
//	3 exit    JSON: {"exit_code":0,"signal":"","timed_out":false,"duration_ms":12}
//	4 error   JSON: {"error":{"code":"...","message":"..."}}
//
// Output travels as it was written, with no base64 and no JSON escaping:
// the NDJSON form costs a JSON encode and decode of every byte on each leg.
package streamframe

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// MediaType names the format in Accept and Content-Type headers.
const MediaType = "application/vnd.pandastack.stream"

// Frame types.
const (
	Stdout byte = 1
	Stderr byte = 2
	Exit   byte = 3
	Error  byte = 4
)

// HeaderSize is the size of a frame's header: type byte and uint32 length.
const HeaderSize = 5

// MaxPayload bounds one frame's payload; a writer splits larger output.
const MaxPayload = 1 << 20

// ErrBadFrame wraps every malformed frame a Reader meets.
var ErrBadFrame = errors.New("bad stream frame")

// TypeName is the event name of a frame type ("stdout", ...), "" if unknown.
func TypeName(t byte) string {
	switch t {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	case Exit:
		return "exit"
	case Error:
		return "error"
	}
	return ""
}

// TypeOf is the frame type of an event name, 0 if unknown.
func TypeOf(name string) byte {
	switch name {
	case "stdout":
		return Stdout
	case "stderr":
		return Stderr
	case "exit":
		return Exit
	case "error":
		return Error
	}
	return 0
}

// Writer writes frames to an underlying writer.
type Writer struct {
	w   io.Writer
	hdr [HeaderSize]byte
}

// NewWriter returns a Writer on w. It does not buffer: each frame reaches w
// as two writes (header, payload), so callers flush after WriteFrame.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// WriteFrame writes p as frames of type t, split at MaxPayload. An empty p
// writes one empty frame.
func (fw *Writer) WriteFrame(t byte, p []byte) error {
	if TypeName(t) == "" {
		return fmt.Errorf("streamframe: unknown frame type %d", t)
	}
	for {
		n := min(len(p), MaxPayload)
		fw.hdr[0] = t
		binary.BigEndian.PutUint32(fw.hdr[1:], uint32(n))
		if _, err := fw.w.Write(fw.hdr[:]); err != nil {
			return err
		}
		if n > 0 {
			if _, err := fw.w.Write(p[:n]); err != nil {
				return err
			}
		}
		p = p[n:]
		if len(p) == 0 {
			return nil
		}
	}
}

// AppendFrame appends p to dst as frames of type t, split at MaxPayload,
// as WriteFrame would write them: for a writer that sends several frames
// in one write. An empty p appends one empty frame.
func AppendFrame(dst []byte, t byte, p []byte) ([]byte, error) {
	if TypeName(t) == "" {
		return dst, fmt.Errorf("streamframe: unknown frame type %d", t)
	}
	dst = slices.Grow(dst, len(p)+HeaderSize*(1+len(p)/MaxPayload))
	for {
		n := min(len(p), MaxPayload)
		dst = append(dst, t)
		dst = binary.BigEndian.AppendUint32(dst, uint32(n))
		dst = append(dst, p[:n]...)
		p = p[n:]
		if len(p) == 0 {
			return dst, nil
		}
	}
}

// Reader reads frames.
type Reader struct {
	r   *bufio.Reader
	buf []byte
}

// NewReader returns a Reader on r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next frame's type and payload. The payload is valid only
// until the following call. At a clean end between frames it returns io.EOF;
// a stream cut inside a frame, an unknown type or an oversized length give
// an error wrapping ErrBadFrame (and io.ErrUnexpectedEOF for a cut).
func (fr *Reader) Next() (byte, []byte, error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = fmt.Errorf("%w: stream cut inside a frame header: %w", ErrBadFrame, err)
		}
		return 0, nil, err // io.EOF at a frame boundary
	}
	t, n := hdr[0], binary.BigEndian.Uint32(hdr[1:])
	if TypeName(t) == "" {
		return 0, nil, fmt.Errorf("%w: unknown type %d", ErrBadFrame, t)
	}
	if n > MaxPayload {
		return 0, nil, fmt.Errorf("%w: %s frame of %d bytes, more than the %d allowed", ErrBadFrame, TypeName(t), n, MaxPayload)
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	p := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, fmt.Errorf("%w: %s frame cut short: %w", ErrBadFrame, TypeName(t), err)
	}
	return t, p, nil
}
