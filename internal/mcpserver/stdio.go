package mcpserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

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
// the id to answer with, for a line that is not a JSON-RPC 2.0 message or
// batch of them.
func checkMessage(line []byte) (id json.RawMessage, code int, msg string) {
	if !json.Valid(line) {
		return nil, -32700, "Parse error: the line is not one JSON value (one message per line)"
	}
	line = bytes.TrimSpace(line)
	switch line[0] {
	case '{':
		return checkObject(line)
	case '[':
		var batch []json.RawMessage
		json.Unmarshal(line, &batch)
		if len(batch) == 0 {
			return nil, -32600, "Invalid Request: an empty batch"
		}
		for _, m := range batch {
			if m = bytes.TrimSpace(m); len(m) == 0 || m[0] != '{' {
				return nil, -32600, "Invalid Request: a batch holds JSON-RPC messages (objects) only"
			}
			if _, code, msg := checkObject(m); code != 0 {
				return nil, code, msg
			}
		}
		return nil, 0, ""
	}
	return nil, -32600, "Invalid Request: a JSON-RPC message is a JSON object"
}

func checkObject(b []byte) (json.RawMessage, int, string) {
	var m struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  *string         `json:"method"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &m) != nil {
		return nil, -32600, "Invalid Request: malformed JSON-RPC fields (jsonrpc, id, method)"
	}
	id := m.ID
	if len(id) > 0 && id[0] != '"' && id[0] != '-' && (id[0] < '0' || id[0] > '9') && string(id) != "null" {
		return nil, -32600, "Invalid Request: id must be a string or a number"
	}
	switch {
	case m.JSONRPC != "2.0":
		return id, -32600, `Invalid Request: "jsonrpc" must be "2.0"`
	case m.Method == nil && (len(id) == 0 || m.Result == nil && m.Error == nil):
		return id, -32600, "Invalid Request: neither a request (method) nor a response (id with result or error)"
	}
	return nil, 0, ""
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
