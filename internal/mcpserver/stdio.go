package mcpserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxMessage is the largest JSON-RPC message StdioTransport takes in: a
// line longer than that is answered with an error and skipped.
const MaxMessage = 32 << 20

// StdioTransport is the MCP transport over in and out (stdin and stdout),
// one JSON-RPC message per line. The SDK's own transport ends the session
// on the first line that is not a JSON-RPC message, and with it the
// session's sandbox; this one answers such a line with a JSON-RPC error
// (parse error or invalid request, with the line's id if it has one) and
// reads on, as it does a line over MaxMessage bytes.
func StdioTransport(in io.Reader, out io.Writer) mcp.Transport {
	w := &lockedWriter{w: out}
	return &mcp.IOTransport{Reader: filterMessages(in, w, MaxMessage), Writer: w, MaxLineLength: -1}
}

// lockedWriter writes whole messages one at a time: the SDK's (one Write
// per message) and the errors filterMessages sends.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) Close() error { return nil }

// filterMessages passes the lines of in that are JSON-RPC messages on to
// the returned reader and answers the others on out.
func filterMessages(in io.Reader, out io.Writer, max int) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		br := bufio.NewReaderSize(in, 64<<10)
		for {
			line, tooLong, err := readLine(br, max)
			if tooLong {
				reply(out, nil, -32600, fmt.Sprintf("Invalid Request: a message over %d bytes (files that large go through exec or the REST API)", max))
			} else if len(bytes.TrimSpace(line)) > 0 {
				if id, code, msg := checkMessage(line); code != 0 {
					reply(out, id, code, msg)
				} else if _, werr := pw.Write(append(line, '\n')); werr != nil {
					return // the session ended
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				pw.CloseWithError(err)
				return
			}
		}
	}()
	return pr
}

// readLine reads one line without its newline. A line over max bytes is
// read to its end and dropped (tooLong).
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > max+1 { // +1: the newline
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), tooLong, err
	}
}

// checkMessage returns a JSON-RPC error code (0: none), its message, and
// the id to answer with, for a line the SDK would not take as one JSON-RPC
// 2.0 message: the SDK's own decoder decides, so that what passes here
// cannot end the session there. Batches are refused: MCP dropped them
// (2025-06-18), and the SDK ends a session that sends one after that.
func checkMessage(line []byte) (id json.RawMessage, code int, msg string) {
	if !json.Valid(line) {
		return nil, jsonrpc.CodeParseError, "Parse error: the line is not one JSON value (one message per line)"
	}
	line = bytes.TrimSpace(line)
	switch line[0] {
	case '{':
	case '[':
		return nil, jsonrpc.CodeInvalidRequest, "Invalid Request: batches are not supported; send one message per line"
	default:
		return nil, jsonrpc.CodeInvalidRequest, "Invalid Request: a JSON-RPC message is a JSON object"
	}
	m, err := jsonrpc.DecodeMessage(line)
	if err != nil {
		// The decoder's own words name Go types; say it in the protocol's.
		why := `"jsonrpc" must be "2.0", "id" a string or a number, "method" a string`
		if strings.Contains(err.Error(), "version tag") {
			why = `"jsonrpc" must be "2.0"`
		}
		return replyID(line), jsonrpc.CodeInvalidRequest, "Invalid Request: " + why
	}
	if r, ok := m.(*jsonrpc.Response); ok && r.Result == nil && r.Error == nil {
		return replyID(line), jsonrpc.CodeInvalidRequest, "Invalid Request: neither a request (method) nor a response (result or error)"
	}
	return nil, 0, ""
}

// replyID is the id of a refused message to answer with: its own when it
// is a string or a whole number, else none (null).
func replyID(line []byte) json.RawMessage {
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(line, &m) != nil || len(m.ID) == 0 {
		return nil
	}
	var s string
	var n int64
	if json.Unmarshal(m.ID, &s) == nil || json.Unmarshal(m.ID, &n) == nil {
		return m.ID
	}
	return nil
}

// reply writes a JSON-RPC error response on out.
func reply(out io.Writer, id json.RawMessage, code int, msg string) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, msg}})
	out.Write(append(b, '\n'))
}
