package jupyter

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// protocolVersion is the Jupyter messaging protocol version we speak.
const protocolVersion = "5.3"

// delimiter separates the ZeroMQ routing identities from a message's parts.
const delimiter = "<IDS|MSG>"

var errBadSignature = errors.New("bad message signature")

// header is a Jupyter message header.
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is a decoded Jupyter message. Content stays raw so each handler
// decodes only the shape it expects.
type message struct {
	Header  header
	Parent  header
	Content json.RawMessage
}

// signer signs and verifies messages with the connection file's key.
type signer struct {
	key     []byte
	session string
}

// sign returns the hex HMAC-SHA256 of the four signed parts.
func (s *signer) sign(parts ...[]byte) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	sum := m.Sum(nil)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum)
	return out
}

// encode builds the frames of a new message of msgType and returns them with
// the new message's id. The frames carry no routing identity: a DEALER
// talking to the kernel's ROUTER needs none.
func (s *signer) encode(msgType string, content any) ([][]byte, string, error) {
	id := newUUID()
	h, err := json.Marshal(header{
		MsgID:    id,
		Session:  s.session,
		Username: "pandastack",
		Date:     time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
		MsgType:  msgType,
		Version:  protocolVersion,
	})
	if err != nil {
		return nil, "", err
	}
	c, err := json.Marshal(content)
	if err != nil {
		return nil, "", fmt.Errorf("encode %s: %w", msgType, err)
	}
	parent, meta := []byte("{}"), []byte("{}")
	return [][]byte{
		[]byte(delimiter),
		s.sign(h, parent, meta, c),
		h, parent, meta, c,
	}, id, nil
}

// decode parses and verifies a received multipart message: routing
// identities or a topic, the delimiter, the signature, header, parent
// header, metadata, content and optional buffers (ignored).
func (s *signer) decode(frames [][]byte) (*message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], []byte(delimiter)) {
		i++
	}
	if len(frames)-i < 6 {
		return nil, fmt.Errorf("malformed message: %d frames", len(frames))
	}
	sig, h, parent, meta, content := frames[i+1], frames[i+2], frames[i+3], frames[i+4], frames[i+5]
	if !hmac.Equal(sig, s.sign(h, parent, meta, content)) {
		return nil, errBadSignature
	}
	m := &message{Content: content}
	if err := json.Unmarshal(h, &m.Header); err != nil {
		return nil, fmt.Errorf("malformed header: %w", err)
	}
	// An empty parent header is "{}", which leaves Parent zero.
	if err := json.Unmarshal(parent, &m.Parent); err != nil {
		return nil, fmt.Errorf("malformed parent header: %w", err)
	}
	return m, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// newKey returns a random HMAC key as the connection file carries it.
func newKey() []byte {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	out := make([]byte, hex.EncodedLen(len(b)))
	hex.Encode(out, b[:])
	return out
}
