package api

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/pandastack/pandastack"
)

// FuzzDecodeBody: whatever a client sends as a JSON body, decode either
// fills the request type or refuses with invalid_request (or
// payload_too_large), never anything a client would see as a server fault;
// and what it accepts is empty or one JSON object.
func FuzzDecodeBody(f *testing.F) {
	for _, s := range []string{"", "{}", "null", "[]", `"x"`, "1", `{"template":"base","ttl_seconds":60}`, `{"ttl_seconds":"ten"}`, `{"ttl":1}`, `{"cmd":"x"} {}`, `{"env":{"A":"b"}}`, `{"code":null}`, " \n{}", "{\"a\":1e999}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, v := range []any{&createSandboxRequest{}, &execRequest{}, &runRequest{}, &createContextRequest{}} {
			err := decode(httptest.NewRequest("POST", "/", bytes.NewReader(body)), v)
			if err != nil {
				if c := pandastack.ErrorCode(err); c != pandastack.EInvalid && c != pandastack.ETooLarge {
					t.Fatalf("decode(%q) = %v: code %s", body, err, c)
				}
				continue
			}
			if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] != '{' {
				t.Fatalf("decode accepted %q, which is not a JSON object", body)
			}
		}
	})
}
