// Package agentproto is the wire protocol between the host and the in-sandbox
// agent: the epoch framing that carries a yamux session over the sandbox's
// stdin/stdout pipes, and the JSON types of the HTTP/1.1 API spoken on the
// session's streams. Both the host (internal/sandbox) and the agent
// (internal/agent) import it; it imports the standard library, yamux and the
// root package, whose public result types the wire carries as they are.
//
// Why epochs: the pipes outlive a host connection (a server restart, a
// snapshot restore), so bytes of an old session may still sit in them. Every
// frame carries the epoch of the host session that it belongs to. The agent
// starts a fresh session whenever a frame of a new epoch arrives; the host
// drops frames of any epoch but its own. A reader that finds no magic where a
// header should be skips ahead to the next magic, so a half-written frame of a
// dead session cannot wedge the stream.
package agentproto

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"sync"
)

// ProtocolVersion is bumped on any incompatible change to framing or API.
const ProtocolVersion = 1

const (
	frameMagic = 0x50445331 // "PDS1"
	headerSize = 12         // magic, epoch, length: uint32 big-endian each
	// maxFramePayload bounds a frame towards the agent, a frame from an
	// agent the host has not asked for large frames, and any frame a
	// reader takes before it met one of its own session: the padding
	// covers that much.
	maxFramePayload = 64 << 10
	// maxLargeFrame bounds a frame from an agent that the host asked for
	// large frames (AllowLargeFrames): streamed output then crosses the
	// sandbox's stdout in a write per batch instead of one per 64 KiB.
	maxLargeFrame = 1 << 20
)

// ErrStaleSession is returned by writes on a session that a newer epoch replaced.
var ErrStaleSession = errors.New("agentproto: session replaced by a newer epoch")

type frame struct {
	epoch   uint32
	payload []byte
}

// frameReader parses frames, resynchronising on the magic after garbage.
type frameReader struct {
	r   *bufio.Reader
	buf []byte // the last frame's payload, reused
	max uint32 // the largest payload taken; a larger length is garbage
}

func newFrameReader(r io.Reader) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, maxFramePayload+headerSize), max: maxFramePayload}
}

// next returns the next frame; its payload is valid until the next call.
func (fr *frameReader) next() (frame, error) {
	for {
		hdr, err := fr.r.Peek(headerSize)
		if err != nil {
			return frame{}, err
		}
		if binary.BigEndian.Uint32(hdr[0:4]) != frameMagic {
			fr.r.Discard(1) // garbage from a torn frame: slide to the next magic
			continue
		}
		epoch := binary.BigEndian.Uint32(hdr[4:8])
		n := binary.BigEndian.Uint32(hdr[8:12])
		if n > fr.max {
			fr.r.Discard(1)
			continue
		}
		fr.r.Discard(headerSize)
		if uint32(cap(fr.buf)) < n || fr.buf == nil {
			fr.buf = make([]byte, max(n, maxFramePayload))
		}
		p := fr.buf[:n]
		if _, err := io.ReadFull(fr.r, p); err != nil {
			return frame{}, err
		}
		return frame{epoch: epoch, payload: p}, nil
	}
}

// padding is written before the first frame of every new session, in both
// directions. A writer that died mid-frame (a killed server, a checkpoint
// taken during an upload) leaves a header promising bytes that never come;
// the reader would take the new session's first bytes as the rest of that
// frame. A full frame's worth of zeros completes any torn frame (a reader
// takes no frame over maxFramePayload before its own session's first,
// large frames included), and zeros alone never form the magic, so the
// reader then skips them to the next real header.
var padding = make([]byte, headerSize+maxFramePayload)

func (fw *frameWriter) pad() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	_, err := fw.w.Write(padding)
	return err
}

// frameWriter writes frames; safe for concurrent use.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte // one frame, reused
}

// write sends p as frames of epoch; it returns how many bytes of p went out.
func (fw *frameWriter) write(epoch uint32, p []byte) (int, error) {
	return fw.write2(epoch, nil, p, maxFramePayload)
}

// write2 sends a followed by p as frames of epoch of up to limit bytes, as
// if they were one slice; it returns how many bytes of p went out.
func (fw *frameWriter) write2(epoch uint32, a, p []byte, limit int) (int, error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if want := headerSize + min(len(a)+len(p), limit); len(fw.buf) < want {
		fw.buf = make([]byte, max(want, headerSize+maxFramePayload))
	}
	written := 0
	for len(a)+len(p) > 0 {
		n := min(len(a)+len(p), limit)
		buf := fw.buf[:headerSize+n]
		binary.BigEndian.PutUint32(buf[0:4], frameMagic)
		binary.BigEndian.PutUint32(buf[4:8], epoch)
		binary.BigEndian.PutUint32(buf[8:12], uint32(n))
		na := copy(buf[headerSize:], a)
		np := copy(buf[headerSize+na:], p)
		// One write per frame keeps a frame contiguous in the pipe.
		if _, err := fw.w.Write(buf); err != nil {
			return written, err
		}
		a, p = a[na:], p[np:]
		written += np
	}
	return written, nil
}

// HostConn wraps the host's end of the pipes as a byte stream of one epoch:
// writes are framed with epoch, reads return the payloads of that epoch's
// frames only. Closing it closes rwc.
func HostConn(rwc io.ReadWriteCloser, epoch uint32) io.ReadWriteCloser {
	return &hostConn{rwc: rwc, epoch: epoch, fr: newFrameReader(rwc), fw: &frameWriter{w: rwc}}
}

type hostConn struct {
	rwc    io.ReadWriteCloser
	epoch  uint32
	fr     *frameReader
	fw     *frameWriter
	rest   []byte
	padded sync.Once
}

func (c *hostConn) Read(p []byte) (int, error) {
	for len(c.rest) == 0 {
		f, err := c.fr.next()
		if err != nil {
			return 0, err
		}
		if f.epoch == c.epoch {
			c.rest = f.payload // fr's buffer: drained before the next frame
			// Past the padding: from here on the pipe holds whole
			// frames, which may be large if the agent was asked for them.
			c.fr.max = maxLargeFrame
		}
	}
	n := copy(p, c.rest)
	c.rest = c.rest[n:]
	return n, nil
}

func (c *hostConn) Write(p []byte) (int, error) {
	var err error
	c.padded.Do(func() { err = c.fw.pad() })
	if err != nil {
		return 0, err
	}
	return c.fw.write(c.epoch, p)
}
func (c *hostConn) Close() error { return c.rwc.Close() }

// Serve runs the agent's side of the pipes until r fails (EOF when the host
// side is gone for good). For every new epoch it calls onSession in a new
// goroutine with a byte stream of that epoch; the stream of the previous
// epoch is closed first, so its reads return io.EOF and its writes fail.
func Serve(r io.Reader, w io.Writer, onSession func(epoch uint32, conn io.ReadWriteCloser)) error {
	fr := newFrameReader(r)
	fw := &frameWriter{w: w}
	var cur *agentConn
	defer func() {
		if cur != nil {
			cur.Close()
		}
	}()
	for {
		f, err := fr.next()
		if err != nil {
			return err
		}
		if cur == nil || f.epoch != cur.epoch {
			if cur != nil {
				cur.Close()
			}
			if err := fw.pad(); err != nil {
				return err
			}
			pr, pw := io.Pipe()
			cur = &agentConn{epoch: f.epoch, pr: pr, pw: pw, fw: fw, limit: maxFramePayload}
			go onSession(f.epoch, cur)
		}
		if len(f.payload) > 0 {
			// The session's reader (yamux) drains continuously; a pipe
			// closed because the session ended just drops the bytes.
			cur.pw.Write(f.payload)
		}
	}
}

type agentConn struct {
	epoch  uint32
	pr     *io.PipeReader
	pw     *io.PipeWriter
	fw     *frameWriter
	mu     sync.Mutex
	closed bool

	wmu   sync.Mutex // not mu: Close must not wait for a write stuck on a full pipe
	held  []byte     // a yamux data header waiting for its body
	limit int        // the largest frame payload to write; under wmu
}

// AllowLargeFrames lets the agent's side of a session (a stream handed to
// Serve's onSession) write frames of up to 1 MiB, which the host says it
// reads (hosts before it took 64 KiB at most). It reports whether conn is
// such a stream.
func AllowLargeFrames(conn io.ReadWriteCloser) bool {
	c, ok := conn.(*agentConn)
	if ok {
		c.wmu.Lock()
		c.limit = maxLargeFrame
		c.wmu.Unlock()
	}
	return ok
}

func (c *agentConn) Read(p []byte) (int, error) { return c.pr.Read(p) }

// Write frames p. yamux writes each data message as two writes, its header
// and then its body; the header of one that has a body is held back and
// sent in one frame with the body. Every write through the sandbox's pipe
// is a host system call of gVisor's sentry, and streamed output is mostly
// data messages, so this halves them.
func (c *agentConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return 0, ErrStaleSession
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.held == nil && isDataHeader(p) {
		c.held = append(make([]byte, 0, len(p)), p...)
		return len(p), nil
	}
	held := c.held
	c.held = nil
	return c.fw.write2(c.epoch, held, p, c.limit)
}

// isDataHeader reports whether p is exactly the header of a yamux data
// message with a body (version 0, type 0, a non-zero length), which yamux
// follows at once with a write of the body.
func isDataHeader(p []byte) bool {
	const yamuxHeader = 12 // version, type, flags (2), stream id (4), length (4)
	return len(p) == yamuxHeader && p[0] == 0 && p[1] == 0 && binary.BigEndian.Uint32(p[8:12]) > 0
}

func (c *agentConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.pw.Close()
	return c.pr.Close()
}
