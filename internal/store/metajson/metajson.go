// Package metajson is how the stores keep a record's metadata: one JSON
// object of strings. The Store implementations import it, so that SQLite
// and PostgreSQL store, refuse and return metadata alike.
package metajson

import (
	"encoding/json"

	"github.com/pandastack/pandastack"
)

// Encode returns md as a JSON object; nil is stored as {}. A key or value
// that fails pandastack.StorableText is EInvalid.
func Encode(md map[string]string) (string, error) {
	if md == nil {
		md = map[string]string{}
	}
	for k, v := range md {
		if !pandastack.StorableText(k, v) {
			return "", pandastack.ErrUnstorableText("metadata entry", k)
		}
	}
	b, err := json.Marshal(md)
	return string(b), err
}

// Decode parses a stored JSON object, never returning a nil map.
func Decode(b []byte) (map[string]string, error) {
	var md map[string]string
	if err := json.Unmarshal(b, &md); err != nil {
		return nil, err
	}
	if md == nil {
		md = map[string]string{}
	}
	return md, nil
}
