package api

import (
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// appendExecEvent appends ev as the NDJSON line encoding/json would write
// for toStreamEvent(ev) (HTML escaping off). Output events take the fast
// path: their data is escaped here in runs, without reflection or a copy
// to a string first, which for a command that floods its stdout is most
// of the server's work per byte. ok is false for the events it leaves to
// encoding/json (exit, error).
func appendExecEvent(dst []byte, ev agentproto.ExecEvent) (_ []byte, ok bool) {
	if ev.Type != "stdout" && ev.Type != "stderr" {
		return dst, false
	}
	dst = append(dst, `{"type":"`...)
	dst = append(dst, ev.Type...)
	if len(ev.Data) > 0 { // omitempty
		dst = append(dst, `","data":"`...)
		dst = appendJSONString(dst, ev.Data)
	}
	return append(dst, "\"}\n"...), true
}

// jsonSafe marks the ASCII bytes a JSON string holds as they are.
var jsonSafe = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()

// appendJSONString appends the inside of a JSON string holding s, escaped
// as encoding/json escapes it without HTML escaping: the short escapes,
// other control bytes as \u00XX, invalid UTF-8 as \ufffd, and U+2028 and
// U+2029 as \u2028 and \u2029.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if jsonSafe[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(dst, s[start:]...)
}
