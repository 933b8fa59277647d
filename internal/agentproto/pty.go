package agentproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Terminals: an interactive shell on a pseudo-terminal in the sandbox.
//
//	GET /v1/pty?cols=C&rows=R[&cwd=D]  with "Connection: Upgrade" and
//	                                   "Upgrade: pandastack-pty" → 101, then PTY frames both ways
//
// After the 101 the stream carries PTY frames in both directions until the
// shell exits (the agent sends one PTYExit frame and closes) or the host
// closes the stream (the agent kills the shell and everything it started).

// PTYUpgrade is the Upgrade token of the terminal endpoint.
const PTYUpgrade = "pandastack-pty"

// PTY frame types.
const (
	PTYData   byte = 'd' // terminal bytes: keystrokes to the shell, or its output
	PTYResize byte = 'r' // host → agent: 4 bytes, columns then rows, uint16 big-endian
	PTYExit   byte = 'x' // agent → host: 4 bytes, the shell's exit status as int32 (-1: killed by a signal)
)

// maxPTYFrame bounds one frame's payload, so a corrupt length cannot make
// the reader allocate without end.
const maxPTYFrame = 1 << 20

// WritePTYFrame writes one frame: its type, its payload's length (uint32
// big-endian) and the payload. Callers that write from several goroutines
// hold a lock around it.
func WritePTYFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > maxPTYFrame {
		return fmt.Errorf("pty frame of %d bytes is over %d", len(payload), maxPTYFrame)
	}
	b := make([]byte, 5+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:5], uint32(len(payload)))
	copy(b[5:], payload)
	_, err := w.Write(b)
	return err
}

// ReadPTYFrame reads one frame.
func ReadPTYFrame(r io.Reader) (typ byte, payload []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:5])
	if n > maxPTYFrame {
		return 0, nil, errors.New("pty frame too large: the stream is corrupt")
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return hdr[0], payload, nil
}

// ResizePayload encodes a terminal size for a PTYResize frame.
func ResizePayload(cols, rows uint16) []byte {
	var b [4]byte
	binary.BigEndian.PutUint16(b[0:2], cols)
	binary.BigEndian.PutUint16(b[2:4], rows)
	return b[:]
}

// ParseResize decodes a PTYResize payload.
func ParseResize(p []byte) (cols, rows uint16, err error) {
	if len(p) != 4 {
		return 0, 0, fmt.Errorf("resize frame of %d bytes, want 4", len(p))
	}
	return binary.BigEndian.Uint16(p[0:2]), binary.BigEndian.Uint16(p[2:4]), nil
}

// ExitPayload encodes an exit status for a PTYExit frame.
func ExitPayload(code int) []byte {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(int32(code)))
	return b[:]
}

// ParseExit decodes a PTYExit payload.
func ParseExit(p []byte) (int, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("exit frame of %d bytes, want 4", len(p))
	}
	return int(int32(binary.BigEndian.Uint32(p))), nil
}
