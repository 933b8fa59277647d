package main

// The state package's per-type timing and its reads of single bytes, and
// the edits and added files that make a checkpoint's encode and a
// restore's decode of the kernel's state skip the first and read the
// second from a buffer (see the package doc).
const (
	statsFile          = "pkg/state/stats.go"
	statsTestFile      = "pkg/state/pandastack_stats_test.go"
	wireFile           = "pkg/state/wire/wire.go"
	wireByteFile       = "pkg/state/wire/pandastack_bytes.go"
	wireTestFile       = "pkg/state/wire/pandastack_bytes_test.go"
	compressioByteFile = "pkg/compressio/pandastack_bytes.go"
	compressioTestFile = "pkg/compressio/pandastack_bytes_test.go"
)

// statsEdits make a Stats collect only when the log is at debug level, the
// only level at which runsc prints it on a checkpoint or a restore
// (kernelEdits); its String no longer divides by a count of zero, which an
// extraction of the rootfs's upper layer (not used by PandaStack) that
// still logs it at info level would otherwise do.
var statsEdits = []edit{
	{
		"\t\"gvisor.dev/gvisor/pkg/gohacks\"\n)\n",
		"\t\"gvisor.dev/gvisor/pkg/gohacks\"\n\t\"gvisor.dev/gvisor/pkg/log\"\n)\n",
	},
	{
		"\t// last is the monotonic time of the last sample.\n\tlast int64\n}\n",
		"\t// last is the monotonic time of the last sample.\n\tlast int64\n\n" +
			"\t// on says whether the statistics are collected: only for a log at\n" +
			"\t// debug level (PandaStack's scripts/runsc-precompiled).\n\ton bool\n}\n",
	},
	{
		"func (s *Stats) init() {\n",
		"func (s *Stats) init() {\n\tif s.on = log.IsLogging(log.Debug); !s.on {\n\t\treturn\n\t}\n",
	},
	{
		"func (s *Stats) fini(resolve func(id typeID) string) {\n",
		"func (s *Stats) fini(resolve func(id typeID) string) {\n\tif !s.on {\n\t\treturn\n\t}\n",
	},
	{
		"func (s *Stats) start(id typeID) {\n",
		"func (s *Stats) start(id typeID) {\n\tif !s.on {\n\t\treturn\n\t}\n",
	},
	{
		"func (s *Stats) done() {\n",
		"func (s *Stats) done() {\n\tif !s.on {\n\t\treturn\n\t}\n",
	},
	{
		"\tfmt.Fprintf(&buf, \"% 16s | % 8d | % 16s | [all]\",\n\t\ttotal, count, total/time.Duration(count))\n",
		"\tvar per time.Duration\n\tif count > 0 {\n\t\tper = total / time.Duration(count)\n\t}\n" +
			"\tfmt.Fprintf(&buf, \"% 16s | % 8d | % 16s | [all]\",\n\t\ttotal, count, per)\n",
	},
}

// wireEdits have a Reader read single bytes through its source's ReadByte
// when it has one (wireByteSource).
var wireEdits = []edit{
	{
		"type Reader struct {\n\tio.Reader\n\n\tbuf [1]byte\n}\n",
		"type Reader struct {\n\tio.Reader\n\n\tbuf [1]byte\n\n\tpb pandastackBytes // PandaStack: see pandastack_bytes.go\n}\n",
	},
	{
		"func (r *Reader) readByte() byte {\n\tn, err := r.Read(r.buf[:])\n",
		"func (r *Reader) readByte() byte {\n\tif br := r.pb.of(r.Reader); br != nil {\n\t\treturn r.pb.read(br)\n\t}\n\tn, err := r.Read(r.buf[:])\n",
	},
}

const wireByteSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package wire

import "io"

// pandastackBytes is a Reader's view of its source as an io.ByteReader.
// The state's varints (type and object IDs, lengths, most numbers) are
// read a byte at a time, and each of those bytes went through the
// source's Read with a one-byte slice: for a state file, two Read methods
// (the statefile's reader, then its bufio.Reader) and a copy. In a CPU
// profile of fork children's restores those reads took about a tenth of
// the decode. A source with ReadByte (the statefile's reader has one,
// pkg/compressio/pandastack_bytes.go) is asked for the byte instead.
type pandastackBytes struct {
	checked bool
	br      io.ByteReader
}

// of returns r as an io.ByteReader, or nil when it is not one; it looks at
// r once.
func (p *pandastackBytes) of(r io.Reader) io.ByteReader {
	if !p.checked {
		p.br, _ = r.(io.ByteReader)
		p.checked = true
	}
	return p.br
}

// read reads one byte from br; like readByte, it panics on an error.
func (p *pandastackBytes) read(br io.ByteReader) byte {
	b, err := br.ReadByte()
	if err != nil {
		panic(err)
	}
	return b
}
`

const wireTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package wire

import (
	"bufio"
	"bytes"
	"io"
	"reflect"
	"testing"
)

// pandastackReadOnly hides a reader's other methods (ReadByte).
type pandastackReadOnly struct{ r io.Reader }

func (p pandastackReadOnly) Read(b []byte) (int, error) { return p.r.Read(b) }

// pandastackCounting counts the calls a Reader makes of each method.
type pandastackCounting struct {
	*bufio.Reader
	reads, byteReads int
}

func (c *pandastackCounting) Read(b []byte) (int, error) {
	c.reads++
	return c.Reader.Read(b)
}

func (c *pandastackCounting) ReadByte() (byte, error) {
	c.byteReads++
	return c.Reader.ReadByte()
}

// TestPandastackReadByte: objects saved are loaded the same through a
// source with ReadByte, which then reads the varints' bytes, and through
// one without it.
func TestPandastackReadByte(t *testing.T) {
	str := String("pandastack")
	objs := []Object{Uint(0), Uint(127), Uint(128), Uint(1 << 40), Uint(^uint64(0)), Int(-5), &str, Bool(true)}
	var buf bytes.Buffer
	w := &Writer{Writer: &buf}
	for _, o := range objs {
		Save(w, o)
	}
	load := func(src io.Reader) []Object {
		r := &Reader{Reader: src}
		var got []Object
		for range objs {
			got = append(got, Load(r))
		}
		return got
	}
	plain := load(pandastackReadOnly{bytes.NewReader(buf.Bytes())})
	counting := &pandastackCounting{Reader: bufio.NewReader(bytes.NewReader(buf.Bytes()))}
	fast := load(counting)
	if !reflect.DeepEqual(plain, objs) || !reflect.DeepEqual(fast, objs) {
		t.Fatalf("loaded %v through Read and %v through ReadByte, want %v", plain, fast, objs)
	}
	if counting.byteReads == 0 {
		t.Error("a source with ReadByte was not asked for bytes")
	}
}

// TestPandastackReadByteEOF: a varint cut short panics through ReadByte as
// through Read.
func TestPandastackReadByteEOF(t *testing.T) {
	for name, src := range map[string]io.Reader{
		"Read":     pandastackReadOnly{bytes.NewReader([]byte{0x80})},
		"ReadByte": bufio.NewReader(bytes.NewReader([]byte{0x80})),
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: a varint cut short did not panic", name)
				}
			}()
			LoadUint(&Reader{Reader: src})
		}()
	}
}
`

const compressioByteSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package compressio

import "io"

var _ io.ByteReader = (*SimpleReader)(nil)

// ReadByte implements io.ByteReader.ReadByte: the state's reader
// (pkg/state/wire) reads its varints a byte at a time, and without a key
// the byte comes straight from the buffer.
func (r *SimpleReader) ReadByte() (byte, error) {
	if r.h == nil {
		return r.bin.ReadByte()
	}
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return 0, err
	}
	return b[0], nil
}
`

const compressioTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package compressio

import (
	"bytes"
	"io"
	"testing"
)

// TestPandastackReadByte: a SimpleReader reads the same bytes through
// ReadByte and Read mixed, with and without a key (whose stream holds
// hashes between its chunks), and ends with io.EOF.
func TestPandastackReadByte(t *testing.T) {
	data := make([]byte, 10000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, key := range [][]byte{nil, []byte("pandastack")} {
		var buf bytes.Buffer
		w := NewSimpleWriter(&buf, key, 1024)
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		r := NewSimpleReader(io.NopCloser(&buf), key)
		var got []byte
		for len(got) < len(data) {
			if len(got)%3 == 0 {
				p := make([]byte, 37)
				n, err := r.Read(p)
				got = append(got, p[:n]...)
				if err != nil && err != io.EOF {
					t.Fatal(err)
				}
				continue
			}
			b, err := r.ReadByte()
			if err != nil {
				t.Fatalf("key %q: ReadByte at %d: %v", key, len(got), err)
			}
			got = append(got, b)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("key %q: read back differs", key)
		}
		if _, err := r.ReadByte(); err != io.EOF {
			t.Errorf("key %q: ReadByte at the end: %v, want io.EOF", key, err)
		}
	}
}
`

const statsTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package state

import (
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/log"
)

// TestPandastackStats: a Stats collects nothing unless the log is at debug
// level, and its table is then printed without a division by zero; at
// debug level it collects as before.
func TestPandastackStats(t *testing.T) {
	old := log.Log().Level
	defer log.SetLevel(old)
	run := func() *Stats {
		var s Stats
		s.init()
		s.start(1)
		s.start(2)
		s.done()
		s.done()
		s.fini(func(id typeID) string { return map[typeID]string{1: "pandastack.outer", 2: "pandastack.inner"}[id] })
		return &s
	}

	log.SetLevel(log.Info)
	s := run()
	if len(s.byType) != 0 || len(s.stack) != 0 {
		t.Errorf("at info level: %d types, a stack of %d; want none", len(s.byType), len(s.stack))
	}
	if out := s.String(); strings.Contains(out, "pandastack.") {
		t.Errorf("at info level the table lists types:\n%s", out)
	}

	log.SetLevel(log.Debug)
	s = run()
	if len(s.byType) != 3 || s.byType[1].count != 1 || s.byType[2].count != 1 {
		t.Fatalf("at debug level: %+v, want one sample each of types 1 and 2", s.byType)
	}
	if out := s.String(); !strings.Contains(out, "pandastack.outer") || !strings.Contains(out, "pandastack.inner") {
		t.Errorf("at debug level the table lacks the types:\n%s", out)
	}
}
`
